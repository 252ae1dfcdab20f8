"""Step 5, Run: the live dashboard: the engine's panels, and the live monitor's beside them.

Layout (``_fit``): from ``WIDE`` columns the monitor's panels (host, devices, the selected
device's history chart, and with ``--agents`` every node) are a column beside the engine's panels
and the log; narrower they sit under them; under ``SHORT`` rows each panel is a titled rule
instead of a box, the host figures go into the devices' title and the devices take two columns,
so 8 GPUs fit at 80x24.

Two thread workers feed it and neither ever blocks the UI thread:

* the engine reader runs the engine's stages as child processes, folds each JSON line into the
  shared :class:`RunState` and posts a merged ``EngineUpdated``; the screen repaints at most
  ``MAX_FPS`` times a second however fast events come;
* the sampler polls device figures, then the screen re-arms a one-shot timer, so polls never
  overlap even when one takes longer than the interval (dolphie's pattern).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Vertical
from textual.timer import Timer
from textual.widgets import ContentSwitcher, DataTable, Static

from hwtui.app.tui.device_sampler import DeviceHistory, MonitorSampler
from hwtui.app.tui.engine_process import EngineProcess, build_stages, hardware_not_here
from hwtui.app.tui.messages import EngineError, EngineExited, EngineUpdated, SamplesReady
from hwtui.app.tui.run_state import RunState
from hwtui.app.tui.screens._step import WizardStep
from hwtui.widgets.bucket_lanes import BucketLanes
from hwtui.widgets.cluster_nodes import ClusterNodes
from hwtui.widgets.cluster_summary import ClusterSummary
from hwtui.widgets.device_chart import DeviceChart
from hwtui.widgets.device_panel import DevicePanel
from hwtui.widgets.error_log import ErrorLog
from hwtui.widgets.finding_detail import FindingDetail
from hwtui.widgets.findings_list import FindingsList
from hwtui.widgets.host_strip import HostStrip, host_summary
from hwtui.widgets.loss_chart import LossChart
from hwtui.widgets.merge_rounds import MergeRounds
from hwtui.widgets.progress_eta import ProgressEta
from hwtui.widgets.throughput_chart import ThroughputChart
from hwtui.widgets.worker_table import WorkerTable

MAX_FPS = 10
WIDE = 140  # columns from which the monitor's panels sit beside the engine's
SHORT = 32  # rows below which panels are titled rules and the devices two columns


class RunScreen(WizardStep):
    STEP = "run"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "back", "Back"),
        Binding("n", "next", "Next", show=False),
        Binding("r", "rerun", "Re-run"),
        Binding("s", "stop", "Stop engine"),
        Binding("l", "toggle_log", "Log"),
        Binding("c", "copy_remedy", "Copy remedy"),
    ]
    # Three sizes (see _fit): wide (>= WIDE columns) puts the monitor column beside the engine's
    # panels; narrower stacks it under them; short (< SHORT rows) draws each panel with a titled
    # rule instead of a full box and the devices in two columns, so 8 GPUs fit at 80x24.
    DEFAULT_CSS = """
    RunScreen .step-body { padding: 0; }
    RunScreen #run-split { layout: vertical; height: 1fr; }
    RunScreen.-wide #run-split { layout: horizontal; }
    RunScreen #engine-col { height: 1fr; }
    RunScreen #monitor-col { height: auto; }
    RunScreen.-wide #monitor-col { width: 45%; height: 1fr; }
    RunScreen .panel { height: auto; }  /* the box itself: app.tcss (.panel; titled rules when short) */
    RunScreen #engine-box { height: auto; }
    RunScreen #log-box { height: 1fr; min-height: 3; }
    RunScreen #log-box ErrorLog { height: 1fr; min-height: 1; }
    RunScreen #views { height: auto; }
    RunScreen #views > Vertical { height: auto; }
    RunScreen #device-panel { max-height: 10; }
    RunScreen.-wide #devices-box { height: auto; }
    RunScreen #chart-box { display: none; }
    RunScreen.-wide #chart-box { display: block; height: 1fr; min-height: 8; }
    RunScreen #nodes-box { display: none; }
    RunScreen.-agents #nodes-box { display: block; height: auto; max-height: 14; }
    RunScreen.-wide.-agents #nodes-box { height: 1fr; max-height: 100%; }
    RunScreen #nodes-box ClusterNodes { height: auto; max-height: 12; }
    RunScreen.-wide #nodes-box ClusterNodes { height: 1fr; max-height: 100%; }
    RunScreen.-short #host-box { display: none; }
    /* Short: a chart's figures and why it is not drawn, in 2 lines. It had 6, which can never draw
       one (PlotChart needs 8), so 4 blank lines sat there while the log had no room. */
    RunScreen.-short ThroughputChart, RunScreen.-short LossChart { height: 2; }
    RunScreen.-short MergeRounds { max-height: 2; }
    RunScreen.-log-only #engine-box, RunScreen.-log-only #monitor-col { display: none; }
    RunScreen #cluster-findings { height: auto; max-height: 6; min-height: 2; }
    RunScreen #cluster-detail { max-height: 7; }
    RunScreen #cluster-detail > #detail { max-height: 3; }
    RunScreen #cluster-detail > #remedy { height: 2; }
    /* The smoke test is about the network: its findings get the device panel's room. */
    RunScreen.-cluster #monitor-col { display: none; }
    RunScreen.-short #cluster-findings { max-height: 4; }
    RunScreen.-short #cluster-detail > #detail { max-height: 2; }
    RunScreen.-short #cluster-detail > #remedy { display: none; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = RunState()
        self.history = DeviceHistory()
        self.engine: EngineProcess | None = None
        self._engine_lock = threading.Lock()
        self._stop_requested = False
        self._seen_version = -1
        self._last_paint = 0.0
        self._paint_timer: Timer | None = None
        self._poll_timer: Timer | None = None
        self._sampler: Any = None
        self._sampler_lock = threading.Lock()
        self._polling = False
        self._sampling_failed = False
        self._errors_notified = 0
        self._findings_shown = -1  # cluster findings in the table (repainted only when it grows)
        self._nodes_timer: Timer | None = None
        self._host: Any = None  # the last host sample (CPU, memory, network)

    # -- layout -------------------------------------------------------------------------------
    def compose_body(self) -> ComposeResult:
        with Container(id="run-split"):
            with Vertical(id="engine-col"):
                with Vertical(id="engine-box", classes="panel"):
                    yield ProgressEta(id="progress")
                    with ContentSwitcher(id="views", initial="view-idle"):
                        yield Static("No run yet: choose an engine in step 4 (b goes back) and press ctrl+s there.",
                                     id="view-idle", classes="hint")
                        with Vertical(id="view-replicate"):
                            yield BucketLanes(id="lanes")
                            yield ThroughputChart(id="throughput")
                        with Vertical(id="view-train"):
                            yield WorkerTable(id="workers")
                            yield LossChart(id="loss")
                            yield MergeRounds(id="merges")
                        with Vertical(id="view-cluster"):
                            yield ClusterSummary(id="cluster")
                            yield FindingsList(id="cluster-findings")
                            yield FindingDetail(id="cluster-detail")
                with Vertical(id="log-box", classes="panel"):
                    yield ErrorLog(id="log")
            # The live monitor's panels, beside (or under) the engine's.
            with Vertical(id="monitor-col"):
                with Vertical(id="host-box", classes="panel"):
                    yield HostStrip(id="host")
                with Vertical(id="devices-box", classes="panel"):
                    yield DevicePanel(id="device-panel")
                with Vertical(id="chart-box", classes="panel"):
                    yield DeviceChart(id="device-chart")
                with Vertical(id="nodes-box", classes="panel"):
                    yield ClusterNodes(id="nodes")

    def on_mount(self) -> None:
        titles = {"#engine-box": "engine", "#log-box": "log", "#host-box": "host", "#devices-box": "devices",
                  "#chart-box": "device history", "#nodes-box": "nodes"}
        for selector, title in titles.items():
            self.query_one(selector).border_title = title
        self.query_one(DevicePanel).marks_selection = True
        self.set_class(self._poller is not None, "-agents")

    @property
    def _poller(self) -> Any:
        """The live cluster view's poller (``hwtui --agents``), shared with the nodes screen; None without agents."""
        nodes = getattr(self.app, "nodes_screen", None)
        return getattr(nodes, "poller", None)

    def _fit(self, width: int, height: int) -> None:
        short = height < SHORT
        self.set_class(width >= WIDE, "-wide")
        self.set_class(short, "-short")
        self.query_one(ClusterSummary).compact = short
        # Stacked and short: two device columns, so 8 GPUs take 4 lines (the monitor's strip goes
        # into the devices' title, which costs no line).
        self.query_one(DevicePanel).set_columns(2 if short and width < WIDE else 1)
        if not self._sampling_failed:
            self._title_devices()

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width, event.size.height)

    def on_screen_resume(self) -> None:
        self.started = True
        self._fit(self.size.width, self.size.height)
        self._start_polling()
        if self._poller is not None and self._nodes_timer is None:
            self._show_nodes()
            self._nodes_timer = self.set_interval(self._poller.interval, self._show_nodes)
        if self.hw.take_run_request():
            self.start_run()

    def _show_nodes(self) -> None:
        poller = self._poller
        if poller is None:
            return
        nodes = poller.statuses()
        self.query_one(ClusterNodes).show(nodes)
        stale = sum(1 for n in nodes if n.stale)
        self.query_one("#nodes-box").border_title = (f"nodes: {len(nodes)}, refresh {poller.interval:g} s"
                                                     + (f", {stale} STALE" if stale else ""))

    def on_screen_suspend(self) -> None:
        # Nobody is looking: stop sampling (the engine keeps running and its state keeps folding).
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None
        if self._nodes_timer is not None:
            self._nodes_timer.stop()
            self._nodes_timer = None
        self._polling = False

    # -- sampling -----------------------------------------------------------------------------
    def _start_polling(self) -> None:
        if not self._polling:
            self._polling = True
            self._poll()

    def _poll(self) -> None:
        self._poll_timer = None
        if self._polling:
            self._sample()

    @work(thread=True, exclusive=True, group="sampler", exit_on_error=False)
    def _sample(self) -> None:
        try:
            with self._sampler_lock:
                if self._sampler is None:
                    devices = self.hw.devices
                    self._sampler = MonitorSampler(self.hw.host, devices, self.hw.sampler_factory(self.hw.host, devices),
                                                   processes=False)
                samples, host, _ = self._sampler.sample()
            self.post_message(SamplesReady(list(samples), host=host))
        except Exception as exc:  # noqa: BLE001 - a failed poll shows, the next one retries
            self.post_message(SamplesReady([], f"{type(exc).__name__}: {exc}"))

    def on_samples_ready(self, msg: SamplesReady) -> None:
        box = self.query_one("#devices-box")
        if msg.error:
            self._sampling_failed = True
            box.border_title = f"devices (sampling failed: {msg.error})"
            self.query_one(HostStrip).show_error(msg.error)
        elif msg.samples:
            self._sampling_failed = False
            self.history.add(msg.samples)
            self.query_one(DevicePanel).update_from(self.history)
            if self.has_class("-wide"):
                self._show_device_chart()
        if msg.host is not None:
            self.query_one(HostStrip).show(msg.host)
            self._host = msg.host
        if not self._sampling_failed:
            self._title_devices()
        if self._polling:  # re-arm only now: the next poll starts a full interval after this one ended
            self._poll_timer = self.set_timer(self.hw.config.interval, self._poll)

    def _title_devices(self) -> None:
        # Short screens hide the host strip: its figures go into the devices' title, which costs no line.
        title = "devices"
        if self.has_class("-short") and self._host is not None:
            title += " - " + host_summary(self._host)
        box = self.query_one("#devices-box")
        if box.border_title != title:  # a title change repaints the box: only on a change
            box.border_title = title

    def _show_device_chart(self) -> None:
        key = self.query_one(DevicePanel).selected
        self.query_one(DeviceChart).show(self.history, key, self.hw.config.interval)
        self.query_one("#chart-box").border_title = f"device history: {key}" if key else "device history"

    def on_device_panel_selected(self, _msg: DevicePanel.Selected) -> None:
        if self.has_class("-wide"):
            self._show_device_chart()

    def shutdown(self) -> None:
        """Stop the engine and the sampler; safe to call twice (screen unmount, then app unmount)."""
        self.stop_engine(grace_s=2.0)
        self.close_sampler()

    def on_unmount(self) -> None:
        self.shutdown()

    def close_sampler(self) -> None:
        self._polling = False
        # A poll stuck in a vendor library must not hold the app open: give it a second.
        if not self._sampler_lock.acquire(timeout=1.0):
            return
        try:
            if self._sampler is not None:
                self._sampler.close()
        finally:
            self._sampler = None
            self._sampler_lock.release()

    # -- engine -------------------------------------------------------------------------------
    @property
    def engine_running(self) -> bool:
        with self._engine_lock:
            return self.engine is not None and self.engine.running

    def start_run(self) -> None:
        """Start the engine the Engine step configured (stopping a previous run first)."""
        if self.engine_running:
            self.notify("the engine is still running: s stops it first", severity="warning")
            return
        cfg = self.hw.config
        if self.hw.engine_stages is None and self.hw.replaying:
            why = hardware_not_here(cfg, self.hw.defaults)
            if why:
                msg = f"not started: {why}; choose device cpu (cpu:0,cpu:1 for training) to run CPU ranks here"
                self.state.add_log(msg, "warn")
                self.notify(msg, title="replay", severity="warning", timeout=10)
                self._paint()
                return
        workdir = self.hw.run_dir()
        factory = self.hw.engine_stages or build_stages
        stages = factory(cfg, self.hw.defaults, Path(workdir))
        self.state = RunState()
        self._seen_version = -1
        self._errors_notified = 0
        self._findings_shown = -1
        self._stop_requested = False
        self.set_class(cfg.mode == "cluster", "-cluster")
        self.refresh_bindings()
        self.query_one(ErrorLog).reset()
        for stage in stages:
            self.state.add_log("$ " + " ".join(stage.argv[2:] if stage.argv[1:2] == ["-m"] else stage.argv), "info")
        # Until the engine's first event picks its view, say that it is starting (not "no run yet").
        self.query_one("#view-idle", Static).update(f"starting the engine: {', '.join(st.name for st in stages)}...")
        self._run_engine(stages, self.state)
        self._paint()

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _run_engine(self, stages: list[Any], state: RunState) -> None:
        from hwtui.core.events import parse_line

        def on_stderr(line: str) -> None:
            state.add_stderr(line)
            self.post_message(EngineUpdated())

        for stage in stages:
            proc = EngineProcess(stage.argv, on_stderr)
            with self._engine_lock:
                if self._stop_requested:
                    return
                self.engine = proc
            try:
                proc.start()
            except (OSError, RuntimeError) as exc:
                state.add_log(f"cannot start {stage.name}: {exc}", "error")
                state.finish(127)
                self.post_message(EngineExited(127, stage.name))
                return
            for line in proc.lines():
                ev = parse_line(line)
                if ev is None:
                    continue
                errors_before = len(state.errors)
                state.apply(ev)
                self.post_message(EngineUpdated())
                if len(state.errors) > errors_before:
                    self.post_message(EngineError(state.errors[-1]))
            rc = proc.wait()
            if rc != 0 or proc.stopped or stage is stages[-1]:
                if proc.stopped:
                    state.mark_stopped()  # also when stopped by quitting: never a failure
                state.finish(rc)
                self.post_message(EngineExited(rc, stage.name))
                return
            state.add_log(f"{stage.name} finished", "info")

    def stop_engine(self, grace_s: float = 5.0) -> int | None:
        """Blocking: call from a worker thread (or at exit). SIGTERM, wait, then SIGKILL."""
        with self._engine_lock:
            self._stop_requested = True
            proc = self.engine
        return proc.stop(grace_s) if proc is not None else None

    def action_stop(self) -> None:
        if not self.engine_running:
            self.notify("no engine is running")
            return
        # Mark it before the signal: ranks dying of SIGTERM then read as the stop, not as errors.
        self.state.mark_stopped()
        self.notify("stopping the engine (SIGTERM)...")
        self.run_worker(self.stop_engine, thread=True, group="stop", exit_on_error=False)

    def action_rerun(self) -> None:
        if self.engine_running:
            self.notify("the engine is running: s stops it, then r starts it again", severity="warning")
            return
        cfg = self.hw.config
        if cfg.mode and (cfg.plan or cfg.weights or cfg.mode in ("train", "cluster")):
            self.start_run()
        else:
            self.notify("nothing to run yet: configure the engine in step 4")

    def action_toggle_log(self) -> None:
        self.toggle_class("-log-only")

    def on_engine_updated(self, _msg: EngineUpdated) -> None:
        # Coalesce: paint now if the last paint is old enough, otherwise once, a bit later.
        wait = 1.0 / MAX_FPS - (time.monotonic() - self._last_paint)
        if wait <= 0:
            self._paint()
        elif self._paint_timer is None:
            self._paint_timer = self.set_timer(wait, self._paint)

    def on_engine_error(self, msg: EngineError) -> None:
        self._errors_notified += 1
        if self._errors_notified <= 5:  # a storm of failures should not bury the screen in toasts
            self.notify(msg.text, title="engine error", severity="error", timeout=8)

    def on_engine_exited(self, msg: EngineExited) -> None:
        self._paint()
        if msg.returncode != 0 and not self._stop_requested:
            tail = [t for lvl, t in list(self.state.log)[-6:] if lvl in ("stderr", "error")]
            self.notify(f"{msg.stage} exited with status {msg.returncode}" + (f": {tail[-1]}" if tail else ""),
                        title="engine failed", severity="error", timeout=10)

    def _show_cluster_findings(self, state: RunState) -> None:
        """Mismatches as they arrive; every finding of the verdict once ``cluster.done`` came."""
        from hwtui.core.finding import Finding

        c = state.cluster
        raw = c.done.findings if c.done is not None else [m.finding for m in c.mismatches]
        raw = [f for f in raw if isinstance(f, dict)]
        key = len(raw) + (10**6 if c.done is not None else 0)
        if key == self._findings_shown:
            return
        self._findings_shown = key
        findings = []
        for f in raw:
            try:
                findings.append(Finding.from_dict(f))
            except (KeyError, TypeError, ValueError):
                continue  # a malformed finding is still in the log as the engine sent it
        table = self.query_one("#cluster-findings", FindingsList)
        table.show(findings)
        self.query_one("#cluster-detail", FindingDetail).show(table.current())

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        table = self.query_one("#cluster-findings", FindingsList)
        if event.data_table is table:
            self.query_one("#cluster-detail", FindingDetail).show(table.current())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Only the cluster view lists findings: elsewhere the key is hidden from the footer.
        if action == "copy_remedy":
            return self.has_class("-cluster")
        return True

    def action_copy_remedy(self) -> None:
        remedy = self.query_one("#cluster-detail", FindingDetail).remedy
        if not remedy:
            self.notify("this finding has no remedy to copy")
            return
        self.app.copy_to_clipboard(remedy)
        self.notify(f"copied: {remedy}", title="remedy")

    def _paint(self) -> None:
        self._paint_timer = None
        self._last_paint = time.monotonic()
        state = self.state
        # Every panel copies what it draws inside its show(), under this lock: Textual renders
        # later, while the reader thread goes on changing the state (tests/app/tui/test_paint_snapshot.py).
        with state.lock:
            if state.version == self._seen_version:
                return
            self._seen_version = state.version
            fraction, eta, label = state.progress()
            if state.stopped:
                status = "stopped"
            elif state.exit_code is None:
                status = "running" if self.engine is not None else "starting"
            else:
                ok = state.exit_code == 0 and not state.errors and state.done_ok is not False
                status = "done" if ok else "FAILED"
            self.query_one(ProgressEta).show(fraction, eta, label, status)
            switcher = self.query_one("#views", ContentSwitcher)
            engine_title = {"replicate": "replication", "train": "training", "cluster": "cluster test"}.get(state.mode or "", "engine")
            engine_box = self.query_one("#engine-box")
            if engine_box.border_title != engine_title:
                engine_box.border_title = engine_title
            if state.mode == "replicate":
                switcher.current = "view-replicate"
                self.query_one(BucketLanes).show(state.repl)
                self.query_one(ThroughputChart).show(state.repl)
            elif state.mode == "train":
                switcher.current = "view-train"
                self.query_one(WorkerTable).show(state.train)
                self.query_one(LossChart).show(state.train)
                self.query_one(MergeRounds).show(state.train)
            elif state.mode == "cluster":
                switcher.current = "view-cluster"
                self.query_one(ClusterSummary).show(state.cluster)
                self._show_cluster_findings(state)
            else:  # a new run before its first event: never the previous run's panels
                switcher.current = "view-idle"
            self.query_one(ErrorLog).catch_up(list(state.log), state.log_total)
            errors = len(state.errors)
        title = f"log ({errors} error{'s' if errors != 1 else ''})" if errors else "log"
        box = self.query_one("#log-box")
        if box.border_title != title:
            box.border_title = title
