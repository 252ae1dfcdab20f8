"""The agent extra (httpx) on a base install (issue 26): `hwtui --agents` and `hwtui --check
--agents` name the extra and the command as typed, in one line, exit 2; never a Textual traceback.
A base install is simulated the way tests/app/test_base_install.py does it: the import raises."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = "import sys\nfor m in ('torch', 'xxhash', 'safetensors', 'numpy', 'httpx'):\n    sys.modules[m] = None\n"


def _run(tmp_path, argv):
    code = BLOCK + f"from hwtui.app.cli import main\nsys.exit(main({argv!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("argv", "words"), [
    (["--agents", "127.0.0.1:1"], "`hwtui --agents`"),
    (["--check", "--agents", "x"], "`hwtui --check --agents`"),
    (["agents", "--agents", "127.0.0.1:1"], "`hwtui agents`"),
])
def test_agent_views_on_a_base_install_name_the_extra(tmp_path, argv, words):
    out = _run(tmp_path, argv)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert words in lines[0] and 'pip install "hwtui[agent]"' in lines[0] and "httpx" in lines[0], lines[0]
    assert "Traceback" not in out.stderr and "this" not in lines[0].split("needs")[0]


def test_the_cluster_view_on_a_base_install_in_a_terminal_is_one_line_not_a_traceback(tmp_path):
    """`hwtui --agents ...` as a user types it, in a terminal (a pty): before the fix the app
    started and died in a Textual traceback (`No module named 'httpx'`) with exit 0."""
    import os
    import pty
    import select
    import time

    code = BLOCK + "from hwtui.app.cli import main\nsys.exit(main(['--agents', '127.0.0.1:1']))\n"
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pty's terminal
        os.chdir(tmp_path)
        os.execve(sys.executable, [sys.executable, "-c", code], {**os.environ, "TERM": "xterm-256color"})
    out = b""
    end = time.monotonic() + 90
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 2, text[-2000:]
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "`hwtui --agents`" in lines[0] and 'pip install "hwtui[agent]"' in lines[0], text[-2000:]
