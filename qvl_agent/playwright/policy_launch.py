"""The script policy's rules on how the browser starts (`policy.py` applies them while it walks a script).

A model-written script may launch only the Chromium the person chose and only with flags that turn things
off: `executable_path` must come from the `QVL_BROWSER` environment variable, the parsed `--browser`
argument or None; `args=` must be a literal list of `SAFE_BROWSER_ARGS` (or a name bound once to one and
read nowhere but as `launch(args=...)`); an `add_argument` for `--browser` may set nothing that could
change where its value comes from. Works on the syntax tree only, through the script's `Bindings`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from qvl_agent.playwright.bindings import Bindings
from qvl_agent.playwright.policy_rules import BROWSER_VARIABLE, SAFE_BROWSER_ARGS


class LaunchRules:
    """The launch checks for one script; `fail(node, reason)` raises the policy's rejection."""

    def __init__(self, names: Bindings, fail: Callable[[ast.AST, str], None]) -> None:
        self.names = names
        self.fail = fail

    def check_executable_path(self, node: ast.Call, value: ast.expr) -> None:
        if not self.is_browser_source(value, set()):
            self.fail(
                node,
                "executable_path must come from --browser or QVL_BROWSER: os.environ['QVL_BROWSER'], "
                "os.environ.get('QVL_BROWSER'), os.getenv('QVL_BROWSER'), the parsed --browser argument or None",
            )

    def check_args(self, node: ast.Call, value: ast.expr) -> None:
        # Flags such as --renderer-cmd-prefix make Chromium run any program: only known-safe ones pass. A name
        # counts only when bound once to such a list and read nowhere but as args= of a .launch() call, with
        # no `launch` of the script's own: then no dict, parameter or alias can reach the list to change it.
        if isinstance(value, ast.Name):
            bound = self.names.value(value.id)
            loads = self.names.loads.get(value.id, [])
            only_launch = all(self._is_launch_args(load) for load in loads)
            if bound is not None and _is_safe_arg_list(bound) and only_launch and not self._own_launch():
                return
        elif _is_safe_arg_list(value):
            return
        allowed = " ".join(SAFE_BROWSER_ARGS)
        self.fail(
            node,
            "args= may only be a literal list of these browser flags, or a name set once to one and used "
            f"nowhere but as launch(args=...): {allowed}",
        )

    def _is_launch_args(self, load: ast.Name) -> bool:
        kw = self.names.parents.get(load)
        call = self.names.parents.get(kw) if isinstance(kw, ast.keyword) else None
        return (
            isinstance(kw, ast.keyword)
            and kw.arg == "args"
            and isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "launch"
        )

    def _own_launch(self) -> bool:
        """Whether the script defines a `launch` of its own, which a launch(args=NAME) call could reach."""
        if "launch" in self.names.bound:
            return True
        return any(
            isinstance(node, ast.Attribute) and node.attr == "launch" and not isinstance(node.ctx, ast.Load)
            for node in self.names.parents
        )

    def check_add_argument(self, node: ast.Call) -> None:
        if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
            self.fail(node, "add_argument() takes plain option names such as '--url'")
        dests = {a.value.lstrip("-").replace("-", "_") for a in node.args}
        if "browser" not in dests:
            return
        for kw in node.keywords:
            if kw.arg not in ("default", "help", "metavar", "required"):
                self.fail(node, f"the --browser argument may not set {kw.arg}=")
            if kw.arg == "default" and not self.is_browser_source(kw.value, set()):
                self.fail(node, "the --browser argument's default may only be os.environ.get(...) or None")

    def is_browser_source(self, value: ast.expr, seen: set[str]) -> bool:
        """Whether `value` is a browser path the person chose: the environment, --browser, or None."""
        names = self.names
        if isinstance(value, ast.Constant):
            return value.value is None
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
            return all(self.is_browser_source(v, seen) for v in value.values)
        if isinstance(value, ast.Subscript):
            return names.is_member(value.value, "os", "environ") and _is_browser_variable(value.slice)
        if isinstance(value, ast.Call):
            func = value.func
            reader = names.is_member(func, "os", "getenv") or (
                isinstance(func, ast.Attribute) and func.attr == "get" and names.is_member(func.value, "os", "environ")
            )
            return (
                reader
                and not value.keywords
                and 1 <= len(value.args) <= 2
                and _is_browser_variable(value.args[0])
                and all(self.is_browser_source(a, seen) for a in value.args[1:])
            )
        if isinstance(value, ast.Attribute) and value.attr == "browser" and isinstance(value.value, ast.Name):
            return self._is_parsed_arguments(value.value.id)
        if isinstance(value, ast.Name) and value.id not in seen:
            bound = names.value(value.id)
            return bound is not None and self.is_browser_source(bound, seen | {value.id})
        return False

    def _is_parsed_arguments(self, name: str) -> bool:
        """`name = parser.parse_args()`, bound once, with `parser = argparse.ArgumentParser(...)` bound once,
        neither passed on nor written through (so --browser holds what the command line or default says)."""
        names = self.names
        call = names.value(name)
        if not (
            isinstance(call, ast.Call)
            and not call.args
            and not call.keywords
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "parse_args"
            and isinstance(call.func.value, ast.Name)
        ):
            return False
        parser = call.func.value.id
        made = names.value(parser)
        return (
            isinstance(made, ast.Call)
            and names.is_member(made.func, "argparse", "ArgumentParser")
            and names.only_attribute_loads(parser)
            and names.only_attribute_loads(name)
        )


def _is_browser_variable(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == BROWSER_VARIABLE


def _is_safe_arg_list(value: ast.expr) -> bool:
    return isinstance(value, ast.List | ast.Tuple) and all(
        isinstance(item, ast.Constant) and item.value in SAFE_BROWSER_ARGS for item in value.elts
    )
