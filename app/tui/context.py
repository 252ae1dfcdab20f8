"""What the screens may use of the app, as a typed Protocol.

Screens type ``self.hw`` against this instead of importing the App class: the App imports the
screens (to install them), so a screen importing the App would close an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hwtui.app.tui.config import TuiConfig


class AppContext(Protocol):
    host: Any  # hwtui.probes.host.Host
    config: TuiConfig
    devices: list[Any]
    devices_error: str
    engine_stages: Callable[..., list[Any]] | None
    sampler_factory: Callable[[Any, list[Any]], Any]
    host_args: list[str]

    @property
    def defaults(self) -> dict[str, Any]: ...

    @property
    def replaying(self) -> bool: ...

    def goto(self, step: str) -> None: ...

    def step_offset(self, step: str, delta: int) -> str | None: ...

    def save_config(self) -> None: ...

    def run_dir(self) -> Path: ...

    def take_run_request(self) -> bool: ...
