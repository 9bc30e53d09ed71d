"""The settings dialog: model, device, screenshot pixel cap, hotkeys, safety mode.

Hotkeys are recorded by pressing them (`HotkeyEdit`) and shown as "Ctrl+Alt+Q". Values are checked before
anything is written (`Settings.validated` plus the hotkey check); a bad value is refused with one sentence
in the dialog, which stays open. Saving goes through `config.save`, which writes atomically. Only the
fields shown here change: whatever else the file holds is kept, and values that came from flags or the
environment for this run are not written into it. The dialog stays on top, like the ask windows it may be
opened from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

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
FIELD_MIN_WIDTH = 380  # a Hugging Face id or a home-folder path fits without scrolling
FIELD_MAX_WIDTH = 900  # longer paths scroll in the field rather than stretch the dialog across the screen


class SettingsDialog(QDialog):
    """Edit and save the settings file. `saved` carries the running settings with the edits applied."""

    saved = Signal(object)

    def __init__(self, current: Settings, path: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("qvl-agent settings")
        # Above the ask windows, which stay on top: opened from one, it must not hide behind it.
        self.setWindowFlag(Qt.WindowType.WindowStaysOnTopHint, True)
        self.current, self.path = current, path
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
        form.addRow("Model (id or folder)", self.model)
        form.addRow("Device", self.device)
        form.addRow("Max screenshot pixels", self.max_pixels)
        form.addRow("Ask hotkey", self.hotkey_ask)
        form.addRow("Region hotkey", self.hotkey_region)
        form.addRow("Stop hotkey", self.hotkey_stop)
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
            )
        )
        return {
            "model": self.model.text().strip(),
            "device": self.device.currentText().strip(),
            "max_pixels": max_pixels,
            "hotkeys": hotkeys,
            "safety_mode": self.safety_mode.currentText(),
        }

    @Slot()
    def save(self) -> None:
        try:
            edits = self.edits()
            running = dataclasses.replace(self.current, **edits).validated()
            # Keep the file's other values; flags and environment of this run stay out of it.
            on_file = config.load(self.path, env={}).settings if self.path.exists() else Settings()
            config.save(dataclasses.replace(on_file, **edits), self.path)
        except ConfigError as exc:
            self.error.setText(str(exc))
            return
        except OSError as exc:
            self.error.setText(f"The settings could not be saved to {self.path}: {exc.strerror or exc}.")
            return
        self.error.setText("")
        self.saved.emit(running)
        self.accept()
