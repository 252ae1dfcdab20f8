"""Benchmark: the Run dashboard with 8 replayed devices refreshing at 1 Hz.

Measures, on the headless driver (everything but the terminal write):

* CPU used by the whole app process (all threads) between ticks, as % of one core;
* UI-thread CPU per tick: ``time.thread_time()`` of the event-loop thread from one poll's
  message to the next, which covers the handler, the widgets' render and the compositor;
* the refresh handler itself (fold the samples, update the rows), wall time per call.

Targets (issue 7): process CPU <= 2 % of one core; one refresh <= 5 ms of UI-thread time.

    .venv/bin/python benchmarks/bench_dashboard.py [--seconds 15] [--snapshot docs/examples/h100x8.snapshot.json]
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


async def measure(snapshot: Path, seconds: float, size: tuple[int, int]) -> dict[str, float]:
    os.environ.setdefault("XDG_CONFIG_HOME", tempfile.mkdtemp(prefix="hwtui-bench-"))
    from hwtui.app.tui.app import HwtuiApp
    from hwtui.app.tui.config import TuiConfig
    from hwtui.app.tui.screens.run import RunScreen
    from hwtui.probes.host import ReplayHost

    ticks: list[float] = []  # UI-thread CPU between consecutive polls
    handler: list[float] = []
    last = [None]
    original = RunScreen.on_samples_ready

    def timed(self, msg):
        now = time.thread_time()
        if last[0] is not None:
            ticks.append(now - last[0])
        last[0] = now
        t0 = time.perf_counter()
        original(self, msg)
        handler.append(time.perf_counter() - t0)

    RunScreen.on_samples_ready = timed
    app = HwtuiApp(ReplayHost.load(snapshot), TuiConfig(interval=1.0), sampler_factory=VaryingSampler)
    async with app.run_test(size=size) as pilot:
        while not app.devices:
            await pilot.pause(0.05)
        app.goto("run")
        while len(handler) < 3:  # warm up: rows mounted, first layouts done
            await pilot.pause(0.1)
        ticks.clear()
        handler.clear()
        cpu0, wall0 = time.process_time(), time.monotonic()
        await pilot.pause(seconds)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        rows = len(app.screen.query_one("#device-panel")._rows)
    RunScreen.on_samples_ready = original
    return {
        "devices": rows, "seconds": wall, "ticks": len(handler),
        "process_cpu_pct": 100.0 * cpu / wall,
        "ui_cpu_per_tick_ms_median": 1000 * statistics.median(ticks) if ticks else float("nan"),
        "ui_cpu_per_tick_ms_max": 1000 * max(ticks) if ticks else float("nan"),
        "handler_ms_median": 1000 * statistics.median(handler), "handler_ms_max": 1000 * max(handler),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=REPO / "docs" / "examples" / "h100x8.snapshot.json")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--size", default="120x40", help="terminal WxH (default 120x40: all 8 devices visible)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    r = asyncio.run(measure(args.snapshot, args.seconds, (w, h)))
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"dashboard, {r['devices']} sampled rows (8 GPUs + CPU), 1 Hz, {args.size}, {r['seconds']:.1f} s, {r['ticks']} ticks")
    print(f"  app process CPU between ticks : {r['process_cpu_pct']:.2f} % of one core   (target <= 2 %)")
    print(f"  UI-thread CPU per tick        : median {r['ui_cpu_per_tick_ms_median']:.2f} ms, "
          f"max {r['ui_cpu_per_tick_ms_max']:.2f} ms   (target <= 5 ms)")
    print(f"  refresh handler (wall)        : median {r['handler_ms_median']:.2f} ms, max {r['handler_ms_max']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
