"""Settings files as people write them: a typo costs only the bad key, nothing on disk is moved, every
problem is one sentence naming the key, and types are strict."""

from __future__ import annotations

import os
import stat
import tomllib

import pytest

from qvl_agent import config
from qvl_agent.config import Hotkeys, Settings
from qvl_agent.errors import ConfigError
from tests.conftest import run_cli


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir()
    return path


def load_text(path, text: str):
    path.write_text(text, encoding="utf-8")
    return config.load(path, env={})


def test_one_typo_rejects_only_that_key_and_keeps_the_rest(path):
    text = 'model = "/models/qwen"\nmax_new_tokenz = 64\nmax_pixels = 2073600\n[hotkeys]\nask = "<ctrl>+<shift>+a"\n'
    loaded = load_text(path, text)
    assert loaded.settings.model == "/models/qwen"
    assert loaded.settings.max_pixels == 2_073_600
    assert loaded.settings.hotkeys.ask == "<ctrl>+<shift>+a"
    assert loaded.settings.max_new_tokens == Settings().max_new_tokens
    assert len(loaded.notices) == 1 and "'max_new_tokenz'" in loaded.notices[0]
    assert path.read_text(encoding="utf-8") == text  # a read never changes the file
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.toml"]


@pytest.mark.parametrize(
    "line, key, words",
    [
        ("max_pixels = inf", "max_pixels", "whole number, not inf"),
        ("max_pixels = true", "max_pixels", "whole number, not True"),
        ("max_new_tokens = 3.9", "max_new_tokens", "whole number, not 3.9"),
        ('max_new_tokens = "64"', "max_new_tokens", "whole number"),
        ("max_pixels = 10", "max_pixels", "at least 65536"),
        ("feature_cache_mb = -1", "feature_cache_mb", "cannot be negative"),
        ("device = 7", "device", "must be text"),
        ('device = "tpu"', "device", "mps"),
        ("[model]\nname = 'x'", "model", "must be text, not a table"),
        ("[max_pixels]\nvalue = 1", "max_pixels", "whole number, not a table"),
        ('safety_mode = ["auto"]', "safety_mode", "not a list"),
        ('[hotkeys]\nstop = ""', "stop", "hotkey is empty"),
        ('[hotkeys]\nstop = "<ctrl>+<alt>+<nope>"', "stop", "unknown key"),
        ("[hotkeys.stop]\nkey = 'q'", "stop", "must be text"),
        ('[hotkeys]\nask = "<ctrl>+<alt>+<esc>"', "ask", "all be different"),
        ("hotkeys = 3", "hotkeys", "must be a table"),
        ("max_actions_per_reply = 0", "max_actions_per_reply", "at least 1"),
    ],
)
def test_each_bad_value_is_one_sentence_naming_its_key_and_the_default_stays(path, line, key, words):
    loaded = load_text(path, line + "\n")
    assert loaded.settings == Settings()
    assert len(loaded.notices) == 1
    notice = loaded.notices[0]
    assert key in notice and words in notice and str(path) in notice
    assert notice.count(". ") <= 1 and "Traceback" not in notice  # one sentence (plus "It is ignored.")


def test_the_stop_hotkey_can_never_be_switched_off_by_the_file(path):
    loaded = load_text(path, '[hotkeys]\nstop = ""\nask = "<ctrl>+<shift>+a"\n')
    assert loaded.settings.hotkeys == Hotkeys(ask="<ctrl>+<shift>+a")
    assert loaded.settings.hotkeys.stop == "<ctrl>+<alt>+<esc>"
    with pytest.raises(ConfigError, match="stop hotkey is empty"):
        Settings(hotkeys=Hotkeys(stop="")).validated()


@pytest.mark.parametrize("kind", ["folder", "unreadable", "not toml", "not utf-8"])
def test_a_file_that_cannot_be_read_gives_one_notice_and_defaults(path, kind):
    if kind == "folder":
        path.mkdir()
    elif kind == "unreadable":
        path.write_text("max_new_tokens = 64\n")
        path.chmod(0)
        if os.access(path, os.R_OK):  # root reads anything: make it unreadable another way
            path.unlink()
            path.symlink_to(path)  # a link loop cannot be read by anyone
    elif kind == "not toml":
        path.write_text("[hotkeys\nask = ")
    else:
        path.write_bytes(b"model = '\xff'\n")
    before = len(config.NOTICES)
    loaded = config.load(path, env={})
    assert loaded.settings == Settings()
    assert len(loaded.notices) == 1 and str(path) in loaded.notices[0]
    assert "defaults are used" in loaded.notices[0]
    assert config.NOTICES[before:] == list(loaded.notices)  # the tray shows them as notifications


