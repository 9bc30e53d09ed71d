"""Running a saved Playwright script (exported by `browse --export`, or written by the model) in the sandbox.

`replay_script(path, ...)` is what `qvl-agent replay`, the tray and the MCP server call: the script runs
in the same bubblewrap sandbox as verification (`bubblewrap.run_sandboxed`) with

- **network** only to the origins its header names (`header.read_origins`), plus any the person adds
  (`allow`, from `--allow-domain`) and the origin of a `--url` passed through to the script; a script
  without our header (hand-written) gets none unless the person adds some;
- **host files** only those the person gives (`allow_files`, from `--allow-file`, and a file:// `--url`),
  read-only: a local page the header names is refused until the person gives it, since anyone who wrote
  the script wrote its header too;
- **secret variables** only the `QVL_SECRET_*` ones the script reads;
- **files** it writes landing only in a NEW folder (`copy_back.keep_files`): never over an existing file,
  never a hidden, runnable or instruction file;
- **exit status** its own (None when the timeout ended it);
- **Playwright's trace** of every browser context it makes, `trace.zip` among its files
  (`sandbox/trace_in_sandbox.py`), unless it types a secret: the trace's page snapshots would hold it.

These, and which limits hold its memory, are the `Grant`, handed to `before_start` before the script
starts (the command prints it).
Nothing here parses flags or prints. `binds` and `init_hooks` pass straight to `run_sandboxed`, for
features built on replay (a channel into the sandbox, a hook inside it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from qvl_agent.errors import UsageError
from qvl_agent.sandbox import bubblewrap, watchdog
from qvl_agent.sandbox.bubblewrap import Bind
from qvl_agent.sandbox.cgroup import enforcement
from qvl_agent.sandbox.copy_back import keep_files
from qvl_agent.scripts.header import BadOrigin, check_origin, origin_of, page_file, read_origins
from qvl_agent.scripts.literals import read_secrets


@dataclass(frozen=True)
class Grant:
    """What a replayed script is given, said to the person before it starts."""

    origins: list[str]  # the network it reaches
    files: list[str]  # host files shown inside, read-only
    secrets: list[str]  # the secret variables passed in (names, never values)
    limits: str = ""  # what holds its memory and processes (`cgroup.enforcement`)
    trace: str = ""  # whether Playwright's trace is kept, and why not

    def lines(self) -> list[str]:
        return [
            *([f"limits: {self.limits}"] if self.limits else []),
            "network: " + (" ".join(self.origins) or "none"),
            "host files (read-only): " + (" ".join(self.files) or "none"),
            "secret variables: " + (" ".join(self.secrets) or "none"),
            *([f"playwright trace: {self.trace}"] if self.trace else []),
        ]


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
    grant: Grant | None = None


TRACE_HOOK = Path(__file__).resolve().parent.parent / "sandbox" / "trace_in_sandbox.py"
TRACE_FILE = "trace.zip"


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
    return {name: environment[name] for name in read_secrets(source) if name in environment}


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
    allow_files: Sequence[str] = (),
    before_start: Callable[[Grant], None] | None = None,
    playwright_trace: bool = True,
    step_timeout_s: float | None = None,
) -> ReplayResult:
    """Run `script` sandboxed; its files go to a new folder: `output` (FileExistsError when it exists) or,
        by default, the first free of SCRIPT.out, SCRIPT.out-2, ... `url` is passed to the script as `--url URL`
        (exported scripts take it) and its origin may be reached; a file:// `url` is shown inside read-only.
    `step_timeout_s` is passed as `--timeout SECONDS`, how long each step of an exported script waits.

        `secrets` (the person's environment) supplies the `QVL_SECRET_*` variables the script reads: an
        exported script types a secret from its variable, and only the variables it names go inside.

        `allow_files` are host files the person gives the script (shown inside read-only, each alone); a local
        page its header names must be among them.

        `playwright_trace`: Playwright's trace of the run comes back as `trace.zip` among its files, unless the
        script reads a secret variable (its page snapshots would hold the typed value).

        Raises OSError when the script cannot be read, BadOrigin for a bad `allow` or `url`, UsageError for a
        header file the person did not give or a given path that is not a file, FileExistsError for an
        existing `output`, SandboxUnavailable when the sandbox cannot start."""
    source = script.read_text(encoding="utf-8")
    if output is not None and (output.exists() or output.is_symlink()):
        raise FileExistsError(f"{output} already exists.")
    files = _given_files(allow_files)
    recorded = read_origins(source)
    origins: list[str] = []
    for origin in recorded or []:
        path = page_file(origin)
        if path is None:
            origins.append(origin)
        elif str(Path(path).resolve()) not in files:
            raise UsageError(
                f"The script's header asks for the host file {path}; give it with --allow-file {path} "
                "if this script may read it."
            )
    for host in allow:
        origins += allowed_origins(host)
    argv: list[str] = []
    if url is not None:
        target = urlsplit(url)
        if target.scheme == "file" and Path(target.path).is_file():
            files.setdefault(str(Path(target.path).resolve()), target.path)
        else:
            origins.append(origin_of(url))
        argv = ["--url", url]
    if step_timeout_s is not None:
        argv += ["--timeout", f"{step_timeout_s:g}"]
    origins = list(dict.fromkeys(origins))
    env = secret_variables(source, secrets or {})
    missing = [name for name in read_secrets(source) if name not in env]
    if missing:
        raise UsageError(
            f"The script types a secret from ${missing[0]}, which is not set: set it first "
            f"(export {missing[0]}=...); replay passes it to this script alone."
        )
    # Bound where the script names them (the path as given) and where they really are.
    extra = [*binds, *(Bind(real, named) for real, named in files.items())]
    extra += [Bind(real, real) for real, named in files.items() if real != named]
    memory_bytes = (memory_mb << 20) if memory_mb else watchdog.MEMORY_BYTES
    limits = f"{memory_bytes >> 20} MB of memory; {enforcement(memory_bytes, watchdog.TASKS)}"
    hooks = list(init_hooks)
    trace = ""
    if playwright_trace and env:
        trace = f"none: the script types a secret, which the page snapshots of {TRACE_FILE} would hold"
    elif playwright_trace:
        hooks.insert(0, TRACE_HOOK)
        trace = f"{TRACE_FILE} among its files (playwright show-trace opens it)"
    grant = Grant(origins, sorted(files), sorted(env), limits, trace)
    if before_start is not None:
        before_start(grant)
    result = bubblewrap.run_sandboxed(
        source,
        origins=origins,
        browser=browser,
        timeout_s=timeout_s,
        argv=argv,
        memory_bytes=memory_bytes,
        binds=extra,
        init_hooks=hooks,
        env={**env, "QVL_REPLAY_FAILURE_DIR": "/scratch"},  # where an exported script leaves a failure's log
    )
    kept = keep_files(result.files, output or default_output(script), numbered=output is None)
    return ReplayResult(
        result.returncode, result.output, origins, kept.folder, kept.written, kept.refused, result.limit,
        header=recorded is not None, grant=grant,
    )  # fmt: skip


def _given_files(paths: Sequence[str]) -> dict[str, str]:
    """{real path: the path as given} of the files the person gives; UsageError for anything else."""
    given: dict[str, str] = {}
    for path in paths:
        real = Path(path).resolve()
        if not real.is_file():
            raise UsageError(f"--allow-file wants a file that exists, not {path!r}.")
        given[str(real)] = str(Path(path).absolute())
    return given
