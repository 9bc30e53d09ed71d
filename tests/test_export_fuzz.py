"""Run data can never become code in an exported script: 10,000 random runs whose typed text, labels,
role names, keys, selectors, URLs, notes, task and file name mix line separators Python's tokenizer does
not split on (U+2028, U+0085, form feed), quotes, backslashes, lone surrogates, `{{…}}` placeholders,
control characters and code-looking payloads all compile to a script that parses, encodes as UTF-8, holds
only Playwright calls, `expect`, `re` and `os.environ["QVL_SECRET_…"]` reads in `replay()` and the
template's own code elsewhere, and types exactly what the run typed. Pure (no browser); seeded."""

from __future__ import annotations

import ast
import gc
import random
import re

import pytest

from qvl_agent.scripts.export.exporter import compile_run
from qvl_agent.scripts.export.gate import PLAYWRIGHT_ATTRS, UnsafeScript, check_export
from qvl_agent.scripts.literals import secrets_read_in
from qvl_agent.secrets import PLACEHOLDER, Secrets

ORIGIN = "http://127.0.0.1:8000"
DECLARED = Secrets({"PASSWORD": "pw", "A_1": "a1"})  # the run's --secret names; other `{{…}}` are text
PIECES = [
    "\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\x1c", "\x1e", "\r", "\n", "\r\n", "\x00", "\t", "\x1b[2J",
    "'", '"', '"""', "'''", "\\", "\\n", "\\u2028", "\\", "\ud800", "\udfff", "\ud83d", "\u202e", "\ufeff",
    "{{PASSWORD}}", "{{A_1}}", "{{", "}}", "{{ X }}", "{x}", "{title}", "{body}", "%s", "#", ";", "(", ")",
    "__import__('os').system('touch /tmp/qvl-pwned')", '");__import__("os").system("id");("', "os.environ",
    "é", "日本", "🙂", " ", "a", "Sign in", "0", "9", "&", "=", "?", "/", "%20", "+",
]  # fmt: skip


def rand_text(rng: random.Random, pieces: int = 6) -> str:
    return "".join(
        rng.choice(PIECES) if rng.random() < 0.7 else chr(rng.randrange(32, 0x3000))
        for _ in range(rng.randrange(pieces + 1))
    )


def random_run(rng: random.Random, units: int):
    """A run of `units` random steps groups: typing into a labelled field, a key on another kind of
    locator, a select, typing with no locator, a click on a role/name and a move to a random URL."""

    def step(kind, detail, url=ORIGIN + "/form"):
        return {"kind": kind, "ok": True, "detail": {"url": url, **detail}, "describe": rand_text(rng)}

    empty = {"tag": "input", "type": "", "value": ""}
    steps, fields, typed_texts = [], [], []
    for i in range(units):
        typed = rand_text(rng)
        field = {"kind": "label", "text": f"{rand_text(rng)}#{i}"}  # distinct fields: one fill each
        other = rng.choice(
            [
                {"kind": "placeholder", "text": rand_text(rng)},
                {"kind": "testid", "value": rand_text(rng)},
                {"kind": "text", "text": rand_text(rng)},
                {"kind": "css", "selector": rand_text(rng)},
            ]
        )
        name = rand_text(rng)
        select = {"tag": "select", "type": "", "value": "x", "label": rand_text(rng)}
        url = rng.choice(
            [
                f"{ORIGIN}/{rand_text(rng)}?q={rand_text(rng)}&pw={{{{PASSWORD}}}}#{rand_text(rng, 2)}",
                f"https://{rand_text(rng, 2)}.example/{rand_text(rng)}?{rand_text(rng)}",
                f"{ORIGIN}/{rand_text(rng)}",
            ]
        )
        steps += [
            step("left_click", {"locator": field, "before": empty, "after": empty, "pixels": [[5, 5]]}),
            {**step("type", {"locator": field, "before": empty, "after": {**empty, "value": typed}, "text": typed}),
             "typed": DECLARED.segments(typed)},
            step("key", {"locator": other, "before": {"tag": "div"}, "after": None, "keys": rand_text(rng, 2)}),
            step("left_click", {"locator": {"kind": "role", "role": rand_text(rng, 2) or "button", "name": name},
                                "before": {"tag": "button"}, "after": {"tag": "button"},
                                "pixels": [[rng.randrange(2000), rng.randrange(2000)]]}),
            step("left_click", {"locator": {"kind": "point"}, "pixels": [[1, 2]]}, url),
        ]  # fmt: skip
        if i % 5 == 0:  # the rarer step kinds, with random labels and text too
            steps += [
                step("left_click", {"locator": {"kind": "role", "role": "combobox", "name": f"{name}#{i}"},
                                    "before": {**select, "value": "a"}, "after": select, "pixels": [[3, 4]]}),
                step("type", {"locator": {"kind": "point"}, "text": rand_text(rng)}),
            ]  # fmt: skip
        fields.append({"locator": field, "state": {**empty, "value": typed}})
        typed_texts.append(typed)
    final = {
        "url": rng.choice([steps[-1]["detail"]["url"], ORIGIN + "/done"]),
        "fields": fields,
        "new_text": [rand_text(rng), rand_text(rng) + "12"],
    }
    return steps, final, typed_texts


ALLOWED_NAMES = {"page", "popup", "tabs", "origin", "expect", "re", "os"}
CALLED = PLAYWRIGHT_ATTRS | {"expect", "compile", "escape"}


