"""`qvl-agent replay SCRIPT.py`: saved scripts run in the sandbox, reaching only the origins of their header
(plus --allow-domain and --url), their files landing only in a new folder, their exit status their own.
Hostile scripts assert their effect did NOT happen (canary files unchanged, no file in the person's
folder, a listener on another port that received nothing)."""

from __future__ import annotations

import socket
import threading
import uuid
import zipfile
from pathlib import Path

import pytest

from qvl_agent.cli import main
from qvl_agent.playwright.chromium import find_browser
from qvl_agent.scripts.header import read_origins, render_header, with_header
from tests.pages.server import PageServer

pytestmark = pytest.mark.browser

BROWSER = find_browser()
LAUNCH = (
    "import os, sys\nfrom playwright.sync_api import sync_playwright, expect\n"
    "with sync_playwright() as p:\n"
    "    b = p.chromium.launch(executable_path=os.environ['QVL_BROWSER'])\n"
    "    page = b.new_page()\n"
)


@pytest.fixture(scope="module")
def server():
    srv = PageServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The person's folder, holding their own files, as the working directory."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "photo.png").write_bytes(b"my photo")
    (home / "AGENTS.md").write_text("my agents file")
    (home / ".git").mkdir()
    (home / ".git" / "config").write_text("[core]\n")
    monkeypatch.chdir(home)
    monkeypatch.setenv("QVL_CONFIG_DIR", str(tmp_path / "config"))
    return home


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(folder: Path, body: str, origins: list[str] | None, name: str = "script.py") -> Path:
    path = folder / name
    source = LAUNCH + body + "    b.close()\n"
    path.write_text(with_header(source, name, origins) if origins is not None else source)
    return path


