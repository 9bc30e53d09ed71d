"""The desktop UI: tray icon, global hotkeys, ask window, region overlay, click marker, settings.

PySide6 and pynput are imported only inside this package (pynput lazily: it needs a display at import).
Nothing here runs engine work on the GUI thread; `engine_worker.EngineHost` owns the engine thread.
"""
