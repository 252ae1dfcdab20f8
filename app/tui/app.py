"""The hwtui Textual app: a five-step wizard that ends on the live dashboard.

The app owns what the steps share (the host, detected devices, remembered choices) and the step
order; each step is its own screen module. Screens are installed once and switched, so going
Back keeps what a step already found instead of probing again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from textual.app import App
from textual.binding import Binding, BindingType

from hwtui.app.tui.config import TuiConfig
from hwtui.app.tui.defaults import engine_defaults
from hwtui.app.tui.device_sampler import make_sampler
from hwtui.app.tui.messages import RunRequested
from hwtui.widgets.step_bar import StepBar

if TYPE_CHECKING:
    from hwtui.app.tui.screens.run import RunScreen

STEPS = ("detect", "drivers", "environment", "engine", "run")


class HwtuiApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "hwtui"
    # ctrl+p: Textual's command palette (its "Change theme" entry is the theme picker). Every
    # action also has its own key.
    ENABLE_COMMAND_PALETTE = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?"),
        # Back to the live cluster view from any screen; only with `--agents` (see check_action).
        Binding("a", "nodes", "Nodes"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, host: Any, config: TuiConfig | None = None, *, config_file: Path | None = None,
                 engine_stages: Callable[..., list[Any]] | None = None,
                 sampler_factory: Callable[[Any, list[Any]], Any] | None = None,
                 host_args: list[str] | None = None, workdir: Path | None = None, start_step: str = "detect",
                 nodes_screen: Any = None):
        super().__init__()
        self.nodes_screen = nodes_screen  # `hwtui --agents ...`: the live cluster view (screens/nodes.py)
        self.host = host
        self.config = config or TuiConfig()
        self.config_file = config_file
        self.engine_stages = engine_stages  # None: the real `hwtui plan/replicate/train` commands
        self.sampler_factory = sampler_factory or make_sampler
        self.host_args = host_args or []  # ["--replay", FILE] so `hwtui env` sees the same machine
        self.workdir = workdir
        self.start_step = start_step
        self.devices: list[Any] = []
        self.devices_error = ""
        self._quitting = False
        self.run_screen: RunScreen | None = None
        self.run_wanted = False  # the Engine step asked for a run; the Run screen takes it when shown
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def replaying(self) -> bool:
        """The host is a recorded machine (``--replay``): its devices are not on this one."""
        from hwtui.probes.host import ReplayHost

        return isinstance(self.host, ReplayHost)

    @property
    def defaults(self) -> dict[str, Any]:
        return engine_defaults(self.devices)

    def on_mount(self) -> None:
        from hwtui.app.tui.screens.detect import DetectScreen
        from hwtui.app.tui.screens.drivers import DriversScreen
        from hwtui.app.tui.screens.engine import EngineScreen
        from hwtui.app.tui.screens.environment import EnvironmentScreen
        from hwtui.app.tui.screens.monitor import MonitorScreen
        from hwtui.app.tui.screens.run import RunScreen

        self.install_screen(MonitorScreen(), name="monitor")
        for name, cls in zip(STEPS, (DetectScreen, DriversScreen, EnvironmentScreen, EngineScreen, RunScreen), strict=True):
            self.install_screen(cls(), name=name)
        self.run_screen = cast("RunScreen", self.get_screen("run"))
        if self.nodes_screen is not None:
            self.install_screen(self.nodes_screen, name="nodes")
        self.push_screen("nodes" if self.nodes_screen is not None else self.start_step)
        if self.config.note:
            self.notify(self.config.note, severity="warning")

    # -- navigation ---------------------------------------------------------------------------
    def goto(self, step: str) -> None:
        self.switch_screen(step)

    def on_run_requested(self, _msg: RunRequested) -> None:
        # The Run screen may not be composed yet (first visit): it takes the request when shown.
        self.run_wanted = True
        self.goto("run")

    def on_step_bar_chosen(self, msg: StepBar.Chosen) -> None:
        self.goto(msg.step)

    def take_run_request(self) -> bool:
        wanted, self.run_wanted = self.run_wanted, False
        return wanted

    def step_offset(self, step: str, delta: int) -> str | None:
        i = STEPS.index(step) + delta
        if i < 0:
            return "monitor"  # back from the first step: the monitor the app opened on
        return STEPS[i] if i < len(STEPS) else None

    def run_dir(self) -> Path:
        """Where a run keeps its intermediate files (the plan made from weights)."""
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hwtui-run-")
            self.workdir = Path(self._tmp.name)
        return self.workdir

    def save_config(self) -> None:
        try:
            self.config.save(self.config_file)
        except OSError as exc:
            self.notify(f"could not save choices: {exc}", severity="warning")

    # -- actions ------------------------------------------------------------------------------
    def _nodes_elsewhere(self) -> bool:
        """There is a cluster view (`--agents`) and another screen shows."""
        return self.nodes_screen is not None and self.screen is not self.nodes_screen

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self._nodes_elsewhere() if action == "nodes" else True  # `a` is hidden where it means nothing

    def action_nodes(self) -> None:
        if self._nodes_elsewhere():
            self.switch_screen("nodes")

    def action_help(self) -> None:
        from hwtui.app.tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        """Stop the engine (SIGTERM, then SIGKILL after a grace period) before leaving."""
        if self._quitting:
            return
        self._quitting = True
        run = self.run_screen
        if run is not None and run.engine_running:
            self.notify("stopping the engine...")
            self.run_worker(self._stop_then_exit, thread=True, group="quit", exit_on_error=False)
        else:
            self.exit(0)

    def _stop_then_exit(self) -> None:
        if self.run_screen is not None:
            self.run_screen.stop_engine()
        self.call_from_thread(self.exit, 0)

    def on_unmount(self) -> None:
        # Last line of defence (an exception, a closed terminal): never leave an engine behind.
        # (Installed screens are already gone from the registry by now: use the reference.)
        if self.run_screen is not None:
            self.run_screen.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()
