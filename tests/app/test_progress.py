"""Progress for plan, replicate and train (issue 26): % and ETA, taken from the engine's own events.

Each printed figure is checked against the event it came from: the printer reads no clock, so the
same events always print the same text.
"""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

from hwtui.app.cli import build_parser
from hwtui.app.output.progress import (
    LIVE,
    OFF,
    PLAIN,
    ProgressLine,
    eta_seconds,
    format_bytes,
    format_duration,
    mode_for,
)
from hwtui.core.events import parse_line
from tests import cli_proc


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- the progress line itself ------------------------------------------------------------------------

def test_mode_follows_the_stream_and_the_environment(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert mode_for(Tty()) == LIVE
    assert mode_for(io.StringIO()) == PLAIN  # a pipe, a file, a CI log
    assert mode_for(Tty(), verbosity=-1) == OFF
    monkeypatch.setenv("TERM", "dumb")
    assert mode_for(Tty()) == PLAIN
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("NO_COLOR", "1")
    assert mode_for(Tty()) == PLAIN


def test_plain_lines_are_throttled_on_the_engines_clock_and_end_complete():
    out = io.StringIO()
    p = ProgressLine(out, PLAIN, every=1.0)
    for i in range(11):  # ten seconds of engine time, an update every second... and many in between
        for frac in (0.0, 0.3, 0.6):
            p.update(i + frac, "job", (i + frac) * 10, 100, "x")
    p.update(10.0, "job", 100, 100, "x")
    p.update(10.5, "job", 100, 100, "x")  # complete twice: shown once
    lines = out.getvalue().splitlines()
    assert len(lines) == 11, lines
    assert lines[0] == "job   0%  x  ETA ?"
    assert lines[5] == "job  50%  x  ETA 5s"  # 50 of 100 in 5 s: 5 s more at that rate
    assert lines[-1] == "job 100%  x  done"
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_live_bar_redraws_in_place_and_lines_print_above_it():
    out = Tty()
    p = ProgressLine(out, LIVE, live_every=0.1)
    p.update(1.0, "job", 25, 100, "25/100")
    p.line("a result")
    p.update(2.0, "job", 50, 100, "50/100")
    p.close()
    text = out.getvalue()
    assert text.startswith("\r\x1b[Kjob [######..................]  25%  25/100  ETA 3s")
    # the line erases the bar, prints, and the bar comes back below it
    assert "\r\x1b[Ka result\njob [######" in text
    assert text.endswith("\r\x1b[Kjob [############............]  50%  50/100  ETA 2s\n")


def test_off_prints_nothing_but_permanent_lines():
    out = io.StringIO()
    p = ProgressLine(out, OFF)
    p.update(1.0, "job", 1, 2, "x")
    p.line("result")
    assert out.getvalue() == "result\n"


def test_durations():
    assert [format_duration(s) for s in (None, 0.4, 59, 61, 3599, 3600 * 2 + 120)] == ["?", "0s", "59s", "1m01s", "59m59s",
                                                                                       "2h02m"]
    assert eta_seconds(0, 10, 5) is None and eta_seconds(5, 10, 0) is None and eta_seconds(10, 10, 3) == 0


# -- global -v / -q ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "want"), [
    (["plan", "--weights", "w", "-o", "p"], 0),
    (["-q", "plan", "--weights", "w", "-o", "p"], -1),
    (["plan", "-q", "--weights", "w", "-o", "p"], -1),
    (["--quiet", "train"], -1),
    (["-v", "replicate", "--plan", "p"], 1),
    (["replicate", "--plan", "p", "-v"], 1),  # replicate's own -v, now the global one
    (["replicate", "--plan", "p", "--verbose"], 1),
    (["-v", "--check"], 1),
])
def test_verbosity_before_or_after_the_command(argv, want):
    assert build_parser().parse_args(argv).verbosity == want


# -- plan ----------------------------------------------------------------------------------------------

PLAN_LINE = re.compile(r"^plan +(\d+)%  (\S+ \S+)/(\S+ \S+)  (ETA \S+|done)  (hashing \w+ \(pass [12] of 2\))$")


