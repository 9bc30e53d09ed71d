"""The script policy's tables: which modules and members a model-written script may use, and the names,
attributes and keyword arguments it may not. Data only; `policy.py` walks the script against them."""

from __future__ import annotations

from qvl_agent.playwright.flags import SAFE_CHROMIUM_ARGS

# module -> the attributes a script may use on it (None: any public attribute). Explicit lists, because
# modules hold other modules (re.enum.sys, json.decoder.re, datetime.sys) that lead to os.
ALLOWED_MODULES: dict[str, frozenset[str] | None] = {
    "playwright.sync_api": frozenset(
        {
            "sync_playwright",
            "expect",
            "Error",
            "TimeoutError",
            "Playwright",
            "Browser",
            "BrowserContext",
            "BrowserType",
            "Page",
            "Frame",
            "FrameLocator",
            "Locator",
            "ElementHandle",
            "JSHandle",
            "Keyboard",
            "Mouse",
            "Touchscreen",
            "Dialog",
            "Download",
            "Request",
            "Response",
            "Route",
            "WebSocket",
            "ConsoleMessage",
            "Worker",
            "APIRequest",
            "APIRequestContext",
            "APIResponse",
            "ViewportSize",
            "Position",
            "FloatRect",
            "Geolocation",
            "HttpCredentials",
            "ProxySettings",
            "Cookie",
            "FormData",
        }
    ),  # fmt: skip
    "re": frozenset(
        {
            "compile",
            "search",
            "match",
            "fullmatch",
            "findall",
            "finditer",
            "sub",
            "subn",
            "split",
            "escape",
            "error",
            "Pattern",
            "Match",
            "A",
            "ASCII",
            "I",
            "IGNORECASE",
            "M",
            "MULTILINE",
            "S",
            "DOTALL",
            "X",
            "VERBOSE",
            "U",
            "UNICODE",
            "NOFLAG",
        }
    ),  # fmt: skip
    "time": frozenset({"time", "time_ns", "monotonic", "perf_counter", "sleep", "strftime", "localtime", "gmtime"}),
    "json": frozenset({"loads", "dumps", "JSONDecodeError"}),
    "math": None,  # a C module of numbers and functions only
    "string": frozenset(
        {
            "ascii_letters",
            "ascii_lowercase",
            "ascii_uppercase",
            "digits",
            "hexdigits",
            "octdigits",
            "punctuation",
            "printable",
            "whitespace",
            "capwords",
            "Template",
        }
    ),  # fmt: skip (Formatter is left out: its get_field reaches any attribute, dunders included)
    "datetime": frozenset({"datetime", "date", "time", "timedelta", "timezone", "MINYEAR", "MAXYEAR", "UTC"}),
    "collections": frozenset({"Counter", "OrderedDict", "defaultdict", "deque", "namedtuple", "ChainMap"}),
    "argparse": frozenset({"ArgumentParser", "SUPPRESS", "REMAINDER", "ArgumentTypeError", "ArgumentError"}),
    "sys": frozenset({"argv", "exit", "stdout", "stderr", "version_info", "platform"}),
    "os": frozenset({"environ", "getenv"}),
}
# Names that may be used as module.name but not imported bare: they must stay recognisable to the checks
# below (os.environ is only read, sys.argv only indexed, since `parse_args()` reads it).
NOT_FROM_IMPORTABLE = frozenset({("os", "environ"), ("sys", "argv")})

FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
        "memoryview",
        "help",
        "__builtins__",
        "__loader__",
        "__spec__",
        "classmethod",
        "staticmethod",
        "super",
        "type",
        "object",
        "open",  # scripts read no files: what they read could leave through page.goto
        "license",
        "credits",
        "copyright",
    }
)

# Playwright methods that write files, read arbitrary local files into the page, or reach beyond the
# fresh browser the runner starts.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "save_as",
        "set_input_files",
        "launch_persistent_context",
        "connect",
        "connect_over_cdp",
        "launch_server",
        "expose_binding",
        "expose_function",
        "route_from_har",
        "storage_state",
        "start_chunk",
        "stop_chunk",
        "write_text",
        "write_bytes",
        "unlink",
        "rmdir",
        "mkdir",
        "system",
        "popen",
        "spawn",
        "FileType",
        "read_text",
        "read_bytes",
        "register",  # argparse's type registry would rewrite every argument, --browser included
        "new_cdp_session",
        "new_browser_cdp_session",
        "set_files",  # FileChooser.set_files uploads local files
        "convert_arg_line_to_args",  # argparse's reader of argument files
    }
)

# Frames and code objects: gi_frame.f_builtins["eval"] reaches eval without naming it.
INTERNAL_ATTRIBUTES = frozenset(
    {
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "f_code",
        "tb_frame",
        "tb_next",
    }
)

# Keyword arguments that make Playwright write files or run other programs.
FORBIDDEN_KEYWORDS = frozenset(
    {
        "path",
        "ignore_default_args",
        "env",
        "downloads_path",
        "traces_dir",
        "record_video_dir",
        "record_har_path",
        "user_data_dir",
        "firefox_user_prefs",
        "artifacts_dir",
        "storage_state",  # new_context(storage_state="file.json") reads a file
        "client_certificates",  # reads certificate and key files
        "proxy",  # sends the browser's traffic elsewhere
        # argparse options that read files or set the --browser value behind the script's back
        "fromfile_prefix_chars",
        "prefix_chars",
        "argument_default",
        "namespace",
    }
)

# Chromium flags that run other programs or load code; refused in any string, wherever it may end up.
DANGEROUS_FLAG_PARTS = ("cmd-prefix", "-launcher", "subprocess-path", "load-extension", "remote-debugging")

SAFE_BROWSER_ARGS = SAFE_CHROMIUM_ARGS
BROWSER_VARIABLE = "QVL_BROWSER"  # the one environment variable executable_path may come from

# What ArgumentParser() may be given; the rest (fromfile_prefix_chars, parents, ...) reads files or options.
PARSER_KEYWORDS = ("prog", "usage", "description", "epilog", "add_help", "allow_abbrev", "exit_on_error")

# page.request's methods: `.request` is usable only as page.request.get(...) and the like, never kept or
# asked for new_context() (a client with its own storage state, proxy and certificates).
REQUEST_METHODS = frozenset({"get", "post", "put", "patch", "delete", "head", "fetch"})