def check_replay_body(function: ast.FunctionDef) -> list[ast.Call]:
    """An independent look at replay(): which names, calls and attributes it holds (one pass: a parent
    is visited before its children). Returns its `fill` calls."""
    environ, fills = set(), []
    for node in ast.walk(function):
        if isinstance(node, ast.Name):
            assert node.id in ALLOWED_NAMES, node.id
            assert node.id != "os" or id(node) in environ
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr
            assert called in CALLED, called
            if called == "fill":
                fills.append(node)
            if called in ("compile", "escape"):
                assert isinstance(func.value, ast.Name) and func.value.id == "re"
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            assert node.value.attr == "environ" and node.value.value.id == "os"
            assert node.slice.value.startswith("QVL_SECRET_")
            environ.add(id(node.value.value))
        elif isinstance(node, ast.Attribute):
            assert node.attr in PLAYWRIGHT_ATTRS | {"compile", "escape"} or id(node.value) in environ, node.attr
        elif isinstance(node, ast.Lambda | ast.NamedExpr | ast.Starred | ast.JoinedStr | ast.Import):
            raise AssertionError(type(node).__name__)
    return fills


def value_of(node: ast.expr) -> str:
    """A literal or a sum of literals and secret reads, as the replay would see it (secrets as <ENV>)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp):
        return value_of(node.left) + value_of(node.right)
    assert isinstance(node, ast.Subscript)
    return f"<{node.slice.value}>"


RUNS, UNITS = 250, 40  # 10,000 random typed texts, labels, role names, keys, selectors and URLs


@pytest.fixture
def older_objects_frozen():
    """The 500 parses make millions of short-lived syntax-tree nodes, and each full pass of the garbage
    collector they set off would also walk every object the worker already holds (hundreds of thousands
    once a test before this one imported torch): those are frozen for this test, which made it about 45 %
    cheaper in such a worker. What the test itself makes is collected as usual."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.slow
@pytest.mark.usefixtures("older_objects_frozen")
def test_ten_thousand_random_values_export_scripts_that_hold_only_the_calls_the_exporter_writes():
    rng = random.Random(20261203)
    benign = ast.parse(compile_run(ORIGIN + "/form", [], task="x").source)
    fixed = {i: ast.dump(node) for i, node in enumerate(benign.body)}
    for _ in range(RUNS):
        steps, final, typed = random_run(rng, UNITS)
        compiled = compile_run(
            ORIGIN + "/" + rand_text(rng), steps, final, task=rand_text(rng, 10), filename=rand_text(rng)
        )  # raises UnsafeScript if the gate caught anything: the builder let something through
        source = compiled.source
        source.encode("utf-8")  # no lone surrogate reaches the file
        tree = ast.parse(source)  # it compiles
        assert len(tree.body) == len(benign.body)
        for i, node in enumerate(tree.body):
            if isinstance(node, ast.FunctionDef) and node.name == "replay":
                fills = check_replay_body(node)
            elif i == 0:
                assert isinstance(node.value, ast.Constant)  # the docstring stays a plain string
            elif isinstance(node, ast.Assign) and node.targets[0].id == "START_URL":
                assert isinstance(node.value, ast.Constant)
            elif isinstance(node, ast.Assign) and node.targets[0].id == "SECRETS":
                # the variables the steps type from: names of declared secrets, nothing else
                names = [value_of(item) for item in node.value.elts]
                assert names == secrets_read_in(tree)  # exactly those the steps read, no other name (parsed once)
            elif isinstance(node, ast.Assign) and node.targets[0].id == "START_DIALOGS":
                assert ast.literal_eval(node.value) == []  # no dialog in these runs
            else:
                assert ast.dump(node) == fixed[i]
        secret = PLACEHOLDER.pattern.replace("[A-Za-z_][A-Za-z0-9_]*", "|".join(DECLARED.values))
        expected = [re.sub(secret, lambda m: f"<QVL_SECRET_{m[1]}>", text) for text in typed]
        assert [value_of(n.args[0]) for n in fills] == expected  # typed exactly, secrets from the environment
        assert all("\n" not in note and "\u2028" not in note for note in compiled.unexpressed)
        # Every line of the file is one logical line as any tool splits it: nothing hides in a separator.
        assert len(source.splitlines()) == source.count("\n")


def test_the_gate_refuses_code_the_exporter_does_not_write():
    good = compile_run(ORIGIN + "/form", [], task="x").source
    reference = compile_run(ORIGIN + "/", [], task="").source
    check_export(good, reference)
    for evil in (
        "    __import__('os').system('id')",
        "    page.evaluate('1')",
        "    os.system('id')",
        "    page.click.__globals__",
        "    os.environ['HOME'].fill('x')",
        "    page.fill(os.environ['PATH'])",
        "    import os",
        "    page.fill(*x)",
        "    (lambda: 0)()",
    ):
        bad = good.replace("def replay(page, origin):\n", "def replay(page, origin):\n" + evil + "\n", 1)
        assert bad != good
        with pytest.raises(UnsafeScript, match="not written"):
            check_export(bad, reference)
    with pytest.raises(UnsafeScript):
        check_export(good.replace("import re\n", "import re\nimport subprocess\n"), reference)
    with pytest.raises(UnsafeScript):
        check_export(good.replace("START_URL = ", "START_URL = __import__('os').getcwd() or "), reference)
