"""``?``: every key, by step, and what each step is for."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
From "what do I have" to a running engine, then the run, live.

 Monitor        opens first: devices, host, processes (o sorts),
                a device's history chart (g); w: wizard
 Nodes          --agents: every node; w: wizard, m: monitor;
                a: back to it from any screen

 1 Detect       accelerators of every vendor (as `hwtui list-gpus`)
 2 Drivers      drivers, runtimes, torch wheel: verdicts, remedies
 3 Environment  distributed findings; w writes the export file
 4 Engine       replication, training or cluster (blank = detected default)
 5 Run          progress, lanes, throughput, workers, loss, and
                the monitor's devices (--agents: every node too);
                cluster: nodes, mismatches, correctness, bandwidth

Keys everywhere
  n / b         next / back step          r   re-run this step
  ?             this help                 q   quit (stops the engine)
  tab           move between panels       ctrl+p  palette, themes
Monitor
  up / down     pick a device (devices panel focused) or a process
  o             next sort column (or click a column header)
  /             filter processes (command, user or pid)
  t             processes as a tree (by parent)
  k             SIGTERM the process, then SIGKILL (each asked: y / n)
  g             device history chart instead of the processes
Drivers, Environment
  up / down     choose a finding          c   copy its remedy
  w             write the export file (Environment)
Engine
  ctrl+s        start the run             ctrl+d  clear to defaults
  escape        back                      left/right  change a choice
  cluster:      ctrl+o writes the launch files (`hwtui cluster init`)
                ctrl+y copies the highlighted launch command
                ctrl+s runs the smoke test here (`hwtui cluster test`)
  train:        Model: char (built in), a Hugging Face model directory
                or package.module:function (`hwtui train --model`);
                Text data: a .txt, a directory of them or a .jsonl
Run
  s             stop the engine (SIGTERM; SIGKILL after 5 s)
  r             run again                 l   log only / everything
  c             copy the highlighted cluster finding's remedy
  b             back to Engine (the engine keeps running)

Choices are kept in $XDG_CONFIG_HOME/hwtui/config.json.
`hwtui --replay host.json` shows a recorded machine.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", key_display="?"),
        Binding("q", "dismiss", "Close", show=False),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 96; height: 90%; border: round $primary; padding: 0 1;
                                  background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
