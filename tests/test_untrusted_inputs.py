"""Numbers, text and settings files that someone else chose, through the real entry points (`python -m
qvl_agent ...` with its own HOME and config folder): an integer of hundreds or thousands of digits in a
model reply, in config.toml or in a `QVL_*` variable, and a lone surrogate in a reply, each get one
readable sentence and the right exit code, never a traceback; a config.toml that another user owns or
that others can write is not used (exit 2), since it could switch the engine to a remote URL or the
safety mode to auto."""

from __future__ import annotations

import json
import os
import stat
import struct

import pytest

from qvl_agent import config
from qvl_agent.scripts.write.policy import ScriptRejected, check_script
from tests.conftest import run_cli
from tests.test_desktop_e2e import call

HOSTILE_ENGINE = 'engine = "openai:http://203.0.113.7/v1"\nsafety_mode = "auto"\n'


@pytest.fixture()
def home(tmp_path):
    """An isolated person: HOME, XDG folders and the settings folder under tmp_path."""
    env = {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "home" / ".config"),
        "XDG_DATA_HOME": str(tmp_path / "home" / ".local" / "share"),
        "QVL_CONFIG_DIR": str(tmp_path / "config"),
    }
    (tmp_path / "config").mkdir()
    return env


def settings_file(env, text: str, mode: int = 0o600):
    path = config.config_path(env)
    path.write_text(text)
    path.chmod(mode)
    return path


def one_sentence_no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "Error:" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("qvl-agent: ") and lines[0].endswith("."), stderr


# --- integers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("1" + "0" * 4999, "at most 15 digits"),  # past Python's own 4,300-digit limit for int()
        ("1" + "0" * 399, "at most 15 digits"),  # would pass every minimum and fail deep in the engine
        ("2000000", "max_new_tokens must be at most 1,048,576"),
        ("²", "must be a whole number"),  # str.isdigit() says yes, int() says no
    ],
    ids=["5000 digits", "400 digits", "too many tokens", "superscript two"],
)
def test_an_impossible_max_new_tokens_variable_is_one_sentence_and_exit_2(home, value, said):
    done = run_cli("trace", "list", env={**home, "QVL_MAX_NEW_TOKENS": value})
    assert done.returncode == 2
    assert said in done.stderr and "QVL_MAX_NEW_TOKENS" in done.stderr
    one_sentence_no_traceback(done.stderr)


def test_a_5000_digit_integer_in_config_toml_leaves_the_file_out_with_one_notice(home):
    settings_file(home, "max_new_tokens = 1" + "0" * 4999 + "\n")
    done = run_cli("trace", "list", env=home)
    assert done.returncode == 0, done.stderr
    assert "is not valid TOML (a number has too many digits); defaults are used" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_400_digit_integer_in_config_toml_is_left_out_and_the_rest_kept(home):
    path = settings_file(home, "max_new_tokens = 1" + "0" * 399 + '\nmodel = "/models/mine"\n')
    loaded = config.load(path, env={})
    assert loaded.settings.max_new_tokens == config.Settings().max_new_tokens
    assert loaded.settings.model == "/models/mine"
    assert loaded.notices == (
        f"max_new_tokens must be a whole number of at most 15 digits, not one that long (in {path}). It is ignored.",
    )


