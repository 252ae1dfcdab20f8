"""First contact (issue 26): the answers a new user meets on a base install, each one line and exact."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hwtui.core.install_hint import install_command, installer
from tests import machines
from tests.app.test_cli_check import hwtui


def test_check_without_torch_says_the_exact_pip_line(tmp_path):
    fs = machines.laptop_no_gpu(tmp_path / "l")
    fs.facts(torch_build={"installed": False})
    r = hwtui("--check", "--only", "gpu", "--sysroot", str(fs.root))
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "[SKIP] torch is not installed" in line)
    fix = "python3 -m pip install torch --index-url https://download.pytorch.org/whl/cpu"  # a sysroot's python
    assert any(line.strip() == f"fix: {fix}" for line in lines[at + 1:at + 4]), r.stdout
    doc = json.loads(hwtui("--check", "--json", "--only", "gpu", "--sysroot", str(fs.root)).stdout)
    (build,) = [f for f in doc["findings"] if f["id"] == "torch.wheel.build"]
    assert build["status"] == "skip" and build["remedy"] == fix


@pytest.mark.parametrize("only", ["", " ", ",", " , "])
def test_check_only_empty_is_a_usage_error(tmp_path, only):
    fs = machines.laptop_no_gpu(tmp_path / "l")
    r = hwtui("--check", "--only", only, "--sysroot", str(fs.root))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "--only" in r.stderr


def test_only_empty_without_check_is_a_usage_error():
    r = hwtui("--only", "")
    assert r.returncode == 2 and "go with --check" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_env_write_writes_and_says_where(tmp_path):
    fs = machines.laptop_no_gpu(tmp_path / "l")
    target = tmp_path / "node.env"
    r = hwtui("env", "--sysroot", str(fs.root), "--write", str(target))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert target.read_text().startswith("# hwtui env: exports for")
    assert [line for line in r.stderr.splitlines() if str(target) in line] == [
        f"hwtui: wrote {target}; load it with: source {target}"]


@pytest.mark.parametrize(("prefix", "env", "want"), [
    ("/home/u/.local/share/uv/tools/hwtui", {}, "uv-tool"),
    ("/srv/tools/hwtui", {"UV_TOOL_DIR": "/srv/tools"}, "uv-tool"),
    ("/home/u/.local/share/pipx/venvs/hwtui", {}, "pipx"),
    ("/home/u/.local/pipx/venvs/hwtui", {}, "pipx"),
    ("/opt/px/venvs/hwtui", {"PIPX_HOME": "/opt/px"}, "pipx"),
    ("/home/u/project/.venv", {}, "pip"),
    ("/srv/toolsmith/venv", {"UV_TOOL_DIR": "/srv/tools"}, "pip"),  # a prefix of the name is not the folder
])
def test_installer_is_read_from_where_the_interpreter_lives(prefix, env, want):
    assert installer(prefix=prefix, executable=prefix + "/bin/python", env=env) == want


def test_install_command_per_installer():
    uv = install_command("engine", prefix="/h/.local/share/uv/tools/hwtui", executable="/x", env={})
    assert uv == 'uv tool install "hwtui[engine]"'
    pipx = install_command("agent", prefix="/h/.local/share/pipx/venvs/hwtui", executable="/x", env={})
    assert pipx.startswith("pipx inject hwtui ") and '"httpx>=0.27"' in pipx
    assert install_command("engine", prefix="/h/venv", executable="/h/venv/bin/python", env={}) == 'pip install "hwtui[engine]"'


BLOCK = "import sys\nfor m in ('torch', 'xxhash', 'safetensors', 'numpy'):\n    sys.modules[m] = None\n"


@pytest.mark.parametrize(("prefix", "want"), [
    ("/home/u/.local/share/uv/tools/hwtui", 'uv tool install "hwtui[engine]"'),
    ("/home/u/.local/share/pipx/venvs/hwtui", 'pipx inject hwtui "torch'),
])
def test_missing_extra_hint_speaks_the_installers_words(tmp_path, prefix, want):
    code = BLOCK + f"sys.prefix = {prefix!r}\nfrom hwtui.app.cli import main\nsys.exit(main(['train', '--steps', '1']))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert want in line and "pip install" not in line, line


def test_check_verbose_shows_the_detail_of_passes(tmp_path):
    fs = machines.laptop_no_gpu(tmp_path / "l")
    plain = hwtui("--check", "--only", "hardware", "--sysroot", str(fs.root))
    verbose = hwtui("-v", "--check", "--only", "hardware", "--sysroot", str(fs.root))
    assert plain.returncode == verbose.returncode
    assert len(verbose.stdout.splitlines()) > len(plain.stdout.splitlines())


def test_tui_engine_hint_speaks_the_installers_words_too(monkeypatch):
    from hwtui.app.tui import engine_process

    monkeypatch.setattr(engine_process, "missing_engine_modules", lambda: ["torch"])
    monkeypatch.setattr(sys, "prefix", "/home/u/.local/share/uv/tools/hwtui")
    monkeypatch.setattr(sys, "executable", "/home/u/.local/share/uv/tools/hwtui/bin/python")
    assert engine_process.engine_extra_problem() == 'the engine needs torch: uv tool install "hwtui[engine]"'


def test_the_engines_own_torch_hints_speak_the_installer_too(monkeypatch):
    """A rank's node without torch (cluster preflight) and the replication transport name the
    installer hwtui came with, like the CLI does."""
    import importlib.util
    import sys

    from hwtui.core.errors import HwtuiError
    from hwtui.engine.cluster.preflight import interpreter_findings
    from hwtui.engine.replication import transport

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setattr(sys, "prefix", "/home/u/.local/share/uv/tools/hwtui")
    monkeypatch.setattr(sys, "executable", "/home/u/.local/share/uv/tools/hwtui/bin/python")
    (finding,) = interpreter_findings()
    assert 'uv tool install "hwtui[engine]"' in finding.remedy and "pip" not in finding.remedy
    with pytest.raises(HwtuiError, match=r'uv tool install "hwtui\[engine\]"'):
        transport.torch_build()
    monkeypatch.setattr(sys, "prefix", "/srv/venv")
    monkeypatch.setattr(sys, "executable", "/srv/venv/bin/python")
    (finding,) = interpreter_findings()
    assert finding.remedy.startswith('/srv/venv/bin/python -m pip install "hwtui[engine]"')


def test_error_lines_are_redacted_in_one_place(tmp_path):
    """A usage error quoting what the user typed must not echo a secret into a CI log: the CLI's one
    error handler redacts every HwtuiError line, whichever command raised it."""
    secret = "hunter2-not-for-logs"
    r = hwtui("train", "--data", str(tmp_path / f"token={secret}"), "--steps", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert secret not in r.stderr and "REDACTED" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