def _plan_events(tmp_path, monkeypatch):
    from hwtui.engine.replication import plan as planmod
    from tests.engine.replication.helpers import files, make_model

    make_model(tmp_path / "m", big=400_000)
    monkeypatch.setattr(planmod, "PROGRESS_STEP", 64 << 10)  # many events from a small model
    events: list = []
    plan = planmod.build_plan_from_files(files(tmp_path / "m"), model="m", version="v1", bucket_bytes=96 << 10,
                                         on_event=events.append)
    quiet = planmod.build_plan_from_files(files(tmp_path / "m"), model="m", version="v1", bucket_bytes=96 << 10)
    assert plan.digest == quiet.digest  # reporting changes nothing in the plan
    return plan, events


def test_plan_events_count_every_byte_hashed(tmp_path, monkeypatch):
    plan, events = _plan_events(tmp_path, monkeypatch)
    assert len(events) > 10
    assert [e.phase for e in events] == sorted((e.phase for e in events), key=("tensors", "buckets").index)
    done = [e.bytes_done for e in events]
    assert done == sorted(done) and done[0] == 0
    # both passes: every tensor's bytes, then every bucket's
    assert events[-1].bytes_done == events[-1].total_bytes == plan["model_bytes"] + plan["total_bytes"]
    assert all(e.total_bytes == events[-1].total_bytes for e in events if e.phase == "buckets")
    assert [e.elapsed_s for e in events] == sorted(e.elapsed_s for e in events)
    # Each pass on its own: the tensors' bytes (the model), then the buckets' (what is sent).
    tensors = [e for e in events if e.phase == "tensors"]
    buckets = [e for e in events if e.phase == "buckets"]
    assert {e.pass_bytes for e in tensors} == {plan["model_bytes"]}
    assert {e.pass_bytes for e in buckets} == {plan["total_bytes"]}
    assert tensors[-1].pass_done == plan["model_bytes"] and buckets[-1].pass_done == plan["total_bytes"]
    assert all(e.pass_done == e.bytes_done for e in tensors)
    assert all(e.pass_done == e.bytes_done - plan["model_bytes"] for e in buckets)


def test_plan_progress_lines_are_the_events_figures(tmp_path, monkeypatch):
    from hwtui.app.commands.plan import PlanPrinter

    _, events = _plan_events(tmp_path, monkeypatch)
    out = io.StringIO()
    printer = PlanPrinter(out, verbosity=1, mode=PLAIN)  # -v: every event, so line i is event i
    for e in events:
        printer(e)
    lines = out.getvalue().splitlines()
    shown = [e for e in events if not (e.bytes_done >= e.total_bytes and e is not events[-1]
                                       and any(x.bytes_done >= x.total_bytes for x in events[:events.index(e)]))]
    assert len(lines) == len(shown)
    for line, e in zip(lines, shown, strict=True):
        m = PLAN_LINE.match(line)
        assert m, line
        assert int(m[1]) == int(100 * e.bytes_done / e.total_bytes)
        assert (m[2], m[3]) == (format_bytes(e.pass_done), format_bytes(e.pass_bytes)), "this pass's bytes"
        want_eta = "done" if e.bytes_done >= e.total_bytes else \
            f"ETA {format_duration(eta_seconds(e.bytes_done, e.total_bytes, e.elapsed_s))}"
        assert m[4] == want_eta
        assert m[5] == PlanPrinter.PHASES[e.phase]


