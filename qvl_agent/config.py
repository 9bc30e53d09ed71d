"""Settings: frozen dataclasses loaded once from the TOML file in the user's config dir and `QVL_*`
environment variables, then passed down. Nothing else in qvl-agent reads `QVL_*` settings variables
(the display variables DISPLAY and WAYLAND_DISPLAY belong to `capture.py`).

Precedence: command-line flags (applied by the caller with `replace`) > environment > file > defaults.

A file that others can change (owned by another user, or writable by others) is never used: loading
raises ConfigError with one sentence (exit 2), since it could name a remote engine or the `auto` safety
mode the person never chose; saving replaces it with the person's own 0600 file.

Otherwise loading never changes the file and never refuses to start over it: a value that cannot be used (an
unknown key, a wrong type such as `true` or `3.9` for a whole number, `inf`, a table where text belongs,
an out-of-range value) is left out with one notice naming the key, and the rest of the file is kept;
a file that cannot be read at all (a folder, no permission, not TOML) gives one notice and the defaults.
Environment variables are checked the same way but strictly: a bad one is a `ConfigError`.

Saving (tomli-w) is atomic: write a temporary file, then rename, so a crash never leaves half a file;
a file that did not parse is kept as `config.toml.bak-<time>` before it is replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import stat
import struct
import time
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import tomli_w

from qvl_agent.errors import ConfigError

DEFAULT_MODEL = "Qwen/Qwen3-VL-2B-Instruct"
SAFETY_MODES = ("confirm", "auto", "dry-run")
ZOOM_MODES = ("off", "always", "large", "unsure")


def download_command(model: str) -> str:
    """The command that fetches a model into a folder (huggingface_hub's `hf`; `huggingface-cli` is gone)."""
    return f"hf download {model} --local-dir DIR"


DEVICES = "auto, cpu, cuda, cuda:N or mps"
MAX_PIXELS_LIMIT = 16_777_216  # the processor's max_pixels: the model never sees more

# --- hotkey syntax (pynput's GlobalHotKeys), checked without importing pynput -------------------------

MODIFIERS = {"ctrl", "ctrl_l", "ctrl_r", "alt", "alt_l", "alt_r", "alt_gr", "shift", "shift_l", "shift_r",
             "cmd", "cmd_l", "cmd_r"}  # fmt: skip
NAMED_KEYS = MODIFIERS | {
    "backspace", "caps_lock", "delete", "down", "end", "enter", "esc", "home", "insert", "left", "menu",
    "num_lock", "page_down", "page_up", "pause", "print_screen", "right", "scroll_lock", "space", "tab", "up",
    *(f"f{n}" for n in range(1, 21)),
}  # fmt: skip


def hotkey_keys(text: str, what: str = "hotkey") -> list[str]:
    """The key names of a pynput hotkey ("<ctrl>+<alt>+q" -> ["ctrl", "alt", "q"]), or ConfigError."""
    example = "like <ctrl>+<alt>+q"
    if not isinstance(text, str):
        raise ConfigError(f"The {what} hotkey must be text {example}, not {text!r}.")
    if not text.strip():
        raise ConfigError(
            f"The {what} hotkey is empty: press a combination like Ctrl+Alt+Q in Settings "
            f"(or write one {example} in config.toml)."
        )
    parts = text.strip().lower().split("+")
    if any(not p for p in parts):
        raise ConfigError(f"The {what} hotkey {text!r} is not a key combination {example}.")
    keys = []
    for part in parts:
        if part.startswith("<") and part.endswith(">"):
            name = part[1:-1]
            if name not in NAMED_KEYS and not name.isdigit():
                raise ConfigError(f"The {what} hotkey {text!r} names an unknown key <{name}>.")
            keys.append(name)
        elif len(part) == 1 and part.isprintable():
            keys.append(part)
        else:
            raise ConfigError(
                f"The {what} hotkey {text!r} has {part!r}: write named keys in angle brackets, {example}."
            )
    shown = hotkey_label(text)  # well formed from here on: say it as people read it
    if len(set(keys)) != len(keys):
        raise ConfigError(f"The {what} hotkey {shown} repeats a key.")
    if all(k in MODIFIERS for k in keys):
        raise ConfigError(f"The {what} hotkey {shown} needs a key besides the modifiers.")
    if not any(k in MODIFIERS for k in keys) and not any(k.startswith("f") and k[1:].isdigit() for k in keys):
        raise ConfigError(f"The {what} hotkey {shown} needs a modifier (Ctrl, Alt, Shift or Super), like Ctrl+Alt+Q.")
    return keys


def check_hotkey(text: str, what: str = "hotkey") -> str:
    """`text` stripped when pynput can listen for it, else ConfigError with one sentence."""
    hotkey_keys(text, what)
    return text.strip()


@dataclass(frozen=True)
class Hotkeys:
    """pynput GlobalHotKeys syntax, e.g. "<ctrl>+<alt>+q"."""

    ask: str = "<ctrl>+<alt>+q"
    region: str = "<ctrl>+<alt>+r"
    stop: str = "<ctrl>+<alt>+<esc>"
    # A run pauses for the person to act, and goes on when pressed again. People write it as the top-level
    # `takeover_hotkey`; it lives here so that every hotkey is checked against the others.
    takeover: str = "<ctrl>+<alt>+t"


TAKEOVER_HOTKEY = "takeover_hotkey"  # the take-over hotkey's name in config.toml
TAKEOVER_WHAT = "take-over (takeover_hotkey)"  # as error sentences name it: "The take-over (takeover_hotkey) hotkey"


def check_hotkeys(hotkeys: Hotkeys) -> Hotkeys:
    """Every hotkey valid and no two the same, else ConfigError."""
    values = {
        f.name: hotkey_keys(getattr(hotkeys, f.name), TAKEOVER_WHAT if f.name == "takeover" else f.name)
        for f in fields(Hotkeys)
    }
    if len({frozenset(keys) for keys in values.values()}) != len(values):
        raise ConfigError("The ask, region and stop hotkeys and takeover_hotkey must all be different.")
    return hotkeys


def every_hotkey(hotkeys: Hotkeys) -> list[str]:
    """The person's hotkeys, take-over included (pynput syntax): a recording of the person leaves them out."""
    return [getattr(hotkeys, f.name) for f in fields(Hotkeys)]


KEY_LABELS = {"ctrl": "Ctrl", "alt": "Alt", "alt_gr": "AltGr", "shift": "Shift", "cmd": "Super", "esc": "Esc",
              "page_up": "PgUp", "page_down": "PgDown", "print_screen": "Print"}  # fmt: skip


def hotkey_label(combo: str) -> str:
    """A pynput hotkey as people read it: "<ctrl>+<alt>+q" → "Ctrl+Alt+Q", "<ctrl>+<alt>+<esc>" → "Ctrl+Alt+Esc"."""
    labels = []
    for part in combo.strip().split("+"):
        name = part[1:-1] if part.startswith("<") and part.endswith(">") else part
        base = name.removesuffix("_l").removesuffix("_r")  # left and right modifiers read the same
        labels.append(KEY_LABELS.get(base) or (name.upper() if len(name) == 1 else name.replace("_", " ").title()))
    return "+".join(labels)


SANDBOX_MEMORY_MIN_MB = 256  # below this a sandboxed Chromium cannot start


# --- the settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    model: str = DEFAULT_MODEL  # Hugging Face id or a local directory
    engine: str = "local"  # local | replay:FILE | openai:URL
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    max_pixels: int = 16_777_216  # cap on the pixels the model sees per screenshot (smart-resize bound)
    profile: str = ""  # a model profile (qvl-agent models); empty: chosen from the model's own files
    zoom: str = "off"  # grounding's zoom-in pass: off | always | large | unsure
    zoom_crop: int = 50  # the zoom crop, in percent of each side of the screen
    zoom_above_pixels: int = 3_686_400  # zoom "large": screens with more pixels than this (2560x1440)
    max_new_tokens: int = 512
    feature_cache_mb: int = 1024  # vision features kept by content hash
    session_memory_mb: int = 4096  # KV caches of idle sessions beyond this are evicted, oldest first
    speculative: bool = True  # greedy replies draft tool-call skeletons and n-grams, verified in one forward
    compile: bool = True  # on a GPU, a torch.compile'd decode step is built in the background and swapped in
    max_batch: int = 16  # turns of different sessions decoding in one batched step; 1 turns batching off
    batch_memory_mb: int = 8192  # KV memory of the batch's rows (4,096 or 3,072 tokens each), which bounds it too
    # On a GPU, the batch's newest paths: prompts through the captured prefill buckets, and greedy steps
    # launched ahead of the host. Off there until the GPU check has passed them (a CPU always runs ahead).
    fast_batch: bool = False
    # On a GPU, prompts and speculation's verify pass through the fused pieces, compiled in the background
    # with the decode step and captured again for every prefill bucket. Off there until the GPU check has
    # passed it (the CPU check: tests/test_fast_prefill.py).
    fast_prefill: bool = False
    safety_mode: str = "confirm"  # confirm | auto | dry-run
    max_actions_per_reply: int = 20  # a reply with more actions runs none of them (the model is told)
    max_type_chars: int = 2000  # longest text one `type` action may type (~10 s on the desktop)
    browser: str = ""  # a Chromium executable; empty: find one
    sandbox_memory_mb: int = 4096  # memory of one sandboxed script run in all, shared memory and tmpfs included
    api_key: str = ""  # for --engine openai:URL
    api_token: str = ""  # for `qvl-agent serve`
    hotkeys: Hotkeys = field(default_factory=Hotkeys)

    def validated(self) -> Settings:
        """Self, or ConfigError naming the first value that cannot be used."""
        for f in fields(Settings):
            if f.name != "hotkeys":
                _check_value(f.name, getattr(self, f.name))
        check_hotkeys(self.hotkeys)
        return self


MAX_BATCH = 64  # the largest decode batch the engine captures a step for

# Whole numbers are bounded before any use: a 400-digit max_new_tokens would pass every minimum and only
# fail deep inside the engine (a C integer), and Python refuses to even print one of 4,300 digits.
MAX_INT_DIGITS = 15
INT_MAXIMUM = {
    "max_new_tokens": 1_048_576,
    "max_actions_per_reply": 100_000,
    "max_type_chars": 10_000_000,
    "max_batch": MAX_BATCH,
}


def _profile_names() -> tuple[str, ...]:
    from qvl_agent.profiles import PROFILES

    return tuple(PROFILES)


def _check_value(name: str, value) -> None:
    """ConfigError naming `name` when `value` (already of the field's type) cannot be used."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
        raise ConfigError(f"{name} must be a whole number of at most {MAX_INT_DIGITS} digits, not one that long.")
    minimum = {
        "max_pixels": 65_536,
        "max_new_tokens": 1,
        "max_actions_per_reply": 1,
        "max_type_chars": 1,
        "max_batch": 1,
        "batch_memory_mb": 0,
    }
    if name in minimum and value < minimum[name]:
        raise ConfigError(f"{name} must be at least {minimum[name]}, not {value}.")
    if name in INT_MAXIMUM and value > INT_MAXIMUM[name]:
        raise ConfigError(f"{name} must be at most {INT_MAXIMUM[name]:,}, not {value:,}.")
    if name == "max_pixels" and value > MAX_PIXELS_LIMIT:
        raise ConfigError(f"max_pixels must be at most {MAX_PIXELS_LIMIT:,} (Qwen3-VL's own cap), not {value:,}.")
    if name in ("feature_cache_mb", "session_memory_mb") and value < 0:
        raise ConfigError(f"{name} cannot be negative, not {value}.")
    if name == "sandbox_memory_mb" and value < SANDBOX_MEMORY_MIN_MB:
        raise ConfigError(
            f"sandbox_memory_mb must be at least {SANDBOX_MEMORY_MIN_MB} (Chromium needs it), not {value}."
        )
    if name == "zoom" and value not in ZOOM_MODES:
        raise ConfigError(f"zoom must be one of {', '.join(ZOOM_MODES)}, not {value!r}.")
    if name == "zoom_crop" and not 10 <= value <= 90:
        raise ConfigError(f"zoom_crop must be a percentage from 10 to 90, not {value}.")
    if name == "zoom_above_pixels" and value < 0:
        raise ConfigError(f"zoom_above_pixels cannot be negative, not {value}.")
    if name == "profile" and value and value.strip().lower() not in _profile_names():
        raise ConfigError(f"profile must be one of {', '.join(_profile_names())} (or empty), not {value!r}.")
    if name == "safety_mode" and value not in SAFETY_MODES:
        raise ConfigError(f"safety_mode must be one of {', '.join(SAFETY_MODES)}, not {value!r}.")
    if name == "device" and not (value in ("auto", "cpu", "cuda", "mps") or value.startswith("cuda:")):
        raise ConfigError(f"device must be {DEVICES}, not {value!r}.")
    if name == "model" and not value.strip():
        raise ConfigError("model cannot be empty.")


ENV_VARS = {
    "QVL_MODEL": "model",
    "QVL_ENGINE": "engine",
    "QVL_DEVICE": "device",
    "QVL_MAX_PIXELS": "max_pixels",
    "QVL_PROFILE": "profile",
    "QVL_ZOOM": "zoom",
    "QVL_ZOOM_CROP": "zoom_crop",
    "QVL_ZOOM_ABOVE_PIXELS": "zoom_above_pixels",
    "QVL_MAX_NEW_TOKENS": "max_new_tokens",
    "QVL_FEATURE_CACHE_MB": "feature_cache_mb",
    "QVL_SESSION_MEMORY_MB": "session_memory_mb",
    "QVL_SPECULATE": "speculative",
    "QVL_COMPILE": "compile",
    "QVL_MAX_BATCH": "max_batch",
    "QVL_BATCH_MEMORY_MB": "batch_memory_mb",
    "QVL_FAST_BATCH": "fast_batch",
    "QVL_FAST_PREFILL": "fast_prefill",
    "QVL_SAFETY_MODE": "safety_mode",
    "QVL_BROWSER": "browser",
    "QVL_SANDBOX_MEMORY_MB": "sandbox_memory_mb",
    "QVL_API_KEY": "api_key",
    "QVL_API_TOKEN": "api_token",
}
_INT_FIELDS = {f.name for f in fields(Settings) if f.type == "int"}
_TEXT_FIELDS = {f.name for f in fields(Settings) if f.type == "str"}
_BOOL_FIELDS = {f.name for f in fields(Settings) if f.type == "bool"}
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def config_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("QVL_CONFIG_DIR"):
        return Path(env["QVL_CONFIG_DIR"])
    import platformdirs

    return Path(platformdirs.user_config_dir("qvl-agent", appauthor=False))


def config_path(env: dict[str, str] | None = None) -> Path:
    return config_dir(env) / "config.toml"


def _what(value) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _coerce(name: str, value, source: str):
    """`value` as the Settings field `name` wants it, strictly typed and checked, or ConfigError."""
    if name in _BOOL_FIELDS:
        if isinstance(value, str) and source.startswith("$") and value.strip().lower() in _BOOL_WORDS:
            value = _BOOL_WORDS[value.strip().lower()]  # environment variables are text: 0/1, true/false
        if not isinstance(value, bool):
            raise ConfigError(f"{name} in {source} must be true or false, not {_what(value)}.")
        return value
    if name in _INT_FIELDS:
        if isinstance(value, str) and source.startswith("$") and re.fullmatch(r"\s*-?[0-9]+\s*", value):
            digits = value.strip().lstrip("-")
            if len(digits) > MAX_INT_DIGITS:  # checked before int(): Python refuses 4,300 digits with a traceback
                raise ConfigError(f"{name} in {source} must be a whole number of at most {MAX_INT_DIGITS} digits.")
            value = int(value.strip())  # environment variables are text (ASCII digits only: int("²") fails)
        if isinstance(value, bool) or not isinstance(value, int):
            shown = "inf" if isinstance(value, float) and math.isinf(value) else _what(value)
            raise ConfigError(f"{name} in {source} must be a whole number, not {shown}.")
    elif not isinstance(value, str):
        raise ConfigError(f"{name} in {source} must be text, not {_what(value)}.")
    try:
        _check_value(name, value)
    except ConfigError as exc:
        raise ConfigError(f"{str(exc).rstrip('.')} (in {source}).") from None
    return value


def _from_mapping(data: dict, source: str) -> tuple[dict, list[str]]:
    """The usable values of a parsed file, and one sentence for each key that was left out."""
    values: dict = {}
    problems: list[str] = []
    takeover = None
    for key, value in data.items():
        try:
            if key == "hotkeys":
                values["hotkeys"] = _hotkeys(value, source, problems)
            elif key == TAKEOVER_HOTKEY:
                takeover = value  # checked against the [hotkeys] table, which TOML puts after it
            elif key in _INT_FIELDS | _TEXT_FIELDS | _BOOL_FIELDS:
                values[key] = _coerce(key, value, source)
            else:
                raise ConfigError(f"Unknown setting {key!r} in {source}.")
        except ConfigError as exc:
            problems.append(f"{exc} It is ignored.")
    if takeover is not None:
        hotkeys = values.get("hotkeys", Hotkeys())
        try:
            text = check_hotkey(takeover, TAKEOVER_WHAT)
            values["hotkeys"] = check_hotkeys(dataclasses.replace(hotkeys, takeover=text))
        except ConfigError as exc:
            problems.append(f"{str(exc).rstrip('.')} (in {source}); it is ignored.")
    return values, problems


def _hotkeys(value, source: str, problems: list[str]) -> Hotkeys:
    if not isinstance(value, dict):
        raise ConfigError(f"[hotkeys] in {source} must be a table, not {_what(value)}.")
    chosen = Hotkeys()
    for name, text in value.items():
        try:
            if name not in {f.name for f in fields(Hotkeys)}:
                raise ConfigError(f"Unknown hotkey {name!r} in [hotkeys] of {source}.")
            candidate = dataclasses.replace(chosen, **{name: check_hotkey(text, f"[hotkeys] {name}")})
            check_hotkeys(candidate)
            chosen = candidate
        except ConfigError as exc:
            problems.append(f"{str(exc).rstrip('.')} (in {source}); it is ignored.")
    return chosen


MAX_FILE_BYTES = 1 << 20  # a settings file is a few hundred bytes


def _read(path: Path) -> tuple[dict, list[str]]:
    """The file's table, or {} and the one sentence that says why it cannot be used."""
    if not path.exists() and not path.is_symlink():
        return {}, []
    why = ""
    try:
        # Non-blocking, then checked: a named pipe would hang the start, a link to /dev/zero fill the memory.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            kind = os.fstat(f.fileno()).st_mode
            if stat.S_ISDIR(kind):
                raise IsADirectoryError
            if not stat.S_ISREG(kind):
                why = "is not a regular file"
            elif distrust := untrusted_reason(path, os.fstat(f.fileno()), f.fileno()):
                raise ConfigError(distrust)
            elif len(raw := f.read(MAX_FILE_BYTES + 1)) > MAX_FILE_BYTES:
                why = f"is larger than {MAX_FILE_BYTES >> 10} KB"
            else:
                return tomllib.loads(raw.decode("utf-8")), []
    except IsADirectoryError:
        why = "is a folder, not a file"
    except PermissionError:
        why = "cannot be read (permission denied)"
    except UnicodeDecodeError:
        why = "is not UTF-8 text"
    except tomllib.TOMLDecodeError as exc:
        why = f"is not valid TOML ({exc})"
    except RecursionError:  # tomllib recurses into nested arrays and tables
        why = "is not valid TOML (values nested too deeply)"
    except ValueError:  # tomllib converts with int(), which refuses more than 4,300 digits
        why = "is not valid TOML (a number has too many digits)"
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or exc})"
    return {}, [f"The settings file {path} {why}; defaults are used until it is fixed or removed."]


