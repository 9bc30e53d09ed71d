"""The exception tree. Every message is one sentence a person can act on.

QvlError                      base: the CLI prints str(exc) and exits with exc.exit_code
├── UsageError                bad flags or arguments                               (exit 2)
├── InputError                bad user input                                       (exit 2)
│   └── ImageError            missing/empty/corrupt/huge image
├── ConfigError               a settings value that cannot be used                 (exit 2)
├── CaptureError              no display, Wayland without XWayland, bad monitor    (exit 2)
├── EngineError               model cannot be loaded or run                        (exit 2)
│   ├── ModelNotFoundError    no local copy and no network
│   ├── ReplayExhaustedError  the replay engine has no more recorded replies
│   └── RemoteEngineError     an OpenAI-compatible server failed or refused
├── GenerationCancelled       a turn was cancelled (not an error for the person)   (exit 1)
├── ParseError                model output that is not a valid action: fed back to the model
│   └── NotOnScreen           a grounding model's refusal: what was asked for is not there
├── ActionError               an action that cannot be carried out: fed back to the model
│   └── OffScreenError        a target outside the captured screen or the allowed region
├── EmergencyStop             the person pressed the stop hotkey                   (exit 1)
├── TaskFailed                the run ended without success                        (exit 1)
├── BrowserError              the browser died, the page closed, no browser found  (exit 1)
└── SandboxUnavailable        bubblewrap is missing or cannot start a sandbox       (exit 2)
"""


class QvlError(Exception):
    """Base of every error qvl-agent raises on purpose."""

    exit_code = 1


class UsageError(QvlError):
    exit_code = 2


class InputError(QvlError):
    exit_code = 2


class ImageError(InputError):
    pass


class ConfigError(QvlError):
    exit_code = 2


class CaptureError(QvlError):
    exit_code = 2


class EngineError(QvlError):
    exit_code = 2


class ModelNotFoundError(EngineError):
    pass


class ReplayExhaustedError(EngineError):
    pass


class RemoteEngineError(EngineError):
    pass


class GenerationCancelled(QvlError):
    exit_code = 1


class ParseError(QvlError):
    """Model output that is not a valid action; the agent shows this message to the model."""


class NotOnScreen(ParseError):
    """The grounding model answered in its own refusal form ([-1,-1], a failure call): not on screen."""


class ActionError(QvlError):
    """An action that cannot be carried out; the agent shows this message to the model."""


class OffScreenError(ActionError):
    pass


class EmergencyStop(QvlError):
    exit_code = 1


class TaskFailed(QvlError):
    exit_code = 1


class BrowserError(QvlError):
    exit_code = 1


class SandboxUnavailable(QvlError):
    exit_code = 2
