"""The base URL of an OpenAI-compatible server, as `--engine openai:URL` names it. Its own module so a
command can check the URL in a moment, before the `openai` client (or a port, or a model) is touched."""

from __future__ import annotations

from qvl_agent.errors import RemoteEngineError


def normalize_url(url: str) -> str:
    """The API base ending in /v1: `http://host:8000`, `.../v1` and `.../v1/` all name the same server."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise RemoteEngineError(f"--engine openai:URL needs an http:// or https:// URL, not {url!r}.")
    return url if url.endswith("/v1") else url + "/v1"
