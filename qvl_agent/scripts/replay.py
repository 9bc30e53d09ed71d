"""Running a saved Playwright script (exported by `browse --export`, or written by the model) in the sandbox.

`replay_script(path, ...)` is what `qvl-agent replay`, the tray and the MCP server call: the script runs
in the same bubblewrap sandbox as verification (`bubblewrap.run_sandboxed`) with

- **network** only to the origins its header names (`header.read_origins`), plus any the person adds
  (`allow`, from `--allow-domain`) and the origin of a `--url` passed through to the script; a script
  without our header (hand-written) gets none unless the person adds some;
- **files** it writes landing only in a NEW folder (`copy_back.keep_files`): never over an existing file,
  never a hidden, runnable or instruction file;
- **exit status** its own (None when the timeout ended it).

Nothing here parses flags or prints. `binds` and `init_hooks` pass straight to `run_sandboxed`, for
features built on replay (a channel into the sandbox, a hook inside it).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from qvl_agent.sandbox import bubblewrap, watchdog
from qvl_agent.sandbox.bubblewrap import Bind
from qvl_agent.sandbox.copy_back import keep_files
from qvl_agent.scripts.header import BadOrigin, check_origin, origin_of, page_file, read_origins
from qvl_agent.secrets import ENV_PREFIX


@dataclass(frozen=True)
class ReplayResult:
    returncode: int | None  # the script's exit status; None when the timeout ended it
    output: str  # the last bytes of its output
    origins: list[str]  # what it could reach
    folder: Path | None = None  # the new folder its files went to (None: it wrote none worth keeping)
    written: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # files it wrote that were not kept
    limit: str = ""  # why the sandbox ended it early ("it ran more than ...")
    header: bool = True  # False: the script carried no origins line (hand-written)


def default_output(script: Path) -> Path:
    """SCRIPT.out beside SCRIPT.py."""
    return script.with_name(script.stem + ".out")


def allowed_origins(host: str) -> list[str]:
    """The origins `--allow-domain HOST` adds: HOST as given when it is an origin (https://host:8443), else
    both http:// and https:// of HOST[:PORT]. Raises BadOrigin with one sentence."""
    if "://" in host:
        return [check_origin(host)]
    if "/" in host or "@" in host or not host.strip():
        raise BadOrigin(f"--allow-domain wants a host name (example.com) or an origin, not {host!r}.")
    return [check_origin(f"http://{host}"), check_origin(f"https://{host}")]


def secret_variables(source: str, environment: Mapping[str, str]) -> dict[str, str]:
    """The `QVL_SECRET_*` variables of `environment` that `source` reads as `os.environ["QVL_SECRET_X"]`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    wanted = {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
        and node.slice.value.startswith(ENV_PREFIX)
    }
    return {name: environment[name] for name in sorted(wanted) if name in environment}


def replay_script(
    script: Path,
    *,
    browser: str,
    timeout_s: float,
    output: Path | None = None,
    allow: Sequence[str] = (),
    url: str | None = None,
    memory_mb: int | None = None,
    binds: Sequence[Bind] = (),
    init_hooks: Sequence[Path] = (),
    secrets: Mapping[str, str] | None = None,
) -> ReplayResult:
    """Run `script` sandboxed; its files go to a new folder: `output` (FileExistsError when it exists) or,
    by default, the first free of SCRIPT.out, SCRIPT.out-2, ... `url` is passed to the script as `--url URL`
    (exported scripts take it) and its origin may be reached; a file:// `url` is shown inside read-only.

    `secrets` (the person's environment) supplies the `QVL_SECRET_*` variables the script reads: an
    exported script types a secret from its variable, and only the variables it names go inside.

    Raises OSError when the script cannot be read, BadOrigin for a bad `allow` or `url`, FileExistsError
    for an existing `output`, SandboxUnavailable when the sandbox cannot start."""
    source = script.read_text(encoding="utf-8")
    if output is not None and (output.exists() or output.is_symlink()):
        raise FileExistsError(f"{output} already exists.")
    recorded = read_origins(source)
    origins: list[str] = []
    extra = list(binds)
    for origin in recorded or []:  # a local page the script was made for is shown read-only, alone
        path = page_file(origin)
        if path is None:
            origins.append(origin)
        elif Path(path).is_file():
            extra.append(Bind(path, path))
    for host in allow:
        origins += allowed_origins(host)
    argv: list[str] = []
    if url is not None:
        target = urlsplit(url)
        if target.scheme == "file" and Path(target.path).is_file():
            extra.append(Bind(target.path, target.path))
        else:
            origins.append(origin_of(url))
        argv = ["--url", url]
    origins = list(dict.fromkeys(origins))
    result = bubblewrap.run_sandboxed(
        source,
        origins=origins,
        browser=browser,
        timeout_s=timeout_s,
        argv=argv,
        memory_bytes=(memory_mb << 20) if memory_mb else watchdog.MEMORY_BYTES,
        binds=extra,
        init_hooks=init_hooks,
        env=secret_variables(source, secrets or {}),
    )
    kept = keep_files(result.files, output or default_output(script), numbered=output is None)
    return ReplayResult(
        result.returncode, result.output, origins, kept.folder, kept.written, kept.refused, result.limit,
        header=recorded is not None,
    )  # fmt: skip
