"""Every test, and every process a test starts, imports hwtui from the tree the tests sit in.

pytest puts the repository root first on sys.path (pyproject's ``pythonpath``), where hwtui/ links
the root folders; exporting it as PYTHONPATH makes children (engine ranks, the CLI run as
``python -m hwtui.app``, probe children) read the same tree, never whatever an editable install of
another clone points at. tests/test_packaging.py proves it from a copy of the tree.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))

# numpy with a one-thread BLAS pool, so that this process (single-threaded without xdist) may fork
# the ranks the engine tests launch in-process (hwtui.core.forking never forks a threaded process).
from hwtui.engine.rank_fork import quiet_numpy  # noqa: E402

quiet_numpy()


# -- the order modules are handed to xdist's workers ------------------------------------------------
# `make test` runs `-n 3 --dist loadscope --no-loadscope-reorder`: a module's tests stay on one
# worker (its module-scoped worlds start once), and modules go out in the order collected. xdist's
# default reorder sorts modules by their number of tests, which put the few-test modules that run
# real process worlds (a push with agents killed mid-way, a training run) last, where the slowest
# one kept one worker busy long after the other had finished. Collecting the slowest modules
# first (longest first) lets the many short modules fill the other worker's gaps at the end.
# tests/module_seconds.txt records what each slow module took (`pytest --durations`); a module not
# listed there counts as quick and keeps its place after the listed ones.
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
