"""The server's bearer token: where it comes from and how requests are checked against it.

The token is `Settings.api_token` (from `QVL_API_TOKEN`) when set; otherwise one is generated on first
run and kept in `<config dir>/api_token`, created with mode 0600 so other users cannot read it.
Running without a token is allowed only on a loopback address, and only when asked for.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from pathlib import Path

from qvl_agent.errors import ConfigError, UsageError

TOKEN_FILE = "api_token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_or_create_token(directory: Path) -> tuple[str, Path, bool]:
    """(token, file, created): the stored token, or a new one written with mode 0600."""
    path = directory / TOKEN_FILE
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, path, False
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"Cannot read the API token file {path} ({exc.strerror}).") from None
    token = secrets.token_urlsafe(32)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.tmp")
        # Created 0600 from the start: the secret is never readable by others, not even briefly.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
        os.chmod(tmp, 0o600)
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"Cannot write the API token file {path} ({exc.strerror}).") from None
    return token, path, True


def resolve_token(settings_token: str, directory: Path, host: str, no_token: bool) -> tuple[str | None, str]:
    """(token or None, one line saying where it came from) for `qvl-agent serve`."""
    if no_token:
        if not is_loopback(host):
            raise UsageError(f"--no-token is only allowed on a loopback address (127.0.0.1, ::1), not {host}.")
        return None, "No API token: anyone on this machine can use the server."
    if settings_token:
        return settings_token, "API token from QVL_API_TOKEN."
    token, path, created = load_or_create_token(directory)
    return token, f"API token {'created in' if created else 'read from'} {path} (mode 0600)."


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `Bearer <token>`, compared in constant time."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def token_matches(value: str | None, token: str) -> bool:
    return bool(value) and hmac.compare_digest(value.encode(), token.encode())
