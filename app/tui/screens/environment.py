"""Step 3, Environment: the distributed environment's findings, and the export file to write.

The export file is written by ``hwtui env --write FILE`` in a subprocess: the same code path the
CLI uses (one builder, one set of redaction rules), and a slow probe cannot block the UI.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Input, Label, Static

from hwtui.app.tui.messages import ExportWritten
from hwtui.app.tui.screens._step import ChecksStep
from hwtui.core.supervisor import run_capture

EXPORT_TIMEOUT_S = 120


class EnvironmentScreen(ChecksStep):
    STEP = "environment"
    AREAS = frozenset({"env"})
    INTRO = "Distributed environment: backends, rendezvous, network, NCCL/oneCCL/HCCL variables."
    BINDINGS: ClassVar[list[BindingType]] = [Binding("w", "write_export", "Write exports")]
    DEFAULT_CSS = """
    #export-row { height: 1; }
    #export-row > Label { width: 13; }
    #export-path { height: 1; border: none; padding: 0; width: 1fr; }
    #export-status { height: auto; }
    """

    def compose_body(self) -> ComposeResult:
        yield from super().compose_body()
        with Horizontal(id="export-row"):
            yield Label("Export file:")
            yield Input(self.hw.config.export_path, id="export-path")
        yield Static("w writes the variables to this file (source it before a run).", id="export-status", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "export-path":
            self.action_write_export()

    def action_write_export(self) -> None:
        path = self.query_one("#export-path", Input).value.strip()
        if not path:
            self.query_one("#export-status", Static).update("give a file name first")
            return
        self.hw.config.export_path = path
        self.hw.save_config()
        self.query_one("#export-status", Static).update(f"writing {path}...")
        self._write_export(path)

    @work(thread=True, exclusive=True, group="export", exit_on_error=False)
    def _write_export(self, path: str) -> None:
        argv = [sys.executable, "-m", "hwtui.app", *self.hw.host_args, "env", "--write", path]
        try:
            done = run_capture(argv, timeout=EXPORT_TIMEOUT_S)
        except OSError as exc:
            self.post_message(ExportWritten(path, False, str(exc)))
            return
        if done.timed_out:
            self.post_message(ExportWritten(path, False, f"hwtui env did not finish within {EXPORT_TIMEOUT_S} s"))
            return
        out = (done.stderr.strip() or done.stdout.strip())[-2000:]
        self.post_message(ExportWritten(path, done.code == 0, out))

    def on_export_written(self, msg: ExportWritten) -> None:
        status = self.query_one("#export-status", Static)
        if msg.ok:
            status.update(f"wrote {msg.path}: source it with  . {msg.path}")
            self.notify(f"wrote {msg.path}")
        else:
            last = msg.output.splitlines()[-1] if msg.output else "no output"
            status.update(f"FAILED to write {msg.path}: {last}")
            self.notify(f"could not write {msg.path}: {last}", severity="error")
