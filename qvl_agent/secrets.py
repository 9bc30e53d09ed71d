"""Secrets the agent types without the model, the trace or the screen log ever holding their values.

The person names a secret (`--secret PASSWORD`); its value comes from the environment variable
`QVL_SECRET_PASSWORD`, or a hidden prompt on a terminal. The model is told the placeholder `{{PASSWORD}}`
and writes it in a `type` action; `reveal_action` swaps the value in right before the executor types it,
and `mask` turns the value back into the placeholder in everything that comes out of the executor (its
messages, the details a trace and an exported script are built from, the page's final state). The
exported script reads `os.environ["QVL_SECRET_PASSWORD"]` where the model typed the
placeholder, and nowhere else (`segments`, then `scripts.literals.typed_code`).

A page passes a typed value on in many spellings: a form posts it form-encoded (`+` for a space), a GET
form or a script puts it in a URL percent-encoded (each encoder escapes its own choice of characters),
Basic auth and many scripts base64-encode it. `mask` replaces every such spelling; `carried_by` finds
one, which the browser's network guard uses to keep secrets to allowed hosts.

Standard library only; nothing here reads the environment by itself: callers pass it in.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, unquote

from qvl_agent import actions as A
from qvl_agent.errors import ActionError, UsageError

PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")
SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_PREFIX = "QVL_SECRET_"


def env_name(name: str) -> str:
    """The environment variable that holds secret `name`'s value."""
    return ENV_PREFIX + name


def placeholder(name: str) -> str:
    return "{{" + name + "}}"


@dataclass(frozen=True)
class Secrets:
    values: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.values)

    def placeholders(self) -> list[str]:
        return [placeholder(name) for name in self.values]

    def reveal(self, text: str) -> str:
        """`text` with every declared placeholder replaced by its value; an unknown one is the model's error."""
        if not self.values:
            return text

        def value(match: re.Match) -> str:
            name = match.group(1)
            if name not in self.values:
                known = ", ".join(self.placeholders())
                raise ActionError(f"There is no secret {placeholder(name)}; the secrets you can type are {known}.")
            return self.values[name]

        return PLACEHOLDER.sub(value, text)

    def segments(self, typed: str) -> list[list[str]]:
        """What a `type` action typed, as the model wrote it: ["secret", NAME] for each placeholder of a
        declared secret, ["text", TEXT] for everything else (an undeclared `{{X}}` included). The export
        writes a secret read exactly there, and nowhere else (`scripts.literals.typed_code`)."""
        out: list[list[str]] = []
        at = 0
        for match in PLACEHOLDER.finditer(typed):
            if match.group(1) not in self.values:
                continue
            if match.start() > at:
                out.append(["text", typed[at : match.start()]])
            out.append(["secret", match.group(1)])
            at = match.end()
        if at < len(typed) or not out:
            out.append(["text", typed[at:]])
        return out

    def reveal_action(self, action: A.Action) -> A.Action:
        """The action the executor runs: a `type` with its placeholders filled in, anything else as it is."""
        if self.values and isinstance(action, A.Type) and PLACEHOLDER.search(action.text):
            return dataclasses.replace(action, text=self.reveal(action.text))
        return action

    def mask(self, data: Any) -> Any:
        """`data` (text, or dicts and lists of it) with every secret value, in each of its `forms`, replaced
        by its placeholder."""
        if not self.values:
            return data
        if isinstance(data, str):
            for name, pattern in _patterns(tuple(sorted(self.values.items()))):
                data = pattern.sub(lambda _m, name=name: placeholder(name), data)
            return data
        if isinstance(data, dict):
            return {self.mask(k): self.mask(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return type(data)(self.mask(v) for v in data)
        return data

    def carried_by(self, text: str | bytes | None) -> str:
        """The name of a secret whose value `text` carries (raw, percent-encoded however an encoder chose
        to, form-encoded, base64 or URL-safe base64, also inside a longer base64 string), or ""."""
        if not self.values or not text:
            return ""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        candidates = {text, unquote(text)}  # base64 inside a URL is percent-encoded once more
        for name, pattern in _patterns(tuple(sorted(self.values.items()))):
            if any(pattern.search(candidate) for candidate in candidates):
                return name
        return ""


def forms(value: str) -> list[str]:
    """Spellings of `value` besides those `mask` matches character by character (see `_char_pattern`):
    itself, and base64 (standard and URL-safe) of the value and of its percent-encodings, each at the
    three alignments it can have inside a longer base64 string (only the characters that depend on the
    value alone)."""
    spellings = {value}
    for text in dict.fromkeys((value, quote(value, safe=""), quote_plus(value, safe=""))):
        data = text.encode("utf-8", "surrogatepass")
        for pad in range(3):
            full = base64.b64encode(b"\0" * pad + data).decode("ascii")
            core = full[(pad * 8 + 5) // 6 : ((pad + len(data)) * 8) // 6]
            if len(core) >= 4:
                spellings.add(core)
                spellings.add(core.translate(str.maketrans("+/", "-_")))
    return sorted(spellings, key=len, reverse=True)


def hex_forms(value: str) -> list[str]:
    """The value as hex digits: of its UTF-8 bytes, and of its UTF-16 code units (matched in either case)."""
    utf8 = value.encode("utf-8", "surrogatepass").hex()
    utf16 = value.encode("utf-16-be", "surrogatepass").hex()
    return [utf8, utf16] if len(utf8) >= 4 else []


def _char_pattern(ch: str) -> str:
    """One character as it may appear: itself in either case, percent-encoded once or more (`%25` for
    each `%` an encoder added), `+` for a space, a JSON escape (backslash, u, four hex digits) or an HTML
    character reference."""
    escaped = "".join(f"%(?:25)*{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass"))
    options = [f"(?i:{re.escape(ch)})", f"(?i:{escaped})", f"&#(?:0*{ord(ch)}|(?i:x0*{ord(ch):x}));"]
    if ord(ch) < 0x10000:
        options.append(f"(?i:\\\\u{ord(ch):04x})")
    if ch == " ":
        options.append(r"\+")
    return "(?:" + "|".join(options) + ")"


@functools.lru_cache(maxsize=32)
def _patterns(items: tuple[tuple[str, str], ...]) -> list[tuple[str, re.Pattern]]:
    """(name, pattern) for every secret, the longest value first, so a longer one is masked before a part."""
    out = []
    for name, value in sorted(items, key=lambda item: -len(item[1])):
        spellings = ["".join(_char_pattern(ch) for ch in value)]
        spellings += [re.escape(spelling) for spelling in forms(value) if spelling != value]
        spellings += [f"(?i:{spelling})" for spelling in hex_forms(value)]
        out.append((name, re.compile("|".join(spellings))))
    return out


def read_secrets(names: list[str], environ: Mapping[str, str], ask: Callable[[str], str] | None = None) -> Secrets:
    """The values of `names`: from QVL_SECRET_NAME, else from `ask(prompt)` (a hidden prompt, given only when
    stdin is a terminal). Raises UsageError (one sentence) for a bad name or a secret with no value."""
    values: dict[str, str] = {}
    for name in names:
        if not _NAME.match(name):
            raise UsageError(f"--secret takes a name of letters, digits and _, such as PASSWORD, not {name!r}.")
        value = environ.get(env_name(name))
        if value is None and ask is not None:
            value = ask(f"Value of the secret {name} (not shown): ")
        if not value:
            raise UsageError(
                f"The secret {name} has no value: set the environment variable {env_name(name)} "
                "or run from a terminal to be asked for it."
            )
        values[name] = value
    return Secrets(values)
