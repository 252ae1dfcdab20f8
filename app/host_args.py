"""Turning --sysroot / --replay into a Host, with a one-line error for bad values.

Shared by the commands and the TUI's launch (``app.tui`` never imports ``app.commands``), so it
lives beside them, not among them."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from hwtui.core.errors import HwtuiError

if TYPE_CHECKING:  # probes are imported lazily (CLI start-up time)
    from hwtui.probes.host import Host


def host_from_args(args: argparse.Namespace) -> Host:
    from hwtui.probes.host import make_host

    sysroot, replay = getattr(args, "sysroot", None), getattr(args, "replay", None)
    if sysroot and replay:
        raise HwtuiError("--sysroot and --replay are alternatives: give one")
    try:
        return make_host(sysroot, replay)
    except ValueError as exc:
        raise HwtuiError(str(exc)) from None


def timeout_scale(args: argparse.Namespace) -> float:
    value = getattr(args, "timeout_scale", None)
    if value is None:
        raw = os.environ.get("HWTUI_PROBE_TIMEOUT_SCALE", "1")
        try:
            value = float(raw)
        except ValueError:
            raise HwtuiError(f"HWTUI_PROBE_TIMEOUT_SCALE={raw!r} is not a number") from None
    if not 0 < value <= 100:
        raise HwtuiError(f"timeout scale {value} out of range (0, 100]")
    return value
