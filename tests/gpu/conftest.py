"""GPU validation (issue 17): tests marked ``gpu`` run only where an NVIDIA GPU is present.

Elsewhere they are skipped with the reason, so CPU-only CI stays green and says what it did not
prove; the comparisons they rely on are pure functions tested on recorded answers
(test_agreement_recorded.py), so they keep running everywhere.
"""

from __future__ import annotations

import os
import shutil

import pytest


def gpu_missing_reason() -> str | None:
    """Why this machine cannot run the GPU validation, or None when it can."""
    if os.environ.get("HWTUI_GPU_CHECK") == "skip":
        return "HWTUI_GPU_CHECK=skip"
    if not os.path.exists("/proc/driver/nvidia/version"):
        return "no NVIDIA GPU here: /proc/driver/nvidia/version is absent (run `make gpu-check` on a machine with one)"
    if shutil.which("nvidia-smi") is None:
        return "the NVIDIA driver is loaded but nvidia-smi is not on PATH"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_missing_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=reason))
