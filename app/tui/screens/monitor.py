"""The monitor: what ``hwtui`` opens on. This machine's devices, host and device processes, live.

Devices with memory, utilisation, temperature and power history; the host's CPU, memory and
network throughput; the processes on each device (NVML where it answers, DRM fdinfo otherwise)
with their GPU %, CPU %, memory and age: sortable (``o``), filtered (``/``), as a tree (``t``),
and signalled (``k``: SIGTERM, then SIGKILL, each confirmed). The process table is as tall as
its rows; the selected device's history chart takes the rest of the screen wherever it has room
to be read (``g`` gives the chart the whole bottom). The wizard is one key away (``w``). Sampling
runs in a thread worker and re-arms a one-shot timer only after a tick is shown, so ticks never
overlap however slow a vendor call is.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any, ClassVar, cast

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static

from hwtui.app.tui.device_sampler import DeviceHistory, MonitorSampler
from hwtui.app.tui.messages import MonitorTick
from hwtui.app.tui.screens.process_modals import ConfirmSignal, FilterPrompt
from hwtui.widgets.device_chart import DeviceChart
from hwtui.widgets.device_panel import DevicePanel, detail_line
from hwtui.widgets.host_strip import HostStrip
from hwtui.widgets.process_table import ProcessTable

if TYPE_CHECKING:
    from hwtui.app.tui.context import AppContext

CHART_MIN = 8  # rows (border included) below which the chart is not shown beside the table


class MonitorScreen(Screen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("w", "wizard", "Wizard"),
        Binding("n", "wizard", "Next", show=False),
        Binding("g", "toggle_chart", "Chart"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("t", "tree", "Tree"),
        Binding("k", "signal", "Kill"),
    ]
    # The process table is as tall as its rows (half the bottom at most while the chart shows);
    # the chart below takes the rest when that is at least CHART_MIN rows (-split), else the table
    # has it all. ``g`` (-chart) gives the chart the whole bottom.
    DEFAULT_CSS = """
    MonitorScreen #title { height: 1; background: $panel; }
    MonitorScreen #host-box, MonitorScreen #devices-box, MonitorScreen ProcessTable, MonitorScreen #chart-box {
        border: round $primary; border-title-style: bold; padding: 0 1;
    }
    MonitorScreen #host-box { height: 3; }
    MonitorScreen #devices-box { height: auto; max-height: 60%; }
    MonitorScreen #devices-box DevicePanel { max-height: 100%; }
    MonitorScreen #device-detail { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    MonitorScreen #device-detail.-empty { display: none; }
    MonitorScreen #bottom { height: 1fr; layout: vertical; }
    MonitorScreen ProcessTable { height: auto; max-height: 100%; min-height: 3; }
    MonitorScreen.-split ProcessTable { max-height: 50%; }
    MonitorScreen #chart-box { display: none; height: 1fr; }
    MonitorScreen.-split #chart-box { display: block; }
    MonitorScreen.-chart #chart-box { display: block; }
    MonitorScreen.-chart ProcessTable { display: none; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.history = DeviceHistory()
        self._sampler: MonitorSampler | None = None
        self._timer: Timer | None = None
        self._polling = False
        self._termed: set[tuple[int, float | None]] = set()  # processes sent SIGTERM: k offers SIGKILL next
        self._detail_text: str | None = None
        self.ticks = 0

    @property
    def hw(self) -> AppContext:
        return cast("AppContext", self.app)

    def compose(self) -> ComposeResult:
        # Titles and settings are given here, on the widgets as they are made, not looked up in
        # on_mount: under load `?` on the cluster view once ran this screen's on_mount before its
        # children were there (NoMatches: DevicePanel) and the app died.
        yield Static(f" hwtui monitor - {self.hw.host.description}   w: wizard  ?: help  q: quit", id="title")
        with Vertical(id="host-box") as host_box:
            host_box.border_title = "host"
            yield HostStrip(id="host")
        with Vertical(id="devices-box") as devices_box:
            devices_box.border_title = "devices"
            panel = DevicePanel(id="monitor-devices")
            panel.marks_selection = True
            panel.dots = True
            yield panel
            yield Static("", id="device-detail", markup=False)  # the selected device's clocks, fan, PCIe, NVLink, ECC, throttle
        with Container(id="bottom"):
            processes = ProcessTable(id="processes")
            processes.border_title = "processes on devices"
            yield processes
            with Vertical(id="chart-box"):
                yield DeviceChart(id="device-chart")
        yield Footer()

    def on_resize(self, _event: events.Resize) -> None:
        self.call_after_refresh(self._layout_bottom)

    def _layout_bottom(self) -> None:
        """Chart below the table when the rows the table leaves are enough to read one."""
        bottom = self.query_one("#bottom").size.height
        table = self.query_one(ProcessTable)
        natural = table.virtual_size.height + 2  # rows, header, border
        split = bottom - min(natural, bottom // 2) >= CHART_MIN
        if split != self.has_class("-split"):
            self.set_class(split, "-split")
            self._show_chart()

    def _chart_shown(self) -> bool:
        return self.has_class("-split") or self.has_class("-chart")

    def _show_chart(self) -> None:
        if not self._chart_shown():
            return  # a chart nobody sees is not drawn (plotext costs milliseconds)
        key = self.query_one(DevicePanel).selected
        self.query_one(DeviceChart).show(self.history, key, self.hw.config.interval)
        title = f"device history: {key} (up/down or a click on the devices picks one)" if key else "device history"
        box = self.query_one("#chart-box")
        if box.border_title != title:
            box.border_title = title

    def on_device_panel_selected(self, _msg: DevicePanel.Selected) -> None:
        self._show_chart()
        self._show_detail()

    def _show_detail(self) -> None:
        key = self.query_one(DevicePanel).selected
        sample = self.history.latest.get(key) if key else None
        text = detail_line(sample) if sample is not None else ""
        detail = self.query_one("#device-detail", Static)
        if text != self._detail_text:  # an update repaints: only on a change
            self._detail_text = text
            detail.update(text)
            detail.set_class(not text, "-empty")

    def action_toggle_chart(self) -> None:
        self.toggle_class("-chart")
        self._show_chart()

    def action_filter(self) -> None:
        table = self.query_one(ProcessTable)

        def apply(text: str | None) -> None:
            if text is not None:
                table.set_filter(text)

        self.app.push_screen(FilterPrompt(table.filter_text), apply)

    def action_tree(self) -> None:
        self.query_one(ProcessTable).toggle_tree()

    def action_signal(self) -> None:
        """SIGTERM the process under the cursor; once it was sent, SIGKILL. Each asked first (y / n)."""
        proc: Any = self.query_one(ProcessTable).selected_process
        if proc is None:
            self.notify("no process selected (up/down in the process table picks one)", severity="warning")
            return
        if not self.hw.host.is_live:
            self.notify("a replayed machine's processes cannot be signalled", severity="warning")
            return
        ident = (proc.pid, getattr(proc, "started", None))
        sig = signal.SIGKILL if ident in self._termed else signal.SIGTERM
        command = str(proc.command)
        command = command if len(command) <= 60 else command[:59] + "…"
        question = f"Send {sig.name} to pid {proc.pid} ({proc.user}: {command})?"

        def answer(yes: bool | None) -> None:
            if not yes:
                return
            from hwtui.probes.processes import send_signal

            result = send_signal(proc.pid, ident[1], sig)
            if sig == signal.SIGTERM and result.endswith("sent to pid " + str(proc.pid)):
                self._termed.add(ident)
            self.notify(result)

        self.app.push_screen(ConfirmSignal(question), answer)

    def on_mount(self) -> None:
        self.call_after_refresh(self._layout_bottom)

    def on_screen_resume(self) -> None:
        if not self._polling:
            self._polling = True
            self._tick()

    def on_screen_suspend(self) -> None:
        self._polling = False
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    @work(thread=True, exclusive=True, group="monitor", exit_on_error=False)
    def _tick(self) -> None:
        try:
            if self._sampler is None:
                from hwtui.probes.inventory import detect_devices

                devices = self.hw.devices
                if not devices:
                    devices, _ = detect_devices(self.hw.host)
                    self.hw.devices = devices
                self._sampler = MonitorSampler(self.hw.host, devices, self.hw.sampler_factory(self.hw.host, devices))
            samples, host, procs = self._sampler.sample()
            self.post_message(MonitorTick(samples, host, procs))
        except Exception as exc:  # noqa: BLE001 - a failed tick shows; the next one retries
            self.post_message(MonitorTick([], None, [], f"{type(exc).__name__}: {exc}"))

    def on_monitor_tick(self, msg: MonitorTick) -> None:
        self.ticks += 1
        box = self.query_one("#devices-box")
        subtitle = f"sampling failed: {msg.error}" if msg.error else ""
        if box.border_subtitle != subtitle:  # setting it repaints the whole box: only on a change
            box.border_subtitle = subtitle
        if msg.error:
            self.query_one(HostStrip).show_error(msg.error)
        if not msg.error:
            self.history.add(msg.samples)
            self.query_one(DevicePanel).update_from(self.history)
            if msg.host is not None:
                self.query_one(HostStrip).show(msg.host)
            self.query_one(ProcessTable).show(msg.processes)
            self._show_chart()
            self._show_detail()
            # Decided on the sizes after this tick's layout (the devices panel and the table may
            # have changed height), not on the previous frame's.
            self.call_after_refresh(self._layout_bottom)
        if self._polling:
            self._timer = self.set_timer(self.hw.config.interval, self._rearm)

    def _rearm(self) -> None:
        self._timer = None
        if self._polling:
            self._tick()

    def action_wizard(self) -> None:
        self.hw.goto("detect")

    def close_sampler(self) -> None:
        self._polling = False
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def on_unmount(self) -> None:
        self.close_sampler()
