"""Who may use the server: the bearer token, where it is kept, and what `--no-token` still demands.

The token is `Settings.api_token` (from `QVL_API_TOKEN`) when set; otherwise one is generated on first
run and kept in `<config dir>/api_token`, created with mode 0600. An existing file is opened without
following a symbolic link, must belong to the person running the server, and is made private (0600)
with a notice when others could read it. Tokens shorter than 16 characters are refused.

`Authenticator` is the one FastAPI dependency every protected route uses. With a token it checks
`Authorization: Bearer TOKEN` in constant time. Without one (`--no-token`, loopback only) it still
refuses what a web page in the person's browser could send: a request whose `Host` is not a loopback
name (DNS rebinding) and a POST that is not `Content-Type: application/json` (a cross-site form).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from starlette.requests import Request  # FastAPI's own, without importing FastAPI for a token check

from qvl_agent.errors import ConfigError, UsageError
from qvl_agent.server.api_error import ApiError

TOKEN_FILE = "api_token"
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token_file(path: Path) -> tuple[str, str | None]:
    """(token, notice or None) from an existing token file, checked and made private if it was not."""
    try:
        # No link is followed, and a FIFO put in the file's place cannot block the start.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(f"The API token file {path} is a symbolic link; replace it with a file.") from None
        raise ConfigError(f"Cannot read the API token file {path} ({exc.strerror}).") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before wrapping: a folder cannot even be wrapped
        os.close(fd)
        raise ConfigError(f"The API token file {path} is not a regular file; delete it so a new one is made.")
    notice = None
    with os.fdopen(fd, "rb") as fh:
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise ConfigError(
                f"The API token file {path} belongs to another user (uid {info.st_uid}); "
                "delete it so a new one is made."
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            os.fchmod(fh.fileno(), 0o600)
            notice = f"The API token file {path} was readable by others (mode {mode:04o}); changed it to 0600."
        data = fh.read(4096)
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"The API token file {path} is not text; delete it so a new one is made.") from None
    check_token(token, f"The API token in {path}", "delete the file so a new one is made")
    return token, notice


def check_token(token: str, where: str, remedy: str) -> None:
    """A usable token: at least MIN_TOKEN_CHARS visible ASCII characters, as an HTTP header can carry."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where} is {len(token)} characters long; use at least {MIN_TOKEN_CHARS} (or {remedy}).")
    if not all("!" <= c <= "~" for c in token):
        raise ConfigError(
            f"{where} holds spaces, control or non-ASCII characters, which an Authorization header cannot "
            f"carry; use letters, digits and punctuation only (or {remedy})."
        )


def load_or_create_token(directory: Path) -> tuple[str, Path, str]:
    """(token, file, how): the stored token, or a new one written with mode 0600."""
    path = directory / TOKEN_FILE
    if path.exists() or path.is_symlink():
        token, notice = read_token_file(path)
        return token, path, notice or f"API token read from {path} (mode 0600)."
    token = secrets.token_urlsafe(32)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.tmp")
        # Created 0600 from the start: the secret is never readable by others, not even briefly.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"Cannot write the API token file {path} ({exc.strerror}).") from None
    return token, path, f"API token created in {path} (mode 0600)."


def resolve_token(settings_token: str, directory: Path, host: str, no_token: bool) -> tuple[str | None, str]:
    """(token or None, one line saying where it came from) for `qvl-agent serve`."""
    if no_token:
        if not is_loopback(host):
            raise UsageError(f"--no-token is only allowed on a loopback address (127.0.0.1, ::1), not {host}.")
        return None, "No API token: programs on this machine can use the server (web pages cannot)."
    if settings_token:
        check_token(settings_token, "QVL_API_TOKEN", "unset it so the token file is used")
        return settings_token, "API token from QVL_API_TOKEN."
    token, _, note = load_or_create_token(directory)
    return token, note


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `Bearer <token>`, compared in constant time."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def token_matches(value: str | None, token: str) -> bool:
    return bool(value) and hmac.compare_digest(value.encode(), token.encode())


def user_of(value: str | None, tokens: Mapping[str, str]) -> str | None:
    """The user whose token `value` is (every token compared, in constant time each), or None."""
    found = None
    for user, token in tokens.items():
        if token_matches(value, token):
            found = user
    return found


def read_users_file(path: Path) -> dict[str, str]:
    """`serve --tokens-file`: one `NAME TOKEN` per line (blank lines and `#` comments left out), each user
    with a token of their own. The file must be the person's own and private, as the token file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ConfigError(f"Cannot read the tokens file {path} ({exc.strerror}).") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"The tokens file {path} is not a regular file.")
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077):
            raise ConfigError(f"The tokens file {path} must be yours and private: chmod 600 {path}.")
        data = fh.read(1 << 20)
    users: dict[str, str] = {}
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise ConfigError(f"Line {n} of the tokens file {path} is not `NAME TOKEN`.")
        name, token = words
        check_token(token, f"The token of {name!r} (line {n} of {path})", "give that user a longer token")
        if name in users or token in users.values():
            raise ConfigError(f"Line {n} of the tokens file {path} repeats a name or a token: each user needs both.")
        users[name] = token
    if not users:
        raise ConfigError(f"The tokens file {path} names no user.")
    return users


class Authenticator:
    """The FastAPI dependency of every protected route (`dependencies=[Depends(auth)]`). `tokens` maps each
    user to their token ({"": TOKEN} for one token); the user a request came from goes to
    `request.state.user`, which scopes its caches."""

    def __init__(self, tokens: Mapping[str, str] | None):
        self.tokens = tokens

    async def __call__(self, request: Request) -> None:
        request.state.user = ""
        if self.tokens is not None:
            scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
            user = user_of(value.strip(), self.tokens) if scheme.lower() == "bearer" else None
            request.state.user = user or ""
            if user is None:
                raise ApiError(
                    401,
                    "Missing or wrong API token: send 'Authorization: Bearer TOKEN' "
                    "(qvl-agent serve prints where the token is).",
                    type="authentication_error",
                    code="invalid_api_key",
                )
            return
        host = request.headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if not is_loopback(name):
            raise ApiError(
                403,
                "This server runs without a token and answers only requests addressed to a loopback name "
                "(localhost, 127.0.0.1, [::1]).",
                type="permission_error",
                code="host_not_allowed",
            )
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if request.method == "POST" and content_type != "application/json":
            raise ApiError(
                415,
                "Send the request body as JSON with 'Content-Type: application/json'.",
                code="unsupported_media_type",
            )