def untrusted_reason(path: Path, info: os.stat_result, fd: int | None = None) -> str:
    """Why a settings file others can change must not be used (it can point the engine at a remote URL or
    switch the safety mode to auto), or "" when only its owner (or root) can change it. The token file's
    rule (`server/auth.py`), plus OpenSSH's for groups: group-writable is fine only for the person's own
    private group. A POSIX ACL (read from `fd`, else `path`) can give other users and groups write access
    that the mode bits do not show (they show the ACL's mask): each of its entries is checked too."""
    if not hasattr(os, "getuid"):
        return ""  # Windows: no POSIX owner or mode bits to check
    if info.st_uid not in (os.getuid(), 0):
        return (
            f"The settings file {path} belongs to another user (uid {info.st_uid}), who could choose the engine "
            "or the safety mode for you; it is not used: delete it, or take it over (chown) once you have read it."
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o002 or (mode & 0o020 and not _own_private_group(info.st_gid)):
        return (
            f"The settings file {path} can be changed by other users (mode {mode:04o}), so it may not hold what "
            f"you chose; it is not used until only you can write it (chmod go-w {path})."
        )
    if writers := acl_writers(path if fd is None else fd):
        return (
            f"The settings file {path} can be changed by {writers} through its access control list, so it may "
            f"not hold what you chose; it is not used until only you can write it (setfacl -b {path})."
        )
    return ""


_ACL_XATTR = "system.posix_acl_access"
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK = 0x02, 0x04, 0x08, 0x10
_ACL_WRITE = 0x02


def acl_writers(target: Path | int) -> str:
    """Who other than the owner may write `target` (a path or an open fd) through its POSIX ACL, in words
    ("user 1001, group 27"), or "" (no ACL, or none that lets anyone else write). The kernel's format:
    a u32 version, then (u16 tag, u16 permissions, u32 id) entries; named entries and the owning group
    are limited by the mask."""
    try:
        raw = os.getxattr(target, _ACL_XATTR)
    except (OSError, AttributeError):  # no ACL, a filesystem without them, or no xattrs on this platform
        return ""
    entries = [struct.unpack_from("<HHI", raw, at) for at in range(4, len(raw) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 0o7)
    writers = []
    for tag, perm, ident in entries:
        if not perm & mask & _ACL_WRITE:
            continue
        if tag == _ACL_USER and ident not in (os.getuid(), 0):
            writers.append(f"user {ident}")
        elif tag == _ACL_GROUP and not _own_private_group(ident):
            writers.append(f"group {ident}")
    return ", ".join(writers)


def _own_private_group(gid: int) -> bool:
    """Whether `gid` is the person's primary group with no other members (Debian/Ubuntu's user groups)."""
    try:
        import grp
        import pwd

        members = set(grp.getgrgid(gid).gr_mem)
        me = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return False
    if gid != os.getgid() or not members <= {me}:
        return False
    # Another account whose primary group this is could write the file as well.
    return all(user.pw_gid != gid or user.pw_uid == os.getuid() for user in pwd.getpwall())


# Every notice `load` gave in this process, for front ends that show them elsewhere than stderr (the tray).
NOTICES: list[str] = []


@dataclass(frozen=True)
class Loaded:
    settings: Settings
    path: Path
    notices: tuple[str, ...] = ()  # one sentence each for the person: what was left out and why

    @property
    def notice(self) -> str:
        return " ".join(self.notices)


def load(path: Path | None = None, env: dict[str, str] | None = None) -> Loaded:
    """Settings from file and environment. Never writes: bad values in the file are left out with a notice
    each; a bad environment variable raises ConfigError."""
    env = os.environ if env is None else env
    path = path or config_path(env)
    data, notices = _read(path)
    values, problems = _from_mapping(data, str(path))
    notices += problems
    values.update(_from_environment(env))  # the environment over the file
    NOTICES.extend(notices)
    return Loaded(Settings(**values).validated(), path, tuple(notices))


def from_environment(env: dict[str, str] | None = None, **fixed) -> Settings:
    """The defaults with the `QVL_*` variables applied, then `fixed`: what a measuring tool runs with,
    so that `QVL_FAST_PREFILL=1 qvl-agent bench` times a path that is off by default, while nobody's
    settings file changes a figure. A bad variable raises ConfigError."""
    values = _from_environment(os.environ if env is None else env)
    return Settings(**{**values, **fixed}).validated()


def _from_environment(env: dict[str, str]) -> dict:
    return {name: _coerce(name, env[var], f"${var}") for var, name in ENV_VARS.items() if env.get(var)}


def dumps(settings: Settings) -> str:
    """The settings as TOML; secrets stay in the environment or their own 0600 files."""
    data = {f.name: getattr(settings, f.name) for f in fields(Settings)}
    for secret in ("api_token", "api_key"):
        data.pop(secret)
    data["hotkeys"] = dataclasses.asdict(settings.hotkeys)
    data[TAKEOVER_HOTKEY] = data["hotkeys"].pop("takeover")
    return tomli_w.dumps(data)


def save(settings: Settings, path: Path | None = None) -> Path:
    """Validate, then write atomically: readers see the old file or the new one, never half of one.
    ConfigError with one sentence when the folder cannot be written."""
    settings.validated()
    path = path or config_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data, problems = _read(path)
        except ConfigError as exc:  # a file others could change: saving replaces it with the person's own
            data, problems = {}, [str(exc)]
        problems += _from_mapping(data, str(path))[1]  # a key left out on load would be lost on save
        if problems and path.is_file():  # a file the person may still want: keep it beside
            backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
            backup.write_bytes(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"The settings cannot be saved to {path}: {exc.strerror or exc}.") from None
    write_settings_text(path, dumps(settings))
    return path


def write_settings_text(path: Path, text: str) -> None:
    """Replace the settings file `path` with `text` atomically (readers see the old file or the new one),
    owner-only (0600) whatever the umask: a file others can write is refused on load. ConfigError with one
    sentence when it cannot be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)  # an older temporary file keeps its own mode through O_CREAT
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ConfigError(f"The settings cannot be saved to {path}: {exc.strerror or exc}.") from None


def replace(settings: Settings, **changes) -> Settings:
    """`dataclasses.replace` that drops None values (unset command-line flags) and validates."""
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None}).validated()
