"""The host in one line: CPU use with its history, memory, and network throughput (rx / tx)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widget import Widget

from hwtui.widgets._draw import bar, sparkline

if TYPE_CHECKING:  # the probes' types only; a widget module imports no probe code
    from hwtui.probes.host_counters import HostSample

HISTORY = 120


def rate_text(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def host_summary(s: HostSample) -> str:
    """The host in a few words, for a panel's title where there is no line to spare."""
    cpu = "-" if s.cpu_percent is None else f"{s.cpu_percent:.0f}%"
    used = "?" if s.mem_used is None else f"{s.mem_used / 2**30:.1f}"
    mem = f"{used}/{s.mem_total / 2**30:.1f}G" if s.mem_total else "-"
    return f"host CPU {cpu}  mem {mem}  rx {rate_text(s.rx_bytes_per_s)} tx {rate_text(s.tx_bytes_per_s)}"


class HostStrip(Widget):
    DEFAULT_CSS = "HostStrip { height: 1; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sample: HostSample | None = None
        self.error: str | None = None  # why the last sample failed, shown until one arrives
        self.cpu_history: deque[float | None] = deque(maxlen=HISTORY)

    def show(self, sample: HostSample) -> None:
        self.sample = sample
        self.error = None
        self.cpu_history.append(sample.cpu_percent)
        self.refresh()

    def show_error(self, error: str) -> None:
        """A failed sample: said in one line where the figures go, never "first sample..." forever."""
        self.error = " ".join("".join(c if c.isprintable() else " " for c in error).split())[:300]
        self.refresh()

    def render(self) -> Text:
        s = self.sample
        if s is None and self.error:
            return Text(f"host: sampling failed: {self.error}", style="red", no_wrap=True, overflow="ellipsis")
        if s is None:
            return Text("host: first sample...", style="dim")
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("CPU ", style="bold")
        text.append("  -  " if s.cpu_percent is None else f"{s.cpu_percent:3.0f}% ")
        spark_w = max(min(self.size.width // 5, 30), 4)
        text.append(sparkline(list(self.cpu_history), spark_w, 0.0, 100.0), style="cyan")
        text.append("  mem ", style="bold")
        if s.mem_total:
            if s.mem_used is not None:
                text.append(bar(s.mem_used / s.mem_total, 8), style="green")
                text.append(f" {s.mem_used / 2**30:.1f}G")
            else:
                text.append("?")
            text.append(f"/{s.mem_total / 2**30:.1f}G")
        else:
            text.append("-")
        text.append("  net ", style="bold")
        text.append(f"rx {rate_text(s.rx_bytes_per_s)}  tx {rate_text(s.tx_bytes_per_s)}")
        return text
