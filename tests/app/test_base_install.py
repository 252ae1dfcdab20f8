"""A base install (`pip install hwtui`, no engine extra) answers engine commands with the extra to
install, in one line with exit 2; never an internal error. The missing modules are simulated the way
Python sees them on such an install: the import raises ModuleNotFoundError."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = "import sys\nfor m in ('torch', 'xxhash', 'safetensors', 'numpy'):\n    sys.modules[m] = None\n"


def _run(tmp_path, argv):
    code = BLOCK + f"from hwtui.app.cli import main\nsys.exit(main({argv!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("argv", [
    ["plan", "--weights", "w.safetensors", "-o", "plan.json"],
    ["replicate", "--plan", "plan.json"],
    ["train", "--steps", "1"],
    ["cluster", "test"],
])
def test_engine_commands_name_the_extra(tmp_path, argv):
    (tmp_path / "w.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (tmp_path / "plan.json").write_text("{}")
    out = _run(tmp_path, argv)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and 'pip install "hwtui[engine]"' in lines[0], out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr


def test_check_and_list_gpus_need_no_extra(tmp_path):
    out = _run(tmp_path, ["list-gpus", "--json"])
    assert out.returncode == 0, out.stderr


def test_python_dash_m_hwtui(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hwtui", "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("hwtui "), out.stderr


def test_usage_errors_are_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hwtui", "replicate", "--no-such-flag"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