@pytest.mark.parametrize("kind", ["named pipe", "endless device", "huge", "nested arrays", "nested tables"])
def test_a_settings_path_that_would_hang_or_exhaust_the_start_is_one_notice(path, kind):
    if kind == "named pipe":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif kind == "endless device":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        path.write_text("# " + "x" * (8 << 20) + "\n")
    elif kind == "nested arrays":
        path.write_text("max_pixels = " + "[" * 100_000 + "]" * 100_000 + "\n")
    else:
        path.write_text("a = " + "{b = " * 5000 + "1" + "}" * 5000 + "\n")
    loaded = config.load(path, env={})
    assert loaded.settings == Settings()
    assert len(loaded.notices) == 1 and str(path) in loaded.notices[0] and "defaults are used" in loaded.notices[0]


def test_saving_keeps_a_copy_of_a_file_whose_keys_were_left_out(path):
    path.write_text("max_pixles = 1000000\nmax_new_tokens = 77\n")  # a typo the person will want to fix
    config.save(Settings(max_new_tokens=88), path)
    backups = list(path.parent.glob("config.toml.bak-*"))
    assert len(backups) == 1 and "max_pixles = 1000000" in backups[0].read_text()
    assert config.load(path, env={}).settings.max_new_tokens == 88


def test_a_corrupt_file_in_a_read_only_folder_is_left_alone(path):
    path.write_text("max_pixels = [oops\n")
    path.parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        loaded = config.load(path, env={})
        assert loaded.settings == Settings() and "not valid TOML" in loaded.notice
        assert path.read_text() == "max_pixels = [oops\n"
    finally:
        path.parent.chmod(0o700)


def test_environment_variables_are_strict(path):
    assert config.load(path, env={"QVL_MAX_NEW_TOKENS": "64"}).settings.max_new_tokens == 64
    for bad in ("3.9", "true", "inf", "lots"):
        with pytest.raises(ConfigError, match=r"max_new_tokens in \$QVL_MAX_NEW_TOKENS must be a whole number"):
            config.load(path, env={"QVL_MAX_NEW_TOKENS": bad})
    with pytest.raises(ConfigError, match="cuda:N or mps"):
        config.load(path, env={"QVL_DEVICE": "tpu"})
    assert config.load(path, env={"QVL_DEVICE": "mps"}).settings.device == "mps"


