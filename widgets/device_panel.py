"""Every sampled device in ONE widget: key, memory bar with used/total, util / temp / power sparklines.

Why one widget: with a label, a row container, a memory bar and a sparkline widget per device,
a 1 Hz refresh of 8 GPUs made Textual update, render and composite ~47 widgets, which alone was
over the dashboard's 5 ms UI-thread budget (issue 7). Here a refresh stores a reference to the
history and marks one widget dirty; its lines are drawn once per tick, lazily on the first
``render_line`` after it, with the pure functions of ``memory_bar`` and ``sparkline_panel``
(nvitop draws its device panel the same way). Drawing all rows together also lets the columns
line up across devices.

One line per device when the width allows a readable bar and sparklines; otherwise two (memory
on the first, sparklines under it). The panel scrolls when it is given less height than it needs.
With ``columns = 2`` (the Run screen at 80x24) the devices are drawn in two side-by-side columns,
one compact line each (bar, used/total, the latest figures without sparklines), so 8 GPUs take 4
or 5 lines. One row is *selected* (click, or up/down when focused): views show its history in a
chart (:class:`DevicePanel.Selected`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from hwtui.core.terminal_text import clean
from hwtui.widgets.memory_bar import memory_label, memory_segments
from hwtui.widgets.sparkline_panel import METRICS, metric_fixed_width, metric_segments, metric_value

if TYPE_CHECKING:  # the probes' types only; a widget module imports no probe code
    from hwtui.probes.sampling import DeviceHistoryView, DeviceSample

    # One device: its key, newest sample and recent readings per metric.
    _Row = tuple[str, DeviceSample, Mapping[str, Sequence[float | None]]]

KEY_MAX = 12  # a longer device key is cut: the full name is in the row's tooltip
MIN_BAR, MIN_SPARK = 4, 4  # below these the one-line layout stops being readable: go to two lines


@dataclass(frozen=True)
class _Layout:
    two_lines: bool
    key: int  # key column, its trailing space included
    bar: int
    label: int  # memory label, right-aligned
    spark: int  # each sparkline; 0: compact (the latest figures only)
    values: tuple[int, ...]  # each metric's value column


COLUMN_GAP = 2  # cells between the two columns


class DevicePanel(ScrollView, can_focus=True):
    DEFAULT_CSS = "DevicePanel { height: auto; max-height: 9; overflow-x: hidden; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "select(-1)", "Previous device", show=False),
        Binding("down", "select(1)", "Next device", show=False),
    ]

    class Selected(Message):
        """The selected device changed (its key, as in ``keys``)."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.columns = 1  # 2: devices in two side-by-side columns (short screens)
        self.selected: str | None = None  # the device whose history a chart shows
        self.marks_selection = False  # True where a chart follows the selection: its key is drawn reversed
        self.dots = False  # True: the part of a sparkline history has not reached yet is a dim dotted baseline
        self.keys: tuple[str, ...] = ()  # the devices shown, in order
        self._history: DeviceHistoryView | None = None
        self._two_lines = False
        self._strips: list[Strip] | None = None  # this tick's lines; None: draw on the next render
        self._drawn_width = -1
        self._base = Style()
        self._tooltip_row = -1

    # -- data ---------------------------------------------------------------------------------
    def update_from(self, history: DeviceHistoryView) -> None:
        """Show ``history`` (a DeviceHistory): O(1) here, the drawing happens at the next repaint."""
        self._history = history
        self.keys = tuple(history.keys())
        if self.keys and self.selected not in self.keys:
            self.selected = self.keys[0]
            self.post_message(self.Selected(self.selected))
        self._strips = None
        self._sync_height()
        self.refresh()

    def lines(self, width: int | None = None) -> list[str]:
        """The panel's text, one string per line (what tests and screen readers get)."""
        width = self.scrollable_content_region.width if width is None else width
        return [strip.text for strip in self._draw(width, Style())]

    # -- layout -------------------------------------------------------------------------------
    def _rows(self) -> list[_Row]:
        history = self._history
        return [(key, history.latest[key], history.series[key]) for key in self.keys] if history else []

    def set_columns(self, columns: int) -> None:
        if columns != self.columns:
            self.columns = columns
            self._strips = None
            self._sync_height()
            self.refresh()

    def _column_width(self, width: int) -> int:
        return width if self.columns == 1 else max((width - COLUMN_GAP) // 2, 1)

    def _layout(self, width: int, rows: list[_Row], two_lines: bool | None = None) -> _Layout:
        key = min(max((len(k) for k, _, _ in rows), default=3), KEY_MAX) + 1
        label = max((len(memory_label(s.mem_used, s.mem_total)) for _, s, _ in rows), default=5)
        values = tuple(max((len(metric_value(getattr(s, m.attr, None), m.unit)) for _, s, _ in rows), default=2)
                       for m in METRICS)
        if self.columns > 1:  # compact: one line per device, the latest figures only
            fixed = sum(1 + w for w in values)
            return _Layout(False, key, max(width - key - 1 - label - fixed, 1), label, 0, values)
        metrics_fixed = sum(metric_fixed_width(m, w) for m, w in zip(METRICS, values, strict=True))
        flex = width - key - 1 - label - metrics_fixed
        if two_lines is None:
            two_lines = flex < MIN_BAR + len(METRICS) * MIN_SPARK
        if two_lines:
            spark = max((width - max(key - 2, 0) - metrics_fixed) // len(METRICS), 1)
            return _Layout(True, key, max(width - key - 1 - label, 1), label, spark, values)
        spark = max(flex * 4 // 5 // len(METRICS), MIN_SPARK)
        return _Layout(False, key, max(flex - spark * len(METRICS), MIN_BAR), label, spark, values)

    def _sync_height(self) -> None:
        # Decided on the width without the scrollbar gutter, so a scrollbar appearing cannot flip
        # the layout (and the height with it) back and forth.
        width = self._column_width(self.size.width)
        two_lines = self._layout(width, self._rows()).two_lines if self.size.width else False
        per_column = -(-len(self.keys) // self.columns)
        height = per_column * (2 if two_lines else 1)
        self._two_lines = two_lines
        if self.virtual_size.height != height:
            self.virtual_size = Size(0, height)

    def on_resize(self, _event: events.Resize) -> None:
        self._sync_height()
        self._strips = None

    # -- drawing ------------------------------------------------------------------------------
    def _draw(self, width: int, base: Style) -> list[Strip]:
        rows = self._rows()
        if not rows or width <= 0:
            return []
        if self.columns > 1:
            col_w = self._column_width(width)
            left = self._draw_rows(rows[: -(-len(rows) // 2)], rows, col_w, base)
            right = self._draw_rows(rows[-(-len(rows) // 2):], rows, col_w, base)
            gap = Segment(" " * COLUMN_GAP, base)
            return [Strip([*lhs, gap, *(right[i] if i < len(right) else Strip.blank(col_w, base))]).adjust_cell_length(width, base)
                    for i, lhs in enumerate(left)]
        return self._draw_rows(rows, rows, width, base)

    def _draw_rows(self, rows: list[_Row], every: list[_Row],
                   width: int, base: Style) -> list[Strip]:
        lay = self._layout(width, every, self._two_lines)  # laid out over every row: columns line up
        selected_style = base + Style(reverse=True)
        strips = []
        for key, sample, series in rows:
            mark = selected_style if self.marks_selection and key == self.selected else base
            head = [Segment(key[: lay.key - 1].ljust(lay.key), mark)]
            head += memory_segments(sample.mem_used, sample.mem_total, lay.bar, lay.label, base)
            tail: list[Segment] = []
            for metric, value_width in zip(METRICS, lay.values, strict=True):
                if lay.spark == 0:  # compact: the latest value only (an absent sensor stays blank)
                    values = series[metric.attr]
                    known = any(v is not None for v in values)
                    text = metric_value(values[-1] if values else None, metric.unit) if known else ""
                    tail.append(Segment(" " + text.rjust(value_width), base))
                    continue
                tail += metric_segments(metric, series[metric.attr], lay.spark, value_width, base,
                                        getattr(sample, "power_limit_w", None), self.dots)
            if lay.two_lines:
                strips.append(Strip(head).adjust_cell_length(width, base))
                strips.append(Strip([Segment(" " * max(lay.key - 2, 0), base), *tail]).adjust_cell_length(width, base))
            else:
                strips.append(Strip(head + tail).adjust_cell_length(width, base))
        return strips

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width  # narrower while the scrollbar shows
        if self._strips is None or self._drawn_width != width:
            self._base = self.rich_style
            self._strips, self._drawn_width = self._draw(width, self._base), width
        index = y + self.scroll_offset.y
        return self._strips[index] if 0 <= index < len(self._strips) else Strip.blank(width, self._base)

    def notify_style_update(self) -> None:
        # Theme, NO_COLOR toggle or a class change on an ancestor: the cached lines carry old styles.
        super().notify_style_update()
        self._strips = None

    def _row_at(self, x: int, y: int) -> int:
        """Index in ``keys`` of the device drawn at content offset (x, y), or -1."""
        row = (y + self.scroll_offset.y) // (2 if self._two_lines else 1)
        if self.columns > 1 and x >= self._column_width(self.size.width) + COLUMN_GAP // 2:
            row += -(-len(self.keys) // 2)
        return row if 0 <= row < len(self.keys) else -1

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None:
            self._select(self._row_at(offset.x, offset.y))

    def action_select(self, delta: int) -> None:
        if self.keys:
            current = self.keys.index(self.selected) if self.selected in self.keys else 0
            self._select(min(max(current + delta, 0), len(self.keys) - 1))

    def _select(self, row: int) -> None:
        if 0 <= row < len(self.keys) and self.keys[row] != self.selected:
            self.selected = self.keys[row]
            self._strips = None
            self.refresh()
            self.post_message(self.Selected(self.selected))

    def on_mouse_move(self, event: events.MouseMove) -> None:
        # The full device name ("NVIDIA H100 80GB HBM3") as the tooltip of the row under the pointer.
        row = self._row_at(event.x, event.y)
        if row != self._tooltip_row:
            self._tooltip_row = row
            sample = self._history.latest.get(self.keys[row]) if self._history and 0 <= row < len(self.keys) else None
            self.tooltip = getattr(sample, "name", None) if sample is not None else None


def _num(value: Any) -> float | None:
    """A recorded figure as a number; None for anything else (a replay is untrusted input)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def rate_kb(kb_per_s: float) -> str:
    """NVML's KB/s as KB/s, MB/s or GB/s (decimal, as nvidia-smi)."""
    if kb_per_s >= 1e6:
        return f"{kb_per_s / 1e6:.1f} GB/s"
    if kb_per_s >= 1e3:
        return f"{kb_per_s / 1e3:.1f} MB/s"
    return f"{kb_per_s:.0f} KB/s"


def detail_line(sample: DeviceSample) -> str:
    """The selected device's other figures, those it has: clocks, fan, PCIe link and traffic, NVLink,
    ECC errors and why its clocks are held down (NVML's clocks-event reasons)."""
    parts = [str(sample.key)]
    sm, mem = _num(getattr(sample, "sm_clock_mhz", None)), _num(getattr(sample, "mem_clock_mhz", None))
    if sm is not None or mem is not None:
        core = "sm" if str(sample.key).startswith("cuda") else "gfx"  # NVIDIA's SM clock; amdgpu sclk, Intel GT
        parts.append("clocks " + " ".join(f"{name} {v:.0f}MHz" for name, v in ((core, sm), ("mem", mem)) if v is not None))
    if (fan := _num(getattr(sample, "fan_pct", None))) is not None:
        parts.append(f"fan {fan:.0f}%")
    gen, width = _num(getattr(sample, "pcie_gen", None)), _num(getattr(sample, "pcie_width", None))
    rx, tx = _num(getattr(sample, "pcie_rx_kbps", None)), _num(getattr(sample, "pcie_tx_kbps", None))
    if gen is not None or rx is not None or tx is not None:
        link = f"PCIe gen{gen:.0f}" + (f" x{width:.0f}" if width is not None else "") if gen is not None else "PCIe"
        traffic = [f"{name} {rate_kb(v)}" for name, v in (("rx", rx), ("tx", tx)) if v is not None]
        parts.append(" ".join([link, *traffic]))
    up = _num(getattr(sample, "nvlink_up", None))
    if up is not None:
        nrx, ntx = _num(getattr(sample, "nvlink_rx_kbps", None)), _num(getattr(sample, "nvlink_tx_kbps", None))
        traffic = [f"{name} {rate_kb(v * 1.024)}" for name, v in (("rx", nrx), ("tx", ntx)) if v is not None]
        parts.append(" ".join([f"NVLink {up:.0f} up", *traffic]))
    unc, cor = _num(getattr(sample, "ecc_uncorrected", None)), _num(getattr(sample, "ecc_corrected", None))
    if unc is not None or cor is not None:
        parts.append("ECC " + " ".join(f"{v:.0f} {name}" for name, v in (("uncorr", unc), ("corr", cor)) if v is not None))
    throttle = getattr(sample, "throttle", None)
    if isinstance(throttle, tuple | list):
        parts.append("clocks held: " + (", ".join(str(r) for r in throttle) if throttle else "no"))
    # A replayed snapshot's strings (the reasons, the key) are untrusted: one clean line.
    return clean("  ".join(parts), 400) if len(parts) > 1 else ""
