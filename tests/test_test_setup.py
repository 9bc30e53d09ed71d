"""The test suite's own promises: it never writes into the person's real folders, and under CI=true
a skipped test fails the run instead of passing silently."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REAL_HOME, ROOT, run_cli


def test_runs_and_settings_go_to_the_private_home(private_home):
    out = subprocess.run(
        [sys.executable, "-c", "from qvl_agent import config, trace; print(trace.default_trace_dir()); "
         "print(config.config_path())"],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
    )  # fmt: skip
    runs, settings = (p for p in out.stdout.split())
    for path in (runs, settings):
        assert path.startswith(str(private_home)), path
        assert not path.startswith(str(REAL_HOME / ".local")) and not path.startswith(str(REAL_HOME / ".config"))


@pytest.mark.display
def test_a_run_without_trace_dir_writes_its_trace_under_the_private_home(x_display, private_home, tmp_path):
    replies = tmp_path / "replies.json"
    replies.write_text('["<tool_call>{\\"name\\": \\"computer_use\\", \\"arguments\\": {\\"action\\": \\"terminate\\", '
                       '\\"status\\": \\"success\\"}}</tool_call>"]')  # fmt: skip
    done = run_cli("run", "--engine", f"replay:{replies}", "--dry-run", "Nothing")
    assert done.returncode == 3, done.stderr
    trace_dir = done.stderr.rsplit("(trace: ", 1)[1].split(")")[0]
    assert trace_dir.startswith(str(private_home / ".local" / "share" / "qvl-agent" / "runs"))
    assert (private_home / ".local" / "share" / "qvl-agent" / "runs").is_dir()


def test_under_ci_a_skip_fails_the_run(tmp_path):
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_skipped():\n    pytest.skip('no tool here')\n\ndef test_fine():\n    pass\n"
    )
    (tmp_path / "test_module_skip.py").write_text("import pytest\npytest.importorskip('no_such_module_qvl')\n")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.conftest import "
        "pytest_runtest_makereport, pytest_make_collect_report  # noqa: F401\n"
    )

    def pytest_in(folder, *names, ci: str):
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xvfb", *names]
        return subprocess.run(args, capture_output=True, text=True, cwd=folder, env={**os.environ, "CI": ci})

    ci = pytest_in(tmp_path, "test_skips.py", ci="true")
    assert ci.returncode == 1 and "1 failed, 1 passed" in ci.stdout, ci.stdout
    assert "skipped under CI=true" in ci.stdout and "no tool here" in ci.stdout
    module = pytest_in(tmp_path, "test_module_skip.py", ci="true")
    assert module.returncode != 0 and "skipped under CI=true" in module.stdout and "no_such_module_qvl" in module.stdout
    local = pytest_in(tmp_path, "test_skips.py", "test_module_skip.py", ci="")
    assert local.returncode == 0 and "1 passed, 2 skipped" in local.stdout, local.stdout