def test_save_writes_toml_that_loads_back_and_keeps_a_corrupt_file_beside(path):
    path.write_text("max_pixels = [oops\n")
    wanted = Settings(model='C:\\models\\"qwen"\n', max_new_tokens=99, hotkeys=Hotkeys(ask="<ctrl>+<shift>+a"))
    config.save(wanted, path)
    assert tomllib.loads(path.read_text())["hotkeys"]["ask"] == "<ctrl>+<shift>+a"
    assert config.load(path, env={}).settings == wanted
    backups = list(path.parent.glob("config.toml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == "max_pixels = [oops\n"
    assert "api_token" not in path.read_text() and "api_key" not in path.read_text()


def test_save_into_an_unwritable_folder_is_one_sentence(path):
    path.parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(path.parent, os.W_OK):
            target = path.parent / "plain-file" / "config.toml"  # root writes anywhere: a file as the folder
            path.parent.chmod(0o700)
            (path.parent / "plain-file").write_text("")
        else:
            target = path
        with pytest.raises(ConfigError, match="The settings cannot be saved to"):
            config.save(Settings(), target)
    finally:
        path.parent.chmod(0o700)


def test_the_cli_prints_each_notice_once_and_keeps_working(tmp_path):
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    (config_dir / "config.toml").write_text("max_pixels = inf\nmax_new_tokenz = 3\n")
    out = run_cli("doctor", "--engine", "replay:/nonexistent.json", env={"QVL_CONFIG_DIR": str(config_dir)})
    lines = [line for line in out.stderr.splitlines() if line.startswith("qvl-agent:")]
    assert any("max_pixels" in line and "inf" in line for line in lines)
    assert any("max_new_tokenz" in line for line in lines)
    assert "Traceback" not in out.stderr
    assert "FAIL  model:" in out.stdout  # the command itself ran
    assert (config_dir / "config.toml").read_text() == "max_pixels = inf\nmax_new_tokenz = 3\n"


def test_speculative_decoding_is_a_true_or_false_setting(path):
    assert load_text(path, "speculative = false\n").settings.speculative is False
    loaded = load_text(path, 'speculative = "no"\nmax_new_tokens = 64\n')
    assert loaded.settings.speculative is True and loaded.settings.max_new_tokens == 64
    assert "speculative" in loaded.notice and "true or false" in loaded.notice
    assert config.load(path, env={"QVL_SPECULATE": "0"}).settings.speculative is False
    with pytest.raises(ConfigError, match="QVL_SPECULATE"):
        config.load(path, env={"QVL_SPECULATE": "maybe"})


def test_the_newest_gpu_paths_stay_off_until_asked_for(path):
    for name, var in (("fast_batch", "QVL_FAST_BATCH"), ("fast_prefill", "QVL_FAST_PREFILL")):
        assert getattr(Settings(), name) is False  # until the GPU check has passed them
        assert getattr(load_text(path, f"{name} = true\n").settings, name) is True
        assert getattr(config.load(path, env={var: "1"}).settings, name) is True
        assert getattr(config.load(path, env={var: "0"}).settings, name) is False


def test_a_measuring_tool_takes_the_environment_but_not_the_settings_file(path):
    """`qvl-agent bench` and the profile time what `QVL_*` asks for; a person's settings file (here one
    that turns compiling off) changes no figure, and a bad variable is refused with its name."""
    load_text(path, "compile = false\nfast_prefill = true\n")
    env = {"QVL_FAST_PREFILL": "1", "QVL_CONFIG_DIR": str(path.parent)}
    settings = config.from_environment(env, feature_cache_mb=64)
    assert (settings.compile, settings.fast_prefill, settings.feature_cache_mb) == (True, True, 64)
    assert config.from_environment({}).fast_prefill is False
    with pytest.raises(ConfigError, match="QVL_FAST_PREFILL"):
        config.from_environment({"QVL_FAST_PREFILL": "maybe"})


def test_max_pixels_beyond_what_the_model_sees_is_refused(path):
    loaded = load_text(path, "max_pixels = 100000000000\n")
    assert loaded.settings.max_pixels == Settings().max_pixels
    assert "max_pixels must be at most 16,777,216" in loaded.notice


def test_the_take_over_hotkey_is_written_takeover_hotkey_at_the_top_of_the_file(path):
    loaded = load_text(path, 'takeover_hotkey = "<ctrl>+<shift>+t"\n[hotkeys]\nask = "<ctrl>+<shift>+a"\n')
    assert loaded.settings.hotkeys == Hotkeys(ask="<ctrl>+<shift>+a", takeover="<ctrl>+<shift>+t")
    assert not loaded.notices
    config.save(loaded.settings, path)
    data = tomllib.loads(path.read_text())
    assert data["takeover_hotkey"] == "<ctrl>+<shift>+t" and "takeover" not in data["hotkeys"]
    assert config.load(path, env={}).settings == loaded.settings
    assert 'takeover_hotkey = "<ctrl>+<alt>+t"' in config.dumps(Settings())  # the default, under its name


@pytest.mark.parametrize(
    "text, said",
    [
        ('takeover_hotkey = ""', "takeover_hotkey) hotkey is empty"),
        ('takeover_hotkey = "<ctrl>+<alt>+<nope>"', "unknown key"),
        ("takeover_hotkey = 3", "must be text"),
        ('takeover_hotkey = "t"', "needs a modifier"),
        ('takeover_hotkey = "<ctrl>+<alt>+<esc>"', "all be different"),  # the stop hotkey's default
        ('takeover_hotkey = "<ctrl>+<alt>+a"\n[hotkeys]\nask = "<ctrl>+<alt>+a"', "all be different"),
    ],
)
def test_a_bad_takeover_hotkey_is_one_notice_and_the_default_stays(path, text, said):
    loaded = load_text(path, text + "\n")
    assert loaded.settings.hotkeys.takeover == "<ctrl>+<alt>+t"
    assert len(loaded.notices) == 1 and "takeover_hotkey" in loaded.notices[0] and said in loaded.notices[0]
    with pytest.raises(ConfigError, match="takeover_hotkey must all be different"):
        Settings(hotkeys=Hotkeys(takeover="<ctrl>+<alt>+q")).validated()
