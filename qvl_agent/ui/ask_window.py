"""The ask window: a screenshot's thumbnail, a question box, and the answer streamed as Markdown.

Follow-ups reuse the same engine session, so the screenshot is encoded once; the status line says
whether the vision features were cached and how long the first token took (figures only where they mean
something: not for an answer that arrived in one burst). The window never waits on the engine:
questions are queued on the engine thread (`EngineHost`) and pieces arrive as signals.

Buttons (each with an Alt+letter mnemonic): Copy (the last answer), Where is…? (the text in the box is
looked up with `grounding.locate`, a marker ring shows the point on the screen and the window steps
aside when it covers it), Do it (hands the
request to the automation loop), Playwright script (shown when a browser is on screen), Stop (cancels
the running answer). Esc closes the window.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QGuiApplication, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from qvl_agent.engine.base import GenerationOptions, TurnStats
from qvl_agent.grounding import GroundedPoint, Zoom, locate
from qvl_agent.image import Screenshot
from qvl_agent.ui.engine_worker import Conversation, EngineHost
from qvl_agent.ui.overlay import ClickMarker
from qvl_agent.ui.screen import to_logical, to_qimage

TITLE = "qvl-agent: ask about the {subject}"
THUMB_WIDTH = 360
MIN_RATE_TOKENS = 8  # a decode rate over fewer tokens is noise
MIN_DECODE_MS = 20.0  # ... and so is one over a reply that arrived in one burst (a replay, a cache)
LOCATE_MARKER_MS = 10_000  # how long the "Where is…?" ring stays (a new question or closing hides it sooner)


def describe_stats(stats: TurnStats | None, turn: int) -> str:
    """The status line after an answer: vision features cached or not, the time to first token and the
    decode rate, each only when measured (a replayed answer has neither)."""
    if stats is None:
        return "Answered."
    if stats.vision == "hit":
        vision = "vision features cached"
    elif stats.vision == "miss":
        vision = "vision features computed (not cached)"
    elif turn > 1:
        vision = "vision features reused from the first question"
    else:
        vision = "no image"
    parts = [vision]
    if stats.ttft_ms >= 1:
        parts.append(f"first token {stats.ttft_ms:.0f} ms")
    if stats.cached_tokens:
        parts.append(f"{stats.cached_tokens} of {stats.prompt_tokens} context tokens reused")
    decode_ms = stats.total_ms - stats.ttft_ms
    if stats.decode_tokens_per_s and stats.decode_tokens >= MIN_RATE_TOKENS and decode_ms >= MIN_DECODE_MS:
        parts.append(f"{stats.decode_tokens_per_s:.0f} tokens/s")
    return " · ".join(parts)


class AskWindow(QWidget):
    """One conversation about one screenshot (the whole monitor, or a region of it)."""

    do_it_requested = Signal(str, object)  # the request, the Screenshot it is about
    playwright_requested = Signal(str, object)
    closed = Signal()

    def __init__(
        self,
        host: EngineHost,
        shot: Screenshot,
        *,
        browser_on_screen: bool = False,
        options: GenerationOptions | None = None,
        region: bool = False,
        zoom: Zoom | None = None,
    ) -> None:
        super().__init__(None, Qt.WindowType.Window | Qt.WindowType.WindowStaysOnTopHint)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.host = host
        self.options = options
        self.zoom = zoom  # the zoom setting's second grounding pass, for "Where is…?"
        self.marker = ClickMarker()
        self._marker_timer = QTimer(self, singleShot=True, interval=LOCATE_MARKER_MS, timeout=self.marker.hide)
        self._render_pending = False
        self._build()
        self.conversation: Conversation | None = None
        self.show_screenshot(shot, browser_on_screen=browser_on_screen, region=region)
        host.piece.connect(self._on_piece)
        host.answered.connect(self._on_answered)
        host.errored.connect(self._on_error)
        host.cancelled.connect(self._on_cancelled)
        host.called.connect(self._on_located)
        host.call_failed.connect(self._on_locate_failed)

    def show_screenshot(self, shot: Screenshot, *, browser_on_screen: bool = False, region: bool = False) -> None:
        """Start over about a new screenshot (the tray reuses one window per screen): the old conversation
        is stopped and its session freed on the engine thread."""
        self._drop_conversation()
        self.shot = shot
        self.subject = "region" if region else "screen"
        self.setWindowTitle(TITLE.format(subject=self.subject))
        self.conversation = Conversation(images=(shot,))
        self._request: int | None = None
        self._locating: tuple[int, str] | None = None  # (request, description) of a running "Where is…?"
        self._answer = ""
        self._question = ""
        self._history: list[tuple[str, str]] = []  # finished (question, answer) pairs
        self.last_answer = ""
        self.last_question = ""
        self.browser_on_screen = browser_on_screen
        self._marker_timer.stop()
        self.marker.hide()
        self.thumbnail.setPixmap(
            QPixmap.fromImage(to_qimage(shot)).scaledToWidth(THUMB_WIDTH, Qt.TransformationMode.SmoothTransformation)
        )
        self.thumbnail.setToolTip(f"{shot.width}×{shot.height} at ({shot.left}, {shot.top})")
        self.question.setPlaceholderText(f"Ask about the {self.subject} and press Enter")
        self.playwright_button.setVisible(browser_on_screen)
        if self.host.state == "loading":
            self.status.setText("The model is still loading; a question asked now is answered once it is ready.")
        else:
            self.status.setText(f"Ask a question about this {self.subject}.")
        self.answer_view.clear()
        self._update_buttons()

    def _drop_conversation(self) -> None:
        conversation, self.conversation = self.conversation, None
        if conversation is not None:
            conversation.cancel()
            # Free the KV cache on the engine thread, behind whatever turn is still finishing there.
            self.host.call(lambda _engine: conversation.close())

    # --- layout -------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.thumbnail = QLabel()
        self.answer_view = QTextBrowser()
        self.answer_view.setOpenExternalLinks(True)
        self.answer_view.setPlaceholderText("The answer appears here.")
        self.question = QLineEdit()
        self.question.returnPressed.connect(self.submit)
        self.question.textChanged.connect(self._update_buttons)
        self.status = QLabel()
        self.status.setWordWrap(True)

        self.copy_button = QPushButton("&Copy")
        self.locate_button = QPushButton("&Where is…?")
        self.do_it_button = QPushButton("&Do it")
        self.playwright_button = QPushButton("&Playwright script")
        self.stop_button = QPushButton("&Stop")
        self.copy_button.setToolTip("Copy the last answer")
        self.locate_button.setToolTip("Find what the box describes (e.g. “the Save button”) and mark it on the screen")
        self.do_it_button.setToolTip("Let the agent carry out the request on this screen")
        self.playwright_button.setToolTip("Write a Playwright script for the request in the browser on screen")
        self.copy_button.clicked.connect(self.copy_answer)
        self.locate_button.clicked.connect(self.locate)
        self.do_it_button.clicked.connect(self._do_it)
        self.playwright_button.clicked.connect(self._playwright)
        self.stop_button.clicked.connect(self.stop)

        buttons = QHBoxLayout()
        for button in (self.copy_button, self.locate_button, self.do_it_button, self.playwright_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)

        layout = QVBoxLayout(self)
        layout.addWidget(self.thumbnail, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addWidget(self.answer_view, 1)
        layout.addWidget(self.question)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.resize(560, 640)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.close)
        self.question.setFocus()

    def _update_buttons(self) -> None:
        busy = self.busy
        self.stop_button.setEnabled(self._request is not None)
        self.copy_button.setEnabled(bool(self.last_answer))
        self.locate_button.setEnabled(not busy and bool(self.question.text().strip()))
        has_request = bool(self.question.text().strip() or self.last_question)
        self.do_it_button.setEnabled(not busy and has_request)
        self.playwright_button.setEnabled(not busy and has_request)

    # --- asking ---------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._request is not None or self._locating is not None

    @Slot()
    def submit(self) -> None:
        """Ask the question in the box (a follow-up after the first one)."""
        text = self.question.text().strip()
        if not text or self.busy:
            return
        if self.host.state == "failed":
            self.status.setText(f"The model is not available: {self.host.message}")
            return
        self._question, self._answer = text, ""
        self.question.clear()
        self.marker.hide()
        self._request = self.host.ask(self.conversation, text, self.options)  # queued behind a loading model
        self.status.setText("Answering…" if self.host.is_ready else "Waiting for the model to finish loading…")
        self._render()
        self._update_buttons()

    @Slot()
    def stop(self) -> None:
        """Cancel the running answer; what arrived so far stays on screen."""
        if self.busy and self.conversation is not None:
            self.conversation.cancel()
            self.status.setText("Stopping…")

    @Slot(int, str)
    def _on_piece(self, request: int, piece: str) -> None:
        if request != self._request:
            return
        self._answer += piece
        if not self._render_pending:  # coalesce bursts of pieces into one re-render per event loop turn
            self._render_pending = True
            QTimer.singleShot(0, self._render)

    @Slot(int, str, object)
    def _on_answered(self, request: int, text: str, stats: TurnStats | None) -> None:
        if request != self._request:
            return
        self._finish(text)
        self.status.setText(describe_stats(stats, len(self._history)))

    @Slot(int, str)
    def _on_error(self, request: int, message: str) -> None:
        if request != self._request:
            return
        self._finish(self._answer)
        self.status.setText(message)

    @Slot(int, str)
    def _on_cancelled(self, request: int, partial: str) -> None:
        if request != self._request:
            return
        self._finish(partial)
        self.status.setText("Stopped.")

    def _finish(self, text: str) -> None:
        self._answer = text
        self._history.append((self._question, text))
        self.last_question, self.last_answer = self._question, text
        self._request = None
        self._render()
        self._update_buttons()

    def _render(self) -> None:
        self._render_pending = False
        parts = [f"**You:** {q}\n\n{a}" for q, a in self._history]
        if self.busy:
            parts.append(f"**You:** {self._question}\n\n{self._answer}")
        self.answer_view.setMarkdown("\n\n---\n\n".join(parts))
        bar = self.answer_view.verticalScrollBar()
        bar.setValue(bar.maximum())

    # --- where is…? ---------------------------------------------------------------------------------

    @Slot()
    def locate(self) -> None:
        """Find what the box describes on this screenshot; the answer is a marker ring on the screen."""
        description = self.question.text().strip()
        if not description or self.busy:
            return
        if not self.host.is_ready:
            self.status.setText(f"The model is not ready yet ({self.host.message}).")
            return
        shot, zoom = self.shot, self.zoom
        self.marker.hide()
        self._locating = (self.host.call(lambda engine: locate(engine, shot, description, zoom=zoom)), description)
        self.status.setText(f"Looking for {description}…")
        self._update_buttons()

    @Slot(int, object)
    def _on_located(self, request: int, point: GroundedPoint) -> None:
        if self._locating is None or request != self._locating[0]:
            return
        description = self._locating[1]
        self._locating = None
        self.question.clear()
        self._step_aside(point.x, point.y)
        self.marker.show_at(point.x, point.y, description)
        self._marker_timer.start()
        self.status.setText(f"“{description}” is marked on the screen, at ({point.x}, {point.y}).")
        self._update_buttons()

    def _step_aside(self, x: int, y: int) -> None:
        """Move this window off the found point (physical pixels), so the person sees the target, not us."""
        screen = QGuiApplication.screenAt(QPoint(x, y)) or QGuiApplication.primaryScreen()
        point, frame = to_logical(screen, x, y), self.frameGeometry()
        margin = self.marker.SIZE
        if not frame.adjusted(-margin, -margin, margin, margin).contains(point):
            return
        area = screen.availableGeometry()
        left = area.right() + 1 - frame.width() if point.x() < area.center().x() else area.left()
        self.move(left, frame.top())

    @Slot(int, str)
    def _on_locate_failed(self, request: int, message: str) -> None:
        if self._locating is None or request != self._locating[0]:
            return
        self._locating = None
        self.status.setText(message)
        self._update_buttons()

    # --- buttons --------------------------------------------------------------------------------------

    def request_text(self) -> str:
        """What Do it / Playwright act on: the text in the box, else the last question asked."""
        return self.question.text().strip() or self.last_question

    @Slot()
    def copy_answer(self) -> None:
        QGuiApplication.clipboard().setText(self.last_answer)
        self.status.setText("Answer copied.")

    @Slot()
    def _do_it(self) -> None:
        request = self.request_text()
        if request:
            self.do_it_requested.emit(request, self.shot)

    @Slot()
    def _playwright(self) -> None:
        request = self.request_text()
        if request:
            self.playwright_requested.emit(request, self.shot)

    # --- window events --------------------------------------------------------------------------------

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        self._marker_timer.stop()
        self.marker.close()
        for signal, slot in (
            (self.host.piece, self._on_piece),
            (self.host.answered, self._on_answered),
            (self.host.errored, self._on_error),
            (self.host.cancelled, self._on_cancelled),
            (self.host.called, self._on_located),
            (self.host.call_failed, self._on_locate_failed),
        ):
            signal.disconnect(slot)
        self._drop_conversation()
        self.closed.emit()
        super().closeEvent(event)
