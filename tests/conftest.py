"""Every test, and every process a test starts, imports hwtui from the tree the tests sit in.

pytest puts the repository root first on sys.path (pyproject's ``pythonpath``), where hwtui/ links
the root folders; exporting it as PYTHONPATH makes children (engine ranks, the CLI run as
``python -m hwtui.app``, probe children) read the same tree, never whatever an editable install of
another clone points at. tests/test_packaging.py proves it from a copy of the tree.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))

# numpy with a one-thread BLAS pool, so that this process (single-threaded without xdist) may fork
# the ranks the engine tests launch in-process (hwtui.core.forking never forks a threaded process).
from hwtui.engine.rank_fork import quiet_numpy  # noqa: E402

quiet_numpy()

from hwtui.core import forking  # noqa: E402
from tests import cli_proc  # noqa: E402

# The property tests draw the same examples on every run (derandomize): a suite that passes must
# pass again on the same tree, under any load. Exploring for new counter-examples is a separate,
# deliberate run: `HWTUI_HYPOTHESIS=explore` (random draws, more of them), which found the chart
# ticks' float bugs (tests/app/tui/test_chart_ticks.py).
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, database=None)
    _hypothesis_settings.register_profile("explore", max_examples=5000, deadline=None)
    _hypothesis_settings.load_profile("explore" if os.environ.get("HWTUI_HYPOTHESIS") == "explore" else "ci")
except ImportError:  # a bare install runs no property test
    pass


# -- the order modules are claimed in -----------------------------------------------------------------
# `make test` runs four pytest processes that claim whole modules from one queue (tests/shards.py),
# in the order collected here: the slowest modules first (longest first), so that the slow
# few-test modules that run real process worlds (a push with agents killed mid-way, a training run)
# start at once and the many short modules fill the other processes' time at the end. (Under
# `pytest -n 3 --dist loadscope --no-loadscope-reorder` the same order applies.)
# tests/module_seconds.txt records what each slow module took; a module not listed there counts as
# quick and keeps its place after the listed ones.
MODULE_SECONDS = Path(__file__).with_name("module_seconds.txt")


def _module_seconds() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in MODULE_SECONDS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            seconds, module = line.split()
            out[module] = float(seconds)
    return out


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds = _module_seconds()
    # Stable: a module's tests keep their order (and stay together), quick modules theirs.
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0.0))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything collection imported (torch, textual, transformers: millions of objects) goes to
    the permanent generation, and the youngest generation is collected every 20,000 allocations
    instead of 700. Why: the TUI tests allocate a lot in a process that holds all of that, and
    py-spy put 27 % of a snapshot module's CPU in the collector; the two together took the module
    from 17.5 to 13.3 CPU-s. What the tests create afterwards is still collected; ranks forked from
    here freeze the whole heap they inherit (hwtui.core.forking), and nothing a test asserts
    depends on when a cycle is collected."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    # The zygote the tests' CLI processes are forked from (tests/cli_proc.py), instead of each
    # exec'ing and importing torch again: it imports while the shard's first tests run.
    if (why := cli_proc.start()) is not None and cli_proc.EXEC_ENV not in why:
        print(f"tests/cli_proc.py: no zygote, every CLI a test starts is exec'd: {why}", file=sys.stderr)


# -- no thread of torch's in the test process ---------------------------------------------------------
# A test that builds a model in this process runs torch ops, and torch's intra-op pool then starts
# its worker threads for good (2 cores: one more thread). hwtui never forks a process with a second
# thread (hwtui.core.forking), so every in-process launch after that test would exec its ranks and
# pay `import torch` per rank. One intra-op thread here; ranks set their own count after the fork.
# tqdm (pulled in by transformers when a test loads a model here) starts a monitor thread with its
# first progress bar, also for good: off.
try:
    import tqdm

    tqdm.tqdm.monitor_interval = 0
except ImportError:
    pass


# torch is imported here, once, so that no test imports it mid-way and runs an op with the default
# pool before the hook below could set it (every shard imports torch during collection anyway).
try:
    import torch as _torch

    _torch.set_num_threads(1)
except ImportError:
    pass


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    _outlive_transient_threads()


def _outlive_transient_threads(bound_s: float = 1.0) -> None:
    """Before a test, wait (bounded) until threads an earlier test left behind have ended.

    Why: a test's library threads (an event loop's executor, a server's handler) end a moment after
    the test does (a per-test thread count showed them in 30 modules), and a launch that comes
    meanwhile sees a process with threads: it execs every rank instead of forking it
    (hwtui.core.forking) and pays `import torch` per rank. (The 50 CPU-s a fresh clone paid in three
    modules was worse: forking's refusal stuck for good after one such launch, fixed there.) By
    state, with forking's own wait: threads still there after ``bound_s`` are remembered as lasting
    (a test left them for good) and never waited for again, here or by a launcher.
    """
    forking.settled_thread_count(bound_s, python_threads=True)