def _cli(*argv, cwd):
    return cli_proc.run([sys.executable, "-m", "hwtui", *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_plan_cli_shows_progress_and_quiet_only_the_result(tmp_path):
    from tests.engine.replication.helpers import make_model

    make_model(tmp_path / "m")
    w = str(tmp_path / "m" / "model.safetensors")
    r = _cli("plan", "--weights", w, "-o", "a.plan", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert PLAN_LINE.match(lines[0]) and lines[-1].startswith("plan a.plan: ") and r.stderr == ""
    assert any(PLAN_LINE.match(x) and x.split()[1] == "100%" for x in lines)
    q = _cli("-q", "plan", "--weights", w, "-o", "b.plan", cwd=tmp_path)
    assert q.returncode == 0 and q.stdout.splitlines() == [q.stdout.strip()] and q.stdout.startswith("plan b.plan: ")


def test_plan_to_a_json_name_is_written_with_one_warning(tmp_path):
    from tests.engine.replication.helpers import make_model

    make_model(tmp_path / "m")
    r = _cli("-q", "plan", "--weights", str(tmp_path / "m" / "model.safetensors"), "-o", "x.plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (warning,) = r.stderr.strip().splitlines()
    assert warning.startswith("hwtui: warning: x.plan.json is a binary plan") and "*.plan" in warning
    assert (tmp_path / "x.plan.json").stat().st_size > 0


# -- replicate ---------------------------------------------------------------------------------------

REPL_LINE = re.compile(r"^replicating +(\d+)%  (\S+ \S+)/(\S+ \S+)  (ETA \S+|done)  ([\d.]+) GB/s  ([\d.]+) s$")


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_replicate_progress_lines_are_its_throughput_events(tmp_path):
    """A real run: every progress line printed is one of the run's own throughput events, % and ETA included."""
    from tests.engine.replication.helpers import make_model

    make_model(tmp_path / "m", big=2_000_000)
    assert _cli("plan", "--weights", str(tmp_path / "m" / "model.safetensors"), "--bucket-mb", "0.5", "-o", "m.plan",
                cwd=tmp_path).returncode == 0
    r = _cli("replicate", "--plan", "m.plan", "--nproc", "2", "--events", "ev.jsonl", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    throughput = [e for e in events if e.kind == "repl.throughput"]
    lines = [x for x in r.stdout.splitlines() if x.startswith("replicating ") and "%" in x]
    assert throughput and lines, r.stdout
    for line in lines:
        m = REPL_LINE.match(line)
        assert m, line
        matches = [e for e in throughput
                   if (format_bytes(e.bytes_done), format_bytes(e.total_bytes), f"{e.gbps:.2f}", f"{e.elapsed_s:.1f}")
                   == (m[2], m[3], m[5], m[6])]
        assert matches, line
        e = matches[0]
        assert int(m[1]) == int(100 * e.bytes_done / e.total_bytes)
        assert m[4] == ("done" if e.bytes_done >= e.total_bytes else
                        f"ETA {format_duration(eta_seconds(e.bytes_done, e.total_bytes, e.elapsed_s))}")
    assert lines[-1].split()[1] == "100%"
    quiet = _cli("-q", "replicate", "--plan", "m.plan", "--nproc", "2", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert [x.split(":")[0] for x in quiet.stdout.splitlines()] == ["done"]


# -- train -------------------------------------------------------------------------------------------

def _train_events(steps=20, every=5, workers=2, start_step=0, t0=1000.0):
    """A run as the engine reports it: start, worker reports every chunk, a merge every ``every`` steps."""
    from hwtui.engine.training.events import TrainDone, TrainMerge, TrainStart, TrainWorker

    evs: list = [TrainStart(workers=[{"rank": r, "device": f"cpu:{r}", "vendor": "CPU", "name": "CPU"} for r in range(workers)],
                            steps=steps, batch_size=16, balance="dynamic", merge_every=every, params=10,
                            start_step=start_step, t=t0)]
    t, chunks = t0, [0] * workers
    for rnd, step in enumerate(range(start_step + every, steps + 1, every), start=1):
        for _ in range(every):
            for r in range(workers):
                t += 0.5
                chunks[r] += 1
                evs.append(TrainWorker(rank=r, device=f"cpu:{r}", step=chunks[r], samples=16 * chunks[r], samples_per_s=32.0,
                                       loss=2.0, mem_used=None, mem_total=None, chunks_claimed=chunks[r], t=t))
        t += 1.0
        evs.append(TrainMerge(round=rnd, step=step, shares=[1 / workers] * workers, loss_merged=1.5,
                              loss_workers_mean=1.6, t=t))
    evs.append(TrainDone(ok=True, seconds=t - t0, samples=16 * sum(chunks), final_loss=1.5, report={}, t=t))
    return evs


@pytest.mark.parametrize("start_step", [0, 10])
def test_train_round_lines_carry_percent_and_eta_from_the_events(start_step):
    from hwtui.app.commands.train import _Printer

    evs = _train_events(start_step=start_step)
    out = io.StringIO()
    printer = _Printer(out, 0, PLAIN)
    for e in evs:
        printer(e)
    rounds = [x for x in out.getvalue().splitlines() if x.startswith("round ")]
    merges = [e for e in evs if e.kind == "train.merge"]
    assert len(rounds) == len(merges) == (20 - start_step) // 5
    for line, e in zip(rounds, merges, strict=True):
        done, total, elapsed = e.step - start_step, 20 - start_step, e.t - evs[0].t
        tail = "done" if done == total else f"ETA {format_duration(eta_seconds(done, total, elapsed))}"
        assert line.endswith(f"[{int(100 * done / total):3d}%  step {e.step}/20  {tail}]"), line
    assert out.getvalue().splitlines()[-1].startswith("done in ")


def test_train_live_bar_moves_between_merges_and_never_claims_an_unmerged_step():
    from hwtui.app.commands.train import _Printer

    evs = _train_events(steps=10, every=10)
    out = Tty()
    printer = _Printer(out, 0, LIVE)
    for e in evs:
        printer(e)
    bars = [m.group(1) for m in re.finditer(r"training \[[#.]+\] +(\d+)%", out.getvalue())]
    assert bars[0] == "0" and "50" in bars  # half the chunks of the only round: half way
    # all chunks trained but not yet merged: not 100% until the merge says so
    assert bars.count("100") == 1 and bars[-1] == "100"
    assert [int(b) for b in bars] == sorted(int(b) for b in bars)


def test_train_quiet_keeps_results_and_verbose_adds_workers():
    from hwtui.app.commands.train import _Printer

    evs = _train_events(steps=10, every=5)
    quiet, verbose = io.StringIO(), io.StringIO()
    q, v = _Printer(quiet, -1, OFF), _Printer(verbose, 1, PLAIN)
    for e in evs:
        q(e)
        v(e)
    assert [x.split()[0] for x in quiet.getvalue().splitlines()] == ["done"]
    assert sum(x.startswith("  worker ") for x in verbose.getvalue().splitlines()) == 20


def test_replicate_printer_quiet_keeps_only_results():
    from hwtui.app.commands.replicate import Printer
    from hwtui.core.events import LogEvent
    from hwtui.engine.replication.events import ReplDone, ReplStart, ReplThroughput

    out = io.StringIO()
    p = Printer(out, verbose=False, quiet=True)
    p(LogEvent(message="Using CPU broadcast transport (gloo)."))
    p(ReplStart(plan_digest="d", model="m", version="v", total_bytes=10, n_buckets=1, bucket_bytes=10, world_size=2,
                device="cpu", transport="gloo", window=1, chunk_bytes=10))
    p(ReplThroughput(gbps=1.0, bytes_done=10, total_bytes=10, elapsed_s=1.0))
    p(ReplDone(ok=True, bytes=10, seconds=1.0, gbps=1.0, report={"world_size": 2, "verify": True}))
    assert out.getvalue().splitlines() == [
        "done: 0.0 MB in 1.000 s = 1.00 GB/s, verified on 2 ranks; peak bucket memory 0.0 MiB"]


def test_events_round_trip_keeps_the_plan_event():
    from hwtui.engine.replication.events import PlanProgress

    ev = PlanProgress(phase="tensors", bytes_done=1, total_bytes=2, elapsed_s=0.5)
    assert parse_line(ev.to_json()) == ev
    assert json.loads(ev.to_json())["kind"] == "repl.plan"