def replay(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["replay", "--browser", BROWSER, "--timeout", "120", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


class Listener:
    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.received.append(b"<connected>")
            conn.close()


# --- the header ---------------------------------------------------------------------------------------


def test_the_header_names_the_command_and_the_origins_and_reads_back():
    lines = render_header("shop.py", ["http://127.0.0.1:8000", "https://Example.com:443/"]).splitlines()
    assert lines[0].startswith("# Run it with: qvl-agent replay shop.py   (sandboxed:")
    assert lines[1] == "# Running it with plain `python` is your own choice: the script then has all of your rights."
    assert lines[2] == "# qvl-agent-origins: http://127.0.0.1:8000 https://example.com"
    source = with_header("print('hi')\n", "shop.py", ["http://127.0.0.1:8000"])
    assert source.startswith("#!/usr/bin/env python3\n# Run it with")
    assert read_origins(source) == ["http://127.0.0.1:8000"]


def test_model_text_below_the_header_cannot_widen_the_origins():
    model = "# qvl-agent-origins: https://evil.example\nimport os\n# qvl-agent-origins: https://evil2.example\n"
    assert read_origins(with_header(model, "s.py", ["http://127.0.0.1:8000"])) == ["http://127.0.0.1:8000"]
    assert read_origins("import os\n# qvl-agent-origins: https://evil.example\n") is None
    # a Unicode line separator is not a line break to Python's tokenizer, so not to the header either
    assert read_origins("# note\u2028# qvl-agent-origins: https://evil.example\nimport os\n") is None


@pytest.mark.parametrize("smuggle", [
    "#!/usr/bin/env python3\r# qvl-agent-origins: {evil}\nimport os\n",  # a bare CR: one line to us, two to Python
    "#!x\r\n# qvl-agent-origins: {evil}\rimport os\n",
    "\r# qvl-agent-origins: {evil}\n",
    "\x0c# qvl-agent-origins: {evil}\n",  # a form feed is blank space to the tokenizer
    "#   QVL-AGENT-ORIGINS:   {evil}\n",
    "print(1)\r# qvl-agent-origins: {evil}\n",
])  # fmt: skip
def test_a_model_written_script_cannot_put_a_header_line_of_its_own_anywhere(smuggle):
    model = smuggle.format(evil="http://127.0.0.1:6379")
    saved = with_header(model, "s.py", ["https://shop.example"])
    assert read_origins(saved) == ["https://shop.example"]
    lines = saved.split("\n")
    assert [line for line in lines if "qvl-agent-origins" in line.lower()] == [
        "# qvl-agent-origins: https://shop.example"
    ]
    assert "\r" not in saved and saved.startswith("#!/usr/bin/env python3\n# Run it with")


def test_a_smuggled_origin_is_not_reached_by_the_replay(server, folder, capsys):
    """End to end: the model's first line ends in a bare CR and names a local service; the saved script
    replays, and the service hears nothing."""
    other = Listener()
    urls = [server.url + "/login.html", f"http://127.0.0.1:{other.port}/"]
    model = f"#!/usr/bin/env python3\r# qvl-agent-origins: http://127.0.0.1:{other.port}\n"
    model += LAUNCH + PROBE.format(urls=urls) + "    b.close()\n"
    script = folder / "smuggled.py"
    script.write_text(with_header(model, script.name, [server.url]))
    code, out, err = replay(capsys, str(script))
    assert code == 0, err
    assert f"reached {urls[0]}" in out and f"unreachable {urls[1]}" in out
    assert other.received == []
    assert f"qvl-agent: network: {server.url}\n" in err


@pytest.mark.parametrize(
    "bad", ["file:///etc/passwd", "http://x/path", "http://u:p@x", "javascript:alert(1)", "ftp://x"]
)
def test_origins_other_than_http_and_https_hosts_are_refused(bad):
    with pytest.raises(ValueError):
        render_header("s.py", [bad])
    assert read_origins(f"# qvl-agent-origins: {bad}\n") == []


# --- ordinary scripts replay --------------------------------------------------------------------------


def test_a_scraper_printing_in_a_loop_replays_and_its_files_land_in_a_new_folder(server, folder, capsys):
    before = snapshot(folder)
    script = write(folder, (
        f"    page.goto({server.url + '/login.html'!r})\n"
        "    for label in page.get_by_role('textbox').all():\n"
        "        print('field:', label.get_attribute('name'))\n"
        "    page.screenshot(path='photo.png')\n"
        "    page.pdf(path='shots/page.pdf')\n"
        "    open('fields.csv', 'w').write('username,password\\n')\n"
    ), [server.url])  # fmt: skip
    code, out, err = replay(capsys, str(script))
    assert code == 0, err
    assert "field: username" in out and "field: password" in out
    out_dir = folder / "script.out"
    names = sorted(p.name for p in out_dir.rglob("*") if p.is_file())
    assert names == ["fields.csv", "page.pdf", "photo.png", "trace.zip"]  # and Playwright's trace of the run
    assert {"trace.trace", "trace.network"} <= set(zipfile.ZipFile(out_dir / "trace.zip").namelist())
    assert (out_dir / "photo.png").read_bytes().startswith(b"\x89PNG")
    assert (out_dir / "shots" / "page.pdf").read_bytes().startswith(b"%PDF")
    assert snapshot(folder) == before | {
        str(p.relative_to(folder)): p.read_bytes() for p in out_dir.rglob("*") if p.is_file()
    } | {"script.py": script.read_bytes()}  # noqa: E501
    # A second replay never touches the first one's files: it gets a folder of its own.
    code, _, err = replay(capsys, str(script))
    assert code == 0, err
    assert (folder / "script.out-2" / "photo.png").is_file()
    assert (out_dir / "photo.png").read_bytes() == snapshot(folder)["script.out/photo.png"]


def test_a_form_filler_posts_to_its_own_origin(server, folder, capsys):
    server.clear()
    script = write(folder, (
        f"    page.goto({server.url + '/login.html'!r})\n"
        "    page.get_by_label('Username').fill('grace')\n"
        "    page.get_by_label('Password').fill('hopper')\n"
        "    page.get_by_role('button', name='Sign in').click()\n"
        "    expect(page.get_by_text('Welcome, grace')).to_be_visible()\n"
    ), [server.url])  # fmt: skip
    code, _, err = replay(capsys, str(script))
    assert code == 0, err
    assert server.records("login")


def test_the_exit_status_is_the_scripts_own(folder, capsys):
    (folder / "three.py").write_text(with_header("import sys\nprint('bye')\nsys.exit(3)\n", "three.py", []))
    code, out, _ = replay(capsys, str(folder / "three.py"))
    assert code == 3 and "bye" in out


def test_step_timeout_reaches_the_script_as_its_timeout_and_a_bad_one_is_refused(folder, capsys):
    (folder / "args.py").write_text(with_header("import sys\nprint(sys.argv[1:])\n", "args.py", []))
    code, out, _ = replay(capsys, "--step-timeout", "2.5", str(folder / "args.py"))
    assert code == 0 and "['--timeout', '2.5']" in out
    code, out, _ = replay(capsys, str(folder / "args.py"))
    assert code == 0 and "[]" in out  # without it, the script's own default
    code, _, err = replay(capsys, "--step-timeout", "0", str(folder / "args.py"))
    assert code == 2 and "--step-timeout must be from 0 to 86400 seconds" in err


def test_an_existing_output_folder_is_refused_in_one_sentence(folder, capsys):
    (folder / "out").mkdir()
    (folder / "s.py").write_text("print(1)\n")
    code, out, err = replay(capsys, "-o", str(folder / "out"), str(folder / "s.py"))
    assert code == 2 and "already exists" in err and "Traceback" not in err
    assert list((folder / "out").iterdir()) == []


def test_a_missing_script_and_a_bad_allow_domain_are_usage_errors(folder, capsys):
    assert replay(capsys, str(folder / "nope.py"))[0] == 2
    (folder / "s.py").write_text("print(1)\n")
    code, _, err = replay(capsys, "--allow-domain", "http://x/p", str(folder / "s.py"))
    assert code == 2 and "Traceback" not in err


# --- network ------------------------------------------------------------------------------------------

PROBE = (
    "    import urllib.request\n"
    "    for url in {urls!r}:\n"
    "        try:\n"
    "            urllib.request.urlopen(url, timeout=5).read()\n"
    "            print('reached', url)\n"
    "        except Exception as exc:\n"
    "            print('unreachable', url)\n"
)


def test_only_the_header_origins_are_reached(server, folder, capsys):
    other = Listener()
    urls = [server.url + "/login.html", f"http://127.0.0.1:{other.port}/"]
    script = write(folder, PROBE.format(urls=urls), [server.url])
    code, out, err = replay(capsys, str(script))
    assert code == 0, err
    assert f"reached {urls[0]}" in out and f"unreachable {urls[1]}" in out
    assert other.received == []


def test_a_script_without_header_gets_no_network_unless_allowed(server, folder, capsys):
    url = server.url + "/login.html"
    script = write(folder, PROBE.format(urls=[url]), None)
    code, out, err = replay(capsys, str(script))
    assert f"unreachable {url}" in out and "runs without network" in err
    code, out, err = replay(capsys, "--allow-domain", server.url, str(script))
    assert f"reached {url}" in out and "without network" not in err


def test_a_host_file_is_not_readable_by_any_route(server, folder, capsys, tmp_path):
    # file:// pages, argparse's @file reader, and code reached through a class pattern on a frame.
    secret = tmp_path / "id_rsa"
    secret.write_text("secret-" + uuid.uuid4().hex)
    marker = tmp_path / "bypass-ran"
    script = write(folder, (
        f"    for url in ['file://{secret}', 'file:///etc/shadow']:\n"
        "        try:\n"
        "            page.goto(url)\n"
        "            print(url, page.content())\n"
        "        except Exception:\n"
        "            print(url, 'unreachable')\n"
        "    import argparse\n"
        "    parser = argparse.ArgumentParser('x', None, None, None, [], argparse.HelpFormatter, '-', '@')\n"
        "    parser.add_argument('rest', nargs='*')\n"
        "    try:\n"
        f"        print(parser.parse_args(['@{secret}']))\n"
        "    except SystemExit:\n"
        "        print('no such file in here')\n"
        "    def gen():\n"
        "        yield 1\n"
        "    match gen():\n"
        "        case object(gi_frame=frame):\n"
        "            shell = frame.f_builtins['__import__']('os').system\n"
        f"            print('status', shell('cat {secret}; touch {marker}'))\n"
    ), [server.url])  # fmt: skip
    code, out, err = replay(capsys, str(script))
    assert code == 0, err
    assert "status " in out  # the route was taken, inside
    assert secret.read_text() not in out + err
    assert not marker.exists()


# --- hostile files ------------------------------------------------------------------------------------


def test_hidden_runnable_and_instruction_files_never_reach_the_persons_folder(server, folder, capsys):
    before = snapshot(folder)
    script = write(folder, (
        f"    page.goto({server.url + '/login.html'!r})\n"
        "    for name in ['.git/config', '.ssh/authorized_keys', '.config/autostart/x.desktop', '.bashrc']:\n"
        "        os.makedirs(os.path.dirname(name) or '.', exist_ok=True)\n"
        "        page.screenshot(path=name, type='png')\n"
        "    for name in ['AGENTS.md', 'CLAUDE.md', 'requirements.txt', 'conftest.py', 'run.sh', 'Makefile',\n"
        "                 'photo.png', '../escape.png', '/tmp/abs.png']:\n"
        "        try:\n"
        "            open(name, 'w').write('evil')\n"
        "        except OSError:\n"
        "            pass\n"
    ), [server.url])  # fmt: skip
    code, _, err = replay(capsys, str(script))
    assert code == 0, err
    after = snapshot(folder)
    assert {k: v for k, v in after.items() if not k.startswith("script.out")} == before | {
        "script.py": script.read_bytes()
    }
    kept = sorted(
        p.relative_to(folder / "script.out").as_posix() for p in (folder / "script.out").rglob("*") if p.is_file()
    )
    assert kept == ["photo.png", "trace.zip"]  # the script's own photo, in the new folder; the person's is unchanged
    assert (folder / "photo.png").read_bytes() == b"my photo"
    assert not (folder.parent / "escape.png").exists()
    assert "not kept .git/config" in err and "not kept AGENTS.md" in err


def test_the_memory_setting_holds_for_shared_memory(folder, capsys, monkeypatch):
    # memfds mapped shared: neither heap nor private memory. 1 GB against a setting of 512 MB.
    monkeypatch.setenv("QVL_SANDBOX_MEMORY_MB", "512")
    body = (
        "import mmap, os, time\n"
        "maps = []\n"
        "for n in range(16):\n"
        "    fd = os.memfd_create(f'm{n}')\n"
        "    os.ftruncate(fd, 64 << 20)\n"
        "    m = mmap.mmap(fd, 64 << 20, mmap.MAP_SHARED)\n"
        "    for i in range(0, 64 << 20, 4096):\n"
        "        m[i] = 1\n"
        "    maps.append(m)\n"
        "print('held it all', flush=True)\n"
        "time.sleep(60)\n"
    )
    (folder / "hog.py").write_text(with_header(body, "hog.py", []))
    code, out, err = replay(capsys, str(folder / "hog.py"))
    assert code == 1 and "more than 512 MB of memory" in err and "held it all" not in out


def test_every_origin_of_the_header_is_reached_and_no_other(server, folder, capsys):
    second = PageServer().start()
    other = Listener()
    try:
        named = second.url.replace("127.0.0.1", "localhost")
        urls = [server.url + "/login.html", named + "/help.html"]
        script = write(folder, PROBE.format(urls=[*urls, f"http://127.0.0.1:{other.port}/"]), [server.url, named])
        code, out, err = replay(capsys, str(script))
    finally:
        second.stop()
    assert code == 0, err
    assert f"reached {urls[0]}" in out and f"reached {urls[1]}" in out
    assert other.received == []


def test_an_exported_script_replays_and_takes_url(server, folder, capsys):
    from qvl_agent.scripts.export.exporter import export_run

    second = PageServer().start()
    try:
        export_run(folder / "run.py", server.url + "/login.html", [], None, task="open the page")
        code, out, err = replay(capsys, str(folder / "run.py"))
        assert code == 0, err
        assert "Replayed" in out
        assert "qvl-agent: playwright trace: trace.zip among its files" in err
        trace = zipfile.ZipFile(folder / "run.out" / "trace.zip").namelist()  # Playwright's, of the replay
        assert {"trace.trace", "trace.network"} <= set(trace) and any(n.startswith("resources/") for n in trace)
        # --url sends the script elsewhere; that origin is allowed for this run, and only for it.
        code, out, err = replay(capsys, "--url", second.url + "/login.html", str(folder / "run.py"))
        assert code == 0, err
    finally:
        second.stop()
    assert read_origins((folder / "run.py").read_text()) == [server.url]


def test_features_built_on_replay_can_bind_a_path_and_run_a_hook_inside(folder, tmp_path):
    # What a later feature needs: a channel into the sandbox (here a folder bound read-only) and code of its
    # own that runs inside before the script (here it marks the builtins, as a wrapper of Playwright would).
    from qvl_agent.sandbox.bubblewrap import Bind
    from qvl_agent.scripts.replay import replay_script

    channel = tmp_path / "channel"
    channel.mkdir()
    (channel / "hello.txt").write_text("from the host")
    hook = tmp_path / "hook.py"
    hook.write_text("import builtins\nbuiltins.QVL_HOOKED = 'yes'\n")
    script = folder / "uses.py"
    script.write_text("print('hooked', QVL_HOOKED)\nprint(open('/sandbox/channel/hello.txt').read())\n")
    result = replay_script(
        script, browser=BROWSER, timeout_s=60, binds=[Bind(str(channel), "/sandbox/channel")], init_hooks=[hook]
    )
    assert result.returncode == 0, result.output
    assert "hooked yes" in result.output and "from the host" in result.output


# --- local pages and secrets ----------------------------------------------------------------------------


def test_a_script_made_for_a_local_page_replays_it_and_no_other_host_file(folder, capsys, tmp_path):
    page = tmp_path / "site" / "form.html"
    page.parent.mkdir()
    page.write_text("<title>Local form</title><h1>hello from a local page</h1>")
    (page.parent / "notes.txt").write_text("private notes beside the page")
    assert read_origins(with_header("x = 1\n", "s.py", [f"file://{page}"])) == [f"file://{page}"]
    for bad in ("file:///etc/passwd", f"file://{tmp_path}/.ssh/id.html", f"file://{page}?q=1"):
        assert read_origins(f"# qvl-agent-origins: {bad}\n") == []  # not a page, hidden, or with a query
    script = write(folder, (
        f"    page.goto('file://{page}')\n"
        "    print('page says', page.locator('h1').inner_text())\n"
        "    for other in ['notes.txt', '/etc/hostname']:\n"
        "        try:\n"
        f"            print(other, open(other if other.startswith('/') else '{page.parent}/' + other).read())\n"
        "        except OSError:\n"
        "            print(other, 'unreadable')\n"
    ), [f"file://{page}"])  # fmt: skip
    # The header alone binds nothing: whoever wrote the script wrote its header. Nothing runs.
    code, out, err = replay(capsys, str(script))
    assert code == 2 and out == ""
    assert f"asks for the host file {page}; give it with --allow-file {page}" in err
    assert not (folder / "script.out").exists()
    code, out, err = replay(capsys, "--allow-file", str(page), str(script))
    assert code == 0, err
    assert f"qvl-agent: host files (read-only): {page}\n" in err  # said before it ran
    assert "page says hello from a local page" in out
    assert "private notes" not in out and "notes.txt unreadable" in out  # the page alone, not its folder


def test_a_replayed_script_gets_only_the_secret_variables_it_reads(server, folder, capsys, monkeypatch):
    monkeypatch.setenv("QVL_SECRET_PASSWORD", "hunter2-" + uuid.uuid4().hex)
    monkeypatch.setenv("QVL_SECRET_OTHER", "other-" + uuid.uuid4().hex)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-" + uuid.uuid4().hex)
    script = write(folder, (
        "    print('typed', os.environ['QVL_SECRET_PASSWORD'])\n"
        "    print('visible', sorted(k for k in os.environ if k.startswith(('QVL_SECRET', 'AWS'))))\n"
    ), [server.url])  # fmt: skip
    code, out, err = replay(capsys, str(script))
    assert code == 0, err
    assert f"typed {__import__('os').environ['QVL_SECRET_PASSWORD']}" in out
    assert "visible ['QVL_SECRET_PASSWORD']" in out  # not the other secret, not the rest of the environment
    assert "qvl-agent: secret variables: QVL_SECRET_PASSWORD\n" in err  # the name, said before it ran
    assert "playwright trace: none: the script types a secret" in err
    assert not (folder / "script.out" / "trace.zip").exists()
    assert __import__("os").environ["QVL_SECRET_PASSWORD"] not in err
