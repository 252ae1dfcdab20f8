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


def wait_screen(session: str, *texts: str, timeout: float = 30.0, absent: tuple[str, ...] = ()) -> str:
    """The screen once it shows every one of ``texts`` (and none of ``absent``).

    Waits on the whole expected state, never on a first sign of it: a loaded box draws the status
    line, the table and the footer in separate frames. Wrapped lines are read as one (words).
    """
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = capture(session)
        words = " ".join(screen.split())
        if all(t in screen or t in words for t in texts) and not any(t in screen for t in absent):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{texts!r} (without {absent!r}) never appeared together; the screen was:\n{screen}")


def test_hwtui_in_tmux(snapshots, tmp_path, config_home):
    session = f"hwtui-test-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "exit-status"
    hwtui = Path(sys.executable).with_name("hwtui")
    command = (f"XDG_CONFIG_HOME={config_home} {hwtui} --replay {snapshots['example:h100_x8']}; "
               f"echo $? > {marker}; sleep 30")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command], check=True)
    try:
        # `hwtui` opens on the monitor: the replayed machine's 8 GPUs; w opens the wizard.
        wait_screen(session, "hwtui monitor", "cuda:7", "w Wizard", "not recorded in a replay")
        subprocess.run(["tmux", "send-keys", "-t", session, "w"], check=True)
        # Detect: the table, the status line and the footer, all drawn.
        wait_screen(session, "cuda:7", "[1 Detect]", "8 accelerator(s)", "8 usable (NVIDIA)", "n Next", "q Quit")
        subprocess.run(["tmux", "send-keys", "-t", session, "n"], check=True)
        wait_screen(session, "findings (", "[2 Drivers & wheels]", "c Copy remedy", "pass")
        subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
        wait_screen(session, "Keys everywhere")
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape"], check=True)
        # A lone Escape is read after the terminal's escape delay: wait for the help to be gone.
        wait_screen(session, "c Copy remedy", absent=("Keys everywhere",))
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 15
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
