"""End to end, as a person would: start `hwtui` in tmux, press keys, read the screen.

Runs the installed entry point on a replayed H100 box, walks to the Drivers step, opens help,
and quits; the screen text (capture-pane) is what is asserted, nothing inside the process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tmux, pytest.mark.timeout(90),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


def capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True).stdout


def wait_screen(session: str, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = capture(session)
        if text in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared; the screen was:\n{screen}")


def test_hwtui_in_tmux(snapshots, tmp_path, config_home):
    session = f"hwtui-test-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "exit-status"
    hwtui = Path(sys.executable).with_name("hwtui")
    command = (f"XDG_CONFIG_HOME={config_home} {hwtui} --replay {snapshots['example:h100_x8']}; "
               f"echo $? > {marker}; sleep 30")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command], check=True)
    try:
        screen = wait_screen(session, "cuda:7")
        words = " ".join(screen.split())  # a long status line wraps; read it as a person would
        assert "[1 Detect]" in screen and "8 accelerator(s)" in words and "8 usable (NVIDIA)" in words
        assert "n Next" in screen and "q Quit" in screen, "the footer shows the keys"
        subprocess.run(["tmux", "send-keys", "-t", session, "n"], check=True)
        screen = wait_screen(session, "findings (")
        assert "[2 Drivers & wheels]" in screen and "c Copy remedy" in screen
        assert "pass" in screen
        subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
        wait_screen(session, "Keys everywhere")
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape"], check=True)
        deadline = time.monotonic() + 10  # a lone Escape is read after the terminal's escape delay
        while "Keys everywhere" in capture(session) and time.monotonic() < deadline:
            time.sleep(0.2)
        screen = capture(session)
        assert "Keys everywhere" not in screen and "c Copy remedy" in screen
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 15
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
