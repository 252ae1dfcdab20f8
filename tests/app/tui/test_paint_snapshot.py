"""A panel draws the state it was shown, never the live state the engine's reader is still changing.

The Run screen calls each panel's ``show`` under ``RunState.lock``, and Textual renders later,
outside it, while the stream reader thread goes on folding events into the same state. A panel
that kept the live object and read it in ``render`` raised "Set changed size during iteration"
mid-run (the lanes' "receivers verifying" count walks a set the reader grows) and could draw a
header and lanes from two different moments. These tests show a panel part of a recorded stream,
fold the rest of it on another thread as the reader does, and require the panel to draw exactly
what it drew before, until the next ``show``.
"""

from __future__ import annotations

import io
import json
import sys
import threading
from pathlib import Path

from rich.console import Console
from textual.app import App, ComposeResult

from hwtui.app.tui.run_state import RunState
from hwtui.core.events import parse_line
from hwtui.widgets.bucket_lanes import BucketLanes
from hwtui.widgets.cluster_summary import ClusterSummary

DATA = Path(__file__).parent / "data"


class _Panels(App[None]):
    def compose(self) -> ComposeResult:
        yield BucketLanes()
        yield ClusterSummary()


def _plain(widget: BucketLanes | ClusterSummary) -> str:
    console = Console(width=98, no_color=True, file=io.StringIO())
    console.print(widget.render())
    out = console.file.getvalue()
    assert isinstance(out, str)
    return out


def _lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def _fold_on_the_readers_thread(state: RunState, lines: list[str]) -> None:
    reader = threading.Thread(target=lambda: [state.apply(parse_line(line)) for line in lines])
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive()


def _first_line_where(lines: list[str], kind: str, **fields: object) -> int:
    for i, line in enumerate(lines):
        raw = json.loads(line)
        if raw["kind"] == kind and all(raw.get(k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {kind} {fields} in the recording")


async def test_the_lanes_draw_what_they_were_shown_while_the_reader_moves_on():
    lines = _lines("real_replicate.jsonl")  # `hwtui replicate --nproc 3 --inflight 4`, 24 buckets
    # Mid-run: the source has sent bucket 2, so "receivers verifying" walks a set the reader grows.
    cut = _first_line_where(lines, "repl.bucket", bucket_id=6, state="staged")
    state = RunState()
    for line in lines[:cut]:
        state.apply(parse_line(line))
    async with _Panels().run_test(size=(100, 40)) as pilot:
        app_lanes = pilot.app.query_one(BucketLanes)
        with state.lock:
            app_lanes.show(state.repl)
            shown_sent, shown_done = len(state.repl.sent), state.repl.count("done")
        drawn = _plain(app_lanes)
        assert 0 < shown_done < 24 and shown_sent > shown_done, "the cut is mid-run, with buckets in flight"
        assert f"buckets {shown_done}/24" in drawn
        _fold_on_the_readers_thread(state, lines[cut:])
        assert state.repl.count("done") == 24 and len(state.repl.sent) > shown_sent
        assert _plain(app_lanes) == drawn, "the panel drew the live state, not the one it was shown"
        with state.lock:
            app_lanes.show(state.repl)
        assert "buckets 24/24" in _plain(app_lanes) and "receivers verifying 0" in _plain(app_lanes)


async def test_the_cluster_summary_draws_what_it_was_shown_while_the_reader_moves_on():
    lines = _lines("cluster_ok.jsonl")
    cut = _first_line_where(lines, "cluster.node")  # one rank reported, the other not yet
    state = RunState()
    for line in lines[: cut + 1]:
        state.apply(parse_line(line))
    async with _Panels().run_test(size=(100, 40)) as pilot:
        summary = pilot.app.query_one(ClusterSummary)
        with state.lock:
            summary.show(state.cluster)
        drawn = _plain(summary)
        assert "running" in drawn and "1 rank(s) reported" in drawn
        _fold_on_the_readers_thread(state, lines[cut + 1:])
        assert state.cluster.done is not None and len(state.cluster.nodes) == 2
        assert _plain(summary) == drawn, "the panel drew the live state, not the one it was shown"
        with state.lock:
            summary.show(state.cluster)
        assert "PASSED: 2 rank(s)" in _plain(summary)


async def test_painting_while_the_reader_folds_runs_never_fails():
    """The race itself, as the Run screen meets it: show under the lock, render outside it, while
    the reader folds the recorded run over and over; every drawing is whole. The interpreter
    switches threads every microsecond here (5 ms by default), so a render that reads the live
    state meets the reader mid-change within a few hundred drawings instead of once in a long run."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        await _paint_while_folding(_lines("real_replicate.jsonl"), drawings=300)
    finally:
        sys.setswitchinterval(switch)


async def _paint_while_folding(lines: list[str], drawings: int) -> None:
    state = RunState()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for line in lines:
                state.apply(parse_line(line))

    async with _Panels().run_test(size=(100, 40)) as pilot:
        lanes = pilot.app.query_one(BucketLanes)
        reader = threading.Thread(target=read)
        reader.start()
        try:
            for _ in range(drawings):
                with state.lock:
                    lanes.show(state.repl)
                header = _plain(lanes).splitlines()[0]
                assert header.startswith(("source window", "waiting for repl.start")), header
        finally:
            stop.set()
            reader.join(timeout=60)
        assert not reader.is_alive()
        with state.lock:
            lanes.show(state.repl)
        assert "buckets 24/24" in _plain(lanes)


async def test_what_remote_ranks_say_is_drawn_as_clean_lines():
    """A cluster test's node names, summaries and findings come from ranks on other machines:
    ESC sequences in them must not reach the terminal (Textual writes a Text's characters as is)."""
    from hwtui.core.finding import Finding, Status
    from hwtui.core.terminal_text import is_clean
    from hwtui.widgets.finding_detail import FindingDetail
    from hwtui.widgets.findings_list import FindingsList

    hostile = "evil\x1b]0;pwned\x07\x1b[2J\u202ename"
    state = RunState()
    for line in _lines("cluster_ok.jsonl"):
        raw = json.loads(line)
        if raw["kind"] == "cluster.node":
            raw["node"], raw["summary"] = hostile, hostile
        state.apply(parse_line(json.dumps(raw)))

    class Findings(App[None]):
        def compose(self) -> ComposeResult:
            yield ClusterSummary()
            yield FindingsList()
            yield FindingDetail()

    async with Findings().run_test(size=(100, 40)) as pilot:
        summary = pilot.app.query_one(ClusterSummary)
        with state.lock:
            summary.show(state.cluster)
        drawn = _plain(summary)
        assert "evilname" in drawn and all(is_clean(line) for line in drawn.splitlines()), repr(drawn)
        table = pilot.app.query_one(FindingsList)
        finding = Finding(id="cluster." + hostile, status=Status.FAIL, title=hostile,
                          detail=f"first {hostile}\nsecond line", remedy=f"export A=1\nrun {hostile}")
        table.show([finding])
        cells = [str(c) for c in table.get_row_at(0)]
        assert all(is_clean(c) for c in cells) and "evilname" in cells[2], cells
        detail = pilot.app.query_one(FindingDetail)
        detail.show(finding)
        shown = str(detail.query_one("#detail").render())
        assert all(is_clean(line) for line in shown.splitlines()) and "second line" in shown, repr(shown)
        assert detail.remedy == "export A=1\nrun evilname", "what c copies is clean too, its lines kept"
