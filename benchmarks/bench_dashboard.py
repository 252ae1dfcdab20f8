"""Benchmark: the Run dashboard (or the monitor) with 8 replayed devices refreshing at 1 Hz.

``--view monitor`` measures the monitor `hwtui` opens on, with a process list of 40 processes
over the 8 devices refreshed every tick, and reports the first paint (app start to the first
frame with the device panel drawn). ``--view run`` measures the Run screen, which carries the
monitor's host strip and device panel beside the engine's panels. From 140 columns (``--size
200x60``) both views also draw the selected device's history chart, built off the UI thread
within its CPU budget (widgets/plot_chart.py): its cost shows in the process CPU, not in the
UI-thread refresh.

Runs the app on Textual's headless driver and measures, per sampler tick:

* **one refresh** (target <= 5 ms): UI-thread CPU (``time.thread_time()`` of the event-loop
  thread) from the moment the loop starts dispatching the ``SamplesReady`` message until the end
  of the first screen update after it, i.e. the handler, the ``Update``/``Layout`` messages its
  ``refresh()`` calls post, the layout (if any), the compositor render of the dirty widgets, and
  the encoding of that update into terminal escape sequences. The headless driver skips that
  encoding (it writes nothing), so this benchmark does it itself on every update, as a real
  terminal would; only the ``write()`` to the tty is left out. Each tick also checks that the
  device panel really was painted in that window (otherwise the figure would time nothing);
* the parts of it: handler dispatch, compositor (layout + render), terminal encoding;
* all UI-thread CPU between two ticks, whatever it was for (context: timers, the pilot, idle);
* CPU used by the whole app process (all threads, the sampler's included) as % of one core
  (target <= 2 %).

Targets (issue 7): process CPU <= 2 % of one core; one refresh <= 5 ms of UI-thread time.

    .venv/bin/python benchmarks/bench_dashboard.py [--view run|monitor] [--seconds 15] [--size 120x40] [--snapshot FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class VaryingSampler:
    """The real Sampler on the replayed host, with figures nudged every poll so every row repaints."""

    def __init__(self, host, devices):
        from hwtui.probes.sampling import Sampler

        self.inner = Sampler(host, devices)
        self.n = 0

    def sample(self):
        self.n += 1
        out = self.inner.sample()
        for i, s in enumerate(out):
            s.util = float((self.n * 13 + i * 7) % 100)
            s.temp_c = 40.0 + (self.n + i) % 40
            s.power_w = 100.0 + (self.n * 37 + i) % 500
            if s.mem_total:
                s.mem_used = int(s.mem_total * (((self.n + i) % 10) / 10))
        return out

    def close(self):
        self.inner.close()


class TickProbe:
    """Thread-time accounting of each tick, installed by patching Textual at four points."""

    def __init__(self) -> None:
        self.refresh: list[float] = []  # one refresh, end to end
        self.handler: list[float] = []
        self.compositor: list[float] = []
        self.encode: list[float] = []
        self.between: list[float] = []  # all UI-thread CPU from one tick to the next
        self.unpainted = 0  # ticks whose window ended without the device panel being drawn
        self.first_paint: float | None = None  # monotonic time of the first frame with the device panel
        self._start: float | None = None
        self._last_tick: float | None = None
        self._painted = False
        self._comp = self._enc = 0.0
        self._undo: list[tuple[object, str, object]] = []

    def reset(self) -> None:
        for series in (self.refresh, self.handler, self.compositor, self.encode, self.between):
            series.clear()
        self.unpainted = 0
        self._last_tick = None

    def _patch(self, owner: object, name: str, wrapper) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def install(self) -> None:
        from textual._compositor import CompositorUpdate
        from textual.app import App
        from textual.message_pump import MessagePump
        from textual.screen import Screen
        from textual.widget import Widget

        from hwtui.app.tui.messages import MonitorTick, SamplesReady
        from hwtui.widgets.device_panel import DevicePanel

        probe = self

        def dispatch(original):
            async def wrapped(pump, message):
                if not isinstance(message, (SamplesReady, MonitorTick)) or not isinstance(pump, Screen):
                    return await original(pump, message)
                now = time.thread_time()
                if probe._last_tick is not None:
                    probe.between.append(now - probe._last_tick)
                probe._last_tick = now
                if probe._start is not None:  # the previous tick never reached a screen update
                    probe.unpainted += 1
                probe._start, probe._painted, probe._comp, probe._enc = now, False, 0.0, 0.0
                try:
                    return await original(pump, message)
                finally:
                    probe.handler.append(time.thread_time() - now)
            return wrapped

        def timer_update(original):
            def wrapped(screen):
                t0 = time.thread_time()
                try:
                    return original(screen)
                finally:
                    end = time.thread_time()
                    if probe._start is not None:
                        probe._comp += end - t0 - probe._enc_in_update
                        if probe._painted:
                            if probe.first_paint is None:
                                probe.first_paint = time.monotonic()
                            probe.refresh.append(end - probe._start)
                            probe.compositor.append(probe._comp)
                            probe.encode.append(probe._enc)
                            probe._start = None
                    probe._enc_in_update = 0.0
            return wrapped

        def render_lines(original):
            def wrapped(widget, crop):
                if probe._start is not None and not probe._painted and any(isinstance(w, DevicePanel) for w in widget.ancestors_with_self):
                    probe._painted = True
                return original(widget, crop)
            return wrapped

        def display(original):
            def wrapped(app, screen, renderable):
                # The headless driver writes nothing; encode the update as a terminal driver would.
                if isinstance(renderable, CompositorUpdate) and app.is_headless:
                    t0 = time.thread_time()
                    renderable.render_segments(app.console)
                    spent = time.thread_time() - t0
                    probe._enc += spent
                    probe._enc_in_update += spent
                return original(app, screen, renderable)
            return wrapped

        self._enc_in_update = 0.0
        self._patch(MessagePump, "_dispatch_message", dispatch)
        self._patch(Screen, "_on_timer_update", timer_update)
        self._patch(Widget, "render_lines", render_lines)
        self._patch(App, "_display", display)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _ms(values: list[float], fn) -> float:
    return 1000 * fn(values) if values else float("nan")


def fake_processes(host, devices, nvml=None, handles=None, **_kwargs):
    """40 processes over the devices (a busy 8-GPU box): the table is rebuilt every tick."""
    from hwtui.probes.processes import DeviceProcess

    keys = [d.device for d in devices if d.device] or ["cpu"]
    fake_processes.ticks = getattr(fake_processes, "ticks", 0) + 1  # type: ignore[attr-defined]
    t = fake_processes.ticks  # type: ignore[attr-defined]
    # Memory moves every tick (as it does on a busy box), so the table has cells to update.
    return [DeviceProcess(keys[i % len(keys)], 1000 + i, f"user{i % 5}", ((i * 37 + t) % 80) << 30,
                          f"python train.py --rank {i} --config configs/run{i % 7}.yaml",
                          float((i * 13 + t) % 100), float((i * 7 + t) % 400), (2 + i % 9) << 30, 3600.0 + t,
                          1000 if i % 8 else 1, 1.7e9) for i in range(40)]


async def measure(snapshot: Path, seconds: float, size: tuple[int, int], view: str = "run") -> dict[str, float]:
    os.environ.setdefault("XDG_CONFIG_HOME", tempfile.mkdtemp(prefix="hwtui-bench-"))
    import hwtui.probes.processes
    from hwtui.app.tui.app import HwtuiApp
    from hwtui.app.tui.config import TuiConfig
    from hwtui.probes.host import ReplayHost
    from hwtui.widgets.device_panel import DevicePanel

    probe = TickProbe()
    probe.install()
    real_processes = hwtui.probes.processes.device_processes
    try:
        if view == "monitor":
            hwtui.probes.processes.device_processes = fake_processes
        app = HwtuiApp(ReplayHost.load(snapshot), TuiConfig(interval=1.0), sampler_factory=VaryingSampler,
                       start_step="monitor" if view == "monitor" else "detect")
        started = time.monotonic()
        async with app.run_test(size=size) as pilot:
            while view == "run" and not app.devices:
                await pilot.pause(0.05)
            if view == "run":
                app.goto("run")
            while len(probe.handler) < 3:  # warm up: first layouts done, caches filled
                await pilot.pause(0.1)
            probe.reset()
            cpu0, wall0 = time.process_time(), time.monotonic()
            await pilot.pause(seconds)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            panel = app.screen.query_one(DevicePanel)
            rows = len(getattr(panel, "keys", None) or getattr(panel, "_rows", ()))
    finally:
        probe.uninstall()
        hwtui.probes.processes.device_processes = real_processes
    med, top = statistics.median, max
    return {
        "first_paint_s": (probe.first_paint - started) if probe.first_paint is not None else float("nan"),
        "devices": rows, "cells": size[0] * size[1], "seconds": wall, "ticks": len(probe.handler),
        "painted_ticks": len(probe.refresh),
        "unpainted_ticks": probe.unpainted,
        "process_cpu_pct": 100.0 * cpu / wall,
        "refresh_ms_median": _ms(probe.refresh, med), "refresh_ms_max": _ms(probe.refresh, top),
        "handler_ms_median": _ms(probe.handler, med), "handler_ms_max": _ms(probe.handler, top),
        "compositor_ms_median": _ms(probe.compositor, med), "compositor_ms_max": _ms(probe.compositor, top),
        "encode_ms_median": _ms(probe.encode, med), "encode_ms_max": _ms(probe.encode, top),
        "ui_cpu_between_ticks_ms_median": _ms(probe.between, med), "ui_cpu_between_ticks_ms_max": _ms(probe.between, top),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=REPO / "docs" / "examples" / "h100x8.snapshot.json")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--size", default="120x40", help="terminal WxH (default 120x40: all 8 devices visible)")
    parser.add_argument("--view", choices=("run", "monitor"), default="run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    r = asyncio.run(measure(args.snapshot, args.seconds, (w, h), args.view))
    if args.json:
        print(json.dumps(r))
        return 0
    what = "monitor with 40 device processes" if args.view == "monitor" else "dashboard"
    print(f"{what}, {r['devices']} sampled rows (8 GPUs + CPU), 1 Hz, {args.size}, {r['seconds']:.1f} s, {r['ticks']} ticks "
          f"({r['painted_ticks']} with the device panel repainted)")
    print(f"  first paint (start to devices): {r['first_paint_s'] * 1000:.0f} ms")
    print(f"  app process CPU between ticks : {r['process_cpu_pct']:.2f} % of one core   (target <= 2 %)")
    target_ms = 8 if r.get("cells", 0) > 120 * 40 else 5  # issue 25: <= 5 ms at 80x24, <= 8 ms at 200x60
    print(f"  one refresh, UI-thread CPU    : median {r['refresh_ms_median']:.2f} ms, max {r['refresh_ms_max']:.2f} ms   "
          f"(target <= {target_ms} ms)")
    print(f"    handler dispatch            : median {r['handler_ms_median']:.2f} ms, max {r['handler_ms_max']:.2f} ms")
    print(f"    compositor (layout, render) : median {r['compositor_ms_median']:.2f} ms, max {r['compositor_ms_max']:.2f} ms")
    print(f"    terminal encoding           : median {r['encode_ms_median']:.2f} ms, max {r['encode_ms_max']:.2f} ms")
    print(f"  all UI-thread CPU tick to tick: median {r['ui_cpu_between_ticks_ms_median']:.2f} ms, "
          f"max {r['ui_cpu_between_ticks_ms_max']:.2f} ms   (context: includes timers, the test pilot, idle)")
    if r["unpainted_ticks"] or r["painted_ticks"] < r["ticks"] - 1:
        print(f"  WARNING: {r['unpainted_ticks']} tick(s) ended without the device panel being painted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
