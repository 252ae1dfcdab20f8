"""The monitor: what ``hwtui`` opens on. This machine's devices, host and device processes, live.

Devices with memory, utilisation, temperature and power history; the host's CPU, memory and
network throughput; the processes on each device (NVML where it answers, DRM fdinfo otherwise),
sortable; the selected device's utilisation, temperature and power as a chart with axes (beside
the processes on wide terminals, ``g`` on narrow ones). The wizard is one key away (``w``). Sampling runs in a thread worker and re-arms a
one-shot timer only after a tick is shown, so ticks never overlap however slow a vendor call is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static

from hwtui.app.tui.device_sampler import DeviceHistory, MonitorSampler
from hwtui.app.tui.messages import MonitorTick
from hwtui.widgets.device_chart import DeviceChart
from hwtui.widgets.device_panel import DevicePanel
from hwtui.widgets.host_strip import HostStrip
from hwtui.widgets.process_table import ProcessTable

if TYPE_CHECKING:
    from hwtui.app.tui.context import AppContext

WIDE = 140  # columns from which the device chart sits beside the process table


class MonitorScreen(Screen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("w", "wizard", "Wizard"),
        Binding("n", "wizard", "Next", show=False),
        Binding("g", "toggle_chart", "Chart"),
    ]
    # Wide (>= WIDE columns): the selected device's history chart beside the process table;
    # narrower, ``g`` swaps the process table for the chart.
    DEFAULT_CSS = """
    MonitorScreen #title { height: 1; background: $panel; }
    MonitorScreen #host-box, MonitorScreen #devices-box, MonitorScreen ProcessTable, MonitorScreen #chart-box {
        border: round $primary; border-title-style: bold; padding: 0 1;
    }
    MonitorScreen #host-box { height: 3; }
    MonitorScreen #devices-box { height: auto; max-height: 60%; }
    MonitorScreen #devices-box DevicePanel { max-height: 100%; }
    MonitorScreen #bottom { height: 1fr; layout: vertical; }
    MonitorScreen.-wide #bottom { layout: horizontal; }
    MonitorScreen #chart-box { display: none; height: 1fr; }
    MonitorScreen.-wide #chart-box { display: block; width: 45%; }
    MonitorScreen.-chart #chart-box { display: block; }
    MonitorScreen.-chart ProcessTable { display: none; }
    MonitorScreen.-wide.-chart ProcessTable { display: block; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.history = DeviceHistory()
        self._sampler: MonitorSampler | None = None
        self._timer: Timer | None = None
        self._polling = False
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
            yield panel
        with Container(id="bottom"):
            processes = ProcessTable(id="processes")
            processes.border_title = "processes on devices"
            yield processes
            with Vertical(id="chart-box"):
                yield DeviceChart(id="device-chart")
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width >= WIDE, "-wide")
        self._show_chart()

    def _chart_shown(self) -> bool:
        return self.has_class("-wide") or self.has_class("-chart")

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

    def action_toggle_chart(self) -> None:
        self.toggle_class("-chart")
        self._show_chart()

    def on_mount(self) -> None:
        self.set_class(self.size.width >= WIDE, "-wide")

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
