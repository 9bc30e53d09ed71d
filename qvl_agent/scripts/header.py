"""The first lines of every saved Playwright script: how to run it, and the origins it was made for.

    #!/usr/bin/env python3
    # Run it with: qvl-agent replay FILENAME   (sandboxed: network only to the origins below, files it ...
    # Running it with plain `python` is your own choice: the script then has all of your rights.
    # qvl-agent-origins: http://127.0.0.1:8000 https://example.com

`render_header(filename, origins)` writes them (the exporter and `qvl-agent playwright` put them on top of
every script they save); `read_origins(source)` reads the origins back for `qvl-agent replay`, which lets
the sandboxed script reach those origins and nothing else.

Only the first `# qvl-agent-origins:` line of the script's leading comment block counts, and a script we
save holds only ours: `with_header` splits the text it is given into lines exactly as Python's tokenizer
does (`\r\n`, `\r`, `\n`, the one splitter this module reads with too), writes each as a `\n` line, and
drops the text's own `#!` line and every comment line of it that names `qvl-agent-origins`, so nothing
the model wrote can stand before, inside or after our header and be read as ours. A line further down, or
one after the first line of code, cannot widen what the script may reach either. An origin is `scheme://host[:port]`,
http or https only, checked both when written and when read; a script made for a local page names that
one file instead (`file:///abs/path.html`), which replay shows inside read-only, alone.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import quote, unquote, urlsplit

ORIGINS_TAG = "# qvl-agent-origins:"
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
)


class BadOrigin(ValueError):
    """An origin that is not `http(s)://host[:port]`; its message is one sentence for the person."""


def origin_of(url: str) -> str:
    """The normalised origin `scheme://host[:port]` of an http(s) URL (default ports left out).

    Raises BadOrigin for anything else (file://, a path-only string, user:password@, a bad port)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise BadOrigin(f"{url!r} is not an http:// or https:// address.") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise BadOrigin(f"{url!r} is not an http:// or https:// address.")
    if parts.username is not None or parts.password is not None:
        raise BadOrigin(f"{url!r} carries a user name or password; give the origin alone.")
    host = parts.hostname.lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.match(host):
            raise BadOrigin(f"{url!r} does not name a valid host.") from None
        shown = host
    else:
        shown = f"[{address}]" if address.version == 6 else str(address)
    scheme = parts.scheme.lower()
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{shown}" + (f":{port}" if port not in (None, default) else "")


PAGE_SUFFIXES = (".html", ".htm", ".xhtml", ".svg")  # a local page may be named; no other host file


def page_file(url: str) -> str | None:
    """The absolute path of a `file:///abs/page.html` URL: a web page (by its suffix), no hidden folder on
    its way, no host, query or fragment. Else None: a header never names a key, a config or a database."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        return None
    path = unquote(parts.path)
    if not path.startswith("/") or not all(c.isprintable() for c in path):
        return None
    hidden = any(part.startswith(".") for part in path.split("/"))
    return path if path.lower().endswith(PAGE_SUFFIXES) and not hidden else None


def check_origin(text: str) -> str:
    """`text` when it is exactly an origin (nothing after host[:port] but an optional "/"), normalised;
    a local page's `file:///abs/path` as it is; else BadOrigin."""
    path = page_file(text)
    if path is not None and not any(c.isspace() for c in path):
        return "file://" + quote(path)
    parts = urlsplit(text.strip())
    if parts.path not in ("", "/") or parts.query or parts.fragment or "?" in text or "#" in text:
        raise BadOrigin(f"{text!r} is not an origin (scheme://host[:port]).")
    return origin_of(text)


def script_origins(url: str) -> list[str]:
    """The origins a script made for `url` may reach when replayed: `url`'s own, or the local page itself."""
    path = page_file(url)
    if path is not None:
        return ["file://" + quote(path)]
    try:
        return [origin_of(url)]
    except BadOrigin:
        return []


def render_header(filename: str, origins: list[str]) -> str:
    """The comment lines that follow `#!/usr/bin/env python3` (each ends with a newline).

    `filename` may be any text: it is flattened to one printable line. Raises BadOrigin for an origin that
    is not http(s)://host[:port]."""
    checked = list(dict.fromkeys(check_origin(o) for o in origins))
    name = "".join(c if c.isprintable() and c not in "\r\n" else "?" for c in filename) or "SCRIPT.py"
    return (
        f"# Run it with: qvl-agent replay {name}   (sandboxed: network only to the origins below, "
        "files it writes go to a new folder)\n"
        "# Running it with plain `python` is your own choice: the script then has all of your rights.\n"
        f"{' '.join([ORIGINS_TAG, *checked])}\n"
    )


LINE_BREAK = re.compile(r"\r\n|\r|\n")  # where Python's tokenizer ends a line (not at U+2028, \f or \v)
SHEBANG = "#!/usr/bin/env python3"


def _reads_as_ours(line: str) -> bool:
    """A comment line that names our tag, however it is spelled around it: ours to write, never the text's."""
    stripped = line.strip()
    return stripped.startswith("#") and ORIGINS_TAG[2:].rstrip(":").lower() in stripped.lower()


def with_header(source: str, filename: str, origins: list[str]) -> str:
    """`source` (the model's or a run's text) under our `#!` line and header; see the module docstring.

    Line breaks become `\n` (Python reads `\r` and `\r\n` as `\n` too, in strings as well), the text's
    own `#!` line and any comment line naming our tag are left out."""
    lines = LINE_BREAK.split(source)
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    body = "\n".join(line for line in lines if not _reads_as_ours(line))
    return f"{SHEBANG}\n{render_header(filename, origins)}{body}"


def read_origins(source: str) -> list[str] | None:
    """The origins named by the first `# qvl-agent-origins:` line of the leading comment block, or None when
    the script has no such line (a hand-written script). Origins that do not parse are left out."""
    for line in LINE_BREAK.split(source):  # the lines Python's tokenizer sees
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            return None  # the comment block ended: a line further down is the script's own text
        if stripped.startswith(ORIGINS_TAG):
            found = []
            for word in stripped[len(ORIGINS_TAG) :].split():
                try:
                    found.append(check_origin(word))
                except BadOrigin:
                    continue
            return list(dict.fromkeys(found))
    return None
