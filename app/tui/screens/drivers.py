"""Step 2, Drivers & wheels: kernel drivers, device nodes, vendor runtimes and the torch build."""

from __future__ import annotations

from hwtui.app.tui.screens._step import ChecksStep


class DriversScreen(ChecksStep):
    STEP = "drivers"
    AREAS = frozenset({"hardware", "gpu"})
    INTRO = "Verdicts on drivers, device nodes, vendor libraries and the torch wheel. c copies the remedy."