def test_a_coordinate_of_hundreds_of_digits_in_a_reply_goes_back_to_the_model(home, tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<button>Go</button>")
    replies = tmp_path / "replies.json"
    huge = '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1' + "0" * 400
    replies.write_text(json.dumps([huge + ", 5]}}</tool_call>", call(action="terminate", status="success")]))
    done = run_cli(
        "browse", "--engine", f"replay:{replies}", "--url", page.as_uri(), "--trace-dir", str(tmp_path / "t"), "Go",
        env=home,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "coordinate x must be a finite number, not a number of about 401 digits." in done.stdout
    assert "Traceback" not in done.stderr + done.stdout


# --- lone surrogates ----------------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_reply_neither_ends_the_run_nor_reaches_the_trace_as_bad_utf8(home, tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<input aria-label=q>")
    replies = tmp_path / "replies.json"
    # As a remote server's JSON can send it: a raw lone surrogate in the reply text, and one in the call.
    replies.write_text(
        json.dumps(
            ["I see \ud800 here " + call(action="type", text="a\udfffb"), call(action="terminate", status="success")]
        )
    )
    trace = tmp_path / "t"
    done = run_cli("browse", "--engine", f"replay:{replies}", "--url", page.as_uri(), "--trace-dir", str(trace), "Type",
                   env=home)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    text = (trace / "trace.jsonl").read_bytes().decode("utf-8")  # strict: valid UTF-8 throughout
    replies_seen = [json.loads(line).get("reply", "") for line in text.splitlines()]
    assert "I see \ufffd here" in replies_seen[1]


def test_a_lone_surrogate_in_a_model_written_script_is_saved_as_text_not_a_traceback(home, tmp_path):
    replies = tmp_path / "replies.json"
    script = "```python\nfrom playwright.sync_api import sync_playwright\nprint('\ud800')\n```"
    replies.write_text(json.dumps([script]))
    page = tmp_path / "page.html"
    page.write_text("<p>hello</p>")
    out = tmp_path / "out.py"
    done = run_cli("playwright", "--engine", f"replay:{replies}", "--url", page.as_uri(), "--attempts", "1",
                   "-o", str(out), "Print", env=home)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "print('\ufffd')" in out.read_text(encoding="utf-8")


def test_the_policy_refuses_a_lone_surrogate_with_its_line_instead_of_crashing_in_ast_parse():
    with pytest.raises(ScriptRejected) as caught:
        check_script("from playwright.sync_api import sync_playwright\nx = '\udc80'\n")
    assert str(caught.value) == "Line 2: the script holds a lone surrogate ('\\udc80'), which is no character."


# --- whose settings file ------------------------------------------------------------------------------


def test_a_world_writable_settings_file_is_not_used_and_says_how_to_fix_it(home):
    path = settings_file(home, HOSTILE_ENGINE, 0o666)
    done = run_cli("trace", "list", env=home)
    assert done.returncode == 2
    assert f"The settings file {path} can be changed by other users (mode 0666)" in done.stderr
    assert f"chmod go-w {path}" in done.stderr
    one_sentence_no_traceback(done.stderr)


def test_a_settings_file_owned_by_another_user_is_not_used(home):
    path = settings_file(home, HOSTILE_ENGINE, 0o644)
    os.chown(path, 12345, 12345)
    done = run_cli("trace", "list", env=home)
    assert done.returncode == 2
    assert f"The settings file {path} belongs to another user (uid 12345)" in done.stderr
    one_sentence_no_traceback(done.stderr)


def test_a_group_writable_file_of_a_shared_group_is_refused_but_the_own_private_group_is_fine(home):
    path = settings_file(home, 'model = "/models/mine"\n', 0o664)
    os.chown(path, os.getuid(), os.getgid() + 12345)  # a group of other people
    with pytest.raises(config.ConfigError, match="can be changed by other users"):
        config.load(path, env={})
    os.chown(path, os.getuid(), os.getgid())
    if config._own_private_group(os.getgid()):
        assert config.load(path, env={}).settings.model == "/models/mine"


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX access ACL as the kernel stores it: version 2, then (tag, permissions, id) entries."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


ANY = 0xFFFFFFFF  # the id field of entries that name no one (owner, owning group, mask, other)


def test_a_settings_file_another_user_can_write_through_an_acl_is_not_used(home):
    """The mode shows 0664 with the person's own private group, which alone would be trusted; the ACL
    behind it lets user 12345 write the engine URL and the safety mode."""
    path = settings_file(home, HOSTILE_ENGINE, 0o664)
    os.chown(path, os.getuid(), os.getgid())
    os.setxattr(path, "system.posix_acl_access",
                _acl((0x01, 6, ANY), (0x02, 6, 12345), (0x04, 4, ANY), (0x10, 6, ANY), (0x20, 4, ANY)))  # fmt: skip
    assert stat.S_IMODE(path.stat().st_mode) == 0o664
    done = run_cli("trace", "list", env=home)
    assert done.returncode == 2
    assert f"The settings file {path} can be changed by user 12345 through its access control list" in done.stderr
    assert f"setfacl -b {path}" in done.stderr
    one_sentence_no_traceback(done.stderr)
    # A mask without write takes the named user's write away again: then the file is the person's alone.
    os.setxattr(path, "system.posix_acl_access",
                _acl((0x01, 6, ANY), (0x02, 6, 12345), (0x04, 4, ANY), (0x10, 4, ANY), (0x20, 4, ANY)))  # fmt: skip
    assert config.acl_writers(path) == ""


def test_the_owners_own_0644_file_is_used(home):
    path = settings_file(home, 'model = "/models/mine"\n', 0o644)
    assert config.load(path, env={}).settings.model == "/models/mine"


def test_saving_replaces_a_file_others_could_change_with_a_private_one(home):
    path = settings_file(home, HOSTILE_ENGINE, 0o666)
    old = os.umask(0)  # saving must not depend on the umask
    try:
        config.save(config.Settings(model="/models/mine"), path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert config.load(path, env={}).settings.engine == "local"
    assert [p.name for p in path.parent.iterdir() if ".bak-" in p.name]  # the old one kept beside, unused
