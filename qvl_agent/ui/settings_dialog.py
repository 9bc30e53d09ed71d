"""The settings dialog: engine, model, device, screenshot pixel cap, hotkeys, safety mode.

Hotkeys are recorded by pressing them (`HotkeyEdit`) and shown as "Ctrl+Alt+Q". Values are checked before
anything is written (`Settings.validated` plus the hotkey and engine checks); a bad value is refused with
one sentence in the dialog, which stays open. Saving writes only the values the person changed in the
dialog into config.toml, atomically, and nothing when nothing changed (the tray's notice then says so):
every other key of the file (settings left alone, keys this version does not know) stays as it was, and
values that came from flags or the environment for this run are not written unless the person changed
them here. A file that cannot be read as TOML is never overwritten. (The file is rewritten as TOML, so
comments in it are not kept.) The dialog stays on top, like the ask windows it may be opened from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tomli_w
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from qvl_agent import config
from qvl_agent.config import SAFETY_MODES, Hotkeys, Settings
from qvl_agent.errors import ConfigError
from qvl_agent.ui.hotkey_edit import HotkeyEdit
from qvl_agent.ui.hotkeys import check_hotkeys

DEVICES = ("auto", "cpu", "cuda", "cuda:0", "cuda:1")
ENGINES = ("local", "openai:http://127.0.0.1:8000/v1")
ENGINE_KINDS = ("local", "openai:", "replay:")


def check_engine(spec: str) -> str:
    """The engine setting as typed, or ConfigError in one sentence."""
    if spec == "local" or (spec.startswith(ENGINE_KINDS[1:]) and spec.split(":", 1)[1].strip()):
        return spec
    raise ConfigError(f"Engine must be local, openai:URL (a model server) or replay:FILE, not {spec!r}.")


def write_changes(path: Path, changes: dict) -> None:
    """Write `changes` (the file's keys -> value; hotkeys as a dict of the changed ones) into the TOML file
    at `path`, atomically, leaving every other key as it is. ConfigError when the file cannot be read
    (it is then left untouched) or written."""
    data, problems = config._read(path)
    if problems:
        raise ConfigError(problems[0].replace("defaults are used until it is fixed or removed", "nothing was written"))
    for name, value in changes.items():
        if name == "hotkeys":
            table = data.get("hotkeys") if isinstance(data.get("hotkeys"), dict) else {}
            data["hotkeys"] = {**table, **value}
        elif name == config.TAKEOVER_HOTKEY:
            data[name] = value
            table = data.get("hotkeys")
            if isinstance(table, dict) and "takeover" in table:  # an earlier build's spelling: one name only
                data["hotkeys"] = {k: v for k, v in table.items() if k != "takeover"}
        else:
            data[name] = value
    config.write_settings_text(path, tomli_w.dumps(data))  # atomic and owner-only, as every settings save


FIELD_MIN_WIDTH = 380  # a Hugging Face id or a home-folder path fits without scrolling
FIELD_MAX_WIDTH = 900  # longer paths scroll in the field rather than stretch the dialog across the screen


class SettingsDialog(QDialog):
    """Edit and save the settings file. `saved` carries the running settings with the edits applied;
    `outcome` then says what Save did to the file."""

    saved = Signal(object)

    def __init__(self, current: Settings, path: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("qvl-agent settings")
        # Above the ask windows, which stay on top: opened from one, it must not hide behind it.
        self.setWindowFlag(Qt.WindowType.WindowStaysOnTopHint, True)
        self.current, self.path = current, path
        self.outcome = ""
        self.engine = QComboBox()
        self.engine.setEditable(True)
        self.engine.addItems(ENGINES)
        self.engine.setCurrentText(current.engine)
        self.engine.setToolTip(
            "local: the model runs in this app (Model and Device below); openai:URL: a model server such as "
            "`qvl-agent serve`, vLLM or SGLang; replay:FILE: recorded replies, for trying things out"
        )
        self.model = QLineEdit(current.model)
        self.model.setPlaceholderText("Qwen/Qwen3-VL-2B-Instruct or a local folder")
        self.device = QComboBox()
        self.device.setEditable(True)
        self.device.addItems(DEVICES)
        self.device.setCurrentText(current.device)
        self.max_pixels = QLineEdit(str(current.max_pixels))
        self.max_pixels.setToolTip(
            "Screenshots above this many pixels are scaled down before the model sees them: "
            "faster on 4K screens, at the cost of small text."
        )
        self.hotkey_ask = HotkeyEdit(current.hotkeys.ask)
        self.hotkey_region = HotkeyEdit(current.hotkeys.region)
        self.hotkey_stop = HotkeyEdit(current.hotkeys.stop)
        self.hotkey_takeover = HotkeyEdit(current.hotkeys.takeover)
        self.hotkey_takeover.setToolTip(
            "takeover_hotkey: pauses a running task for you to act; pressed again, hands it back."
        )
        self.safety_mode = QComboBox()
        self.safety_mode.addItems(SAFETY_MODES)
        self.safety_mode.setCurrentText(current.safety_mode)
        self.error = QLabel("")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #b00020")

        room = self.model.fontMetrics().horizontalAdvance(current.model) + 24  # the whole id or path, up to a cap
        self.model.setMinimumWidth(min(max(FIELD_MIN_WIDTH, room), FIELD_MAX_WIDTH))
        self.model.setCursorPosition(0)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("Engine", self.engine)
        form.addRow("Model (id or folder)", self.model)
        form.addRow("Device", self.device)
        form.addRow("Max screenshot pixels", self.max_pixels)
        form.addRow("Ask hotkey", self.hotkey_ask)
        form.addRow("Region hotkey", self.hotkey_region)
        form.addRow("Stop hotkey", self.hotkey_stop)
        form.addRow("Take-over hotkey", self.hotkey_takeover)
        form.addRow("Safety mode", self.safety_mode)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Save).setDefault(True)  # Enter saves
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(self.buttons)

    def edits(self) -> dict:
        """The dialog's values as Settings fields, or ConfigError naming the first bad one."""
        text = self.max_pixels.text().strip().replace("_", "").replace(",", "")
        try:
            max_pixels = int(text)
        except ValueError:
            raise ConfigError(f"Max screenshot pixels must be a whole number, not {text!r}.") from None
        hotkeys = check_hotkeys(
            Hotkeys(
                ask=self.hotkey_ask.hotkey(),
                region=self.hotkey_region.hotkey(),
                stop=self.hotkey_stop.hotkey(),
                takeover=self.hotkey_takeover.hotkey(),
            )
        )
        return {
            "engine": check_engine(self.engine.currentText().strip()),
            "model": self.model.text().strip(),
            "device": self.device.currentText().strip(),
            "max_pixels": max_pixels,
            "hotkeys": hotkeys,
            "safety_mode": self.safety_mode.currentText(),
        }

    def changes(self, edits: dict) -> dict:
        """What the person changed in the dialog, in the file's shape: only those keys are written."""
        changed = {k: v for k, v in edits.items() if k != "hotkeys" and v != getattr(self.current, k)}
        old, new = dataclasses.asdict(self.current.hotkeys), dataclasses.asdict(edits["hotkeys"])
        hotkeys = {k: v for k, v in new.items() if v != old[k]}
        if "takeover" in hotkeys:  # a top-level key in the file
            changed[config.TAKEOVER_HOTKEY] = hotkeys.pop("takeover")
        return {**changed, "hotkeys": hotkeys} if hotkeys else changed

    @Slot()
    def save(self) -> None:
        try:
            edits = self.edits()
            running = dataclasses.replace(self.current, **edits).validated()
            changes = self.changes(edits)
            if changes:
                write_changes(self.path, changes)
        except ConfigError as exc:
            self.error.setText(str(exc))
            return
        self.error.setText("")
        self.outcome = saved_sentence(self.path, changes)
        self.saved.emit(running)
        self.accept()


def saved_sentence(path: Path, changes: dict) -> str:
    """What Save did on disk, in one sentence: nothing is claimed saved that was not written."""
    if not changes:
        return f"Nothing changed, so {path} was not written."
    return f"Settings saved to {path}."
