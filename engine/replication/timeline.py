"""Where a replication's transfer time goes, per rank and per bucket, from the events the ranks emit.

Nothing here measures anything: every number is read from the ranks' own events (``--events``
JSON lines) -- the bucket states (``repl.bucket``: when a receive was posted and ended, when a copy
and a verification ended, and how long each took) and the steps the states do not show
(``repl.span``: the source hashing a bucket, a host leader announcing one, a follower waiting for
that announcement and mapping its leader's copy) -- plus, where given, each rank's report row (its
path, and the CPU it and the host spent during its transfer: ``transfer_cpu``).

A :class:`Step` is one rank busy with one phase of one bucket over ``[start, end]`` (wall clock,
the events' own ``t``). The phases, by path:

- source: ``send`` (posted .. done), ``hash`` (its check of the bucket, beside the send);
- network (a host leader, or any receiver of a broadcast): ``receive`` (from when the previous
  receive ended, or the post if later, to its end: the bytes arriving), ``verify``, ``announce``;
- host-copy (a leader's follower): ``wait`` (for the announcement), ``copy``, ``verify``, ``map``;
- same-host: ``copy``, ``verify``.
"""

from __future__ import annotations

import os
import resource
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PHASE_ORDER = ("transfer", "send", "hash", "receive", "wait", "map", "copy", "verify", "announce")


@dataclass(frozen=True)
class Step:
    rank: int
    bucket: int  # -1: not one bucket
    phase: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def steps_from_events(events: Iterable[Mapping[str, Any]], paths: Mapping[int, str] | None = None) -> list[Step]:
    """Every rank's steps, from its ``repl.bucket`` and ``repl.span`` events (others are ignored).

    ``paths``: rank -> its path (the report's ``ranks[].path``); a rank not named is read as a
    receiver of the network, unless its events say otherwise (a ``staged`` state: the source; a
    ``wait`` span: a follower).
    """
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for ev in events:
        rank = ev.get("rank")
        if ev.get("kind") in ("repl.bucket", "repl.span") and isinstance(rank, int) and _num(ev.get("t")) is not None:
            by_rank.setdefault(rank, []).append(ev)
    steps: list[Step] = []
    for rank, evs in sorted(by_rank.items()):
        evs.sort(key=lambda e: float(e["t"]))
        path = (paths or {}).get(rank) or _guess_path(evs)
        steps.extend(_rank_steps(rank, path, evs))
    return steps


def _guess_path(evs: list[Mapping[str, Any]]) -> str:
    if any(e.get("state") == "staged" for e in evs):
        return "source"
    if any(e.get("phase") == "wait" for e in evs):
        return "host-copy"
    return "network"


def _rank_steps(rank: int, path: str, evs: list[Mapping[str, Any]]) -> list[Step]:
    steps: list[Step] = []
    posted: dict[int, float] = {}
    last_receive_end: float | None = None
    for ev in evs:
        t, secs, b = float(ev["t"]), _num(ev.get("seconds")) or 0.0, ev.get("bucket_id")
        if not isinstance(b, int):
            continue
        if ev.get("kind") == "repl.span":
            steps.append(Step(rank, b, str(ev.get("phase")), t - secs, t))
            continue
        state = ev.get("state")
        if state == "inflight":
            posted[b] = t
        elif state == "verifying":
            if path == "network":
                # The state's seconds run from the post to the bucket's arrival (a group of
                # buckets arrives together, before the first of them is verified). Buckets arrive
                # one after another on the one connection: a bucket's bytes flow from when the
                # previous arrival ended (or its post, if later) to its own arrival.
                start = posted.get(b)
                arrived = start + secs if start is not None else t
                if start is None:
                    start = t - secs
                if last_receive_end is not None:
                    start = max(start, last_receive_end)
                steps.append(Step(rank, b, "receive", min(start, arrived), arrived))
                last_receive_end = max(arrived, last_receive_end or arrived)
            else:
                steps.append(Step(rank, b, "copy", t - secs, t))
        elif state in ("done", "failed"):
            if path == "source":
                start = posted.get(b)
                if start is not None:
                    steps.append(Step(rank, b, "send", start, t))
            else:
                steps.append(Step(rank, b, "verify", t - secs, t))
    return steps


def summarize(steps: list[Step]) -> dict[int, dict[str, float]]:
    """rank -> phase -> seconds (summed over buckets)."""
    out: dict[int, dict[str, float]] = {}
    for s in steps:
        row = out.setdefault(s.rank, {})
        row[s.phase] = row.get(s.phase, 0.0) + s.seconds
    return out


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def render(steps: list[Step], *, paths: Mapping[int, str] | None = None, total_bytes: int = 0,
           cpu: Mapping[int, Mapping[str, Any]] | None = None, per_bucket: bool = True) -> str:
    """The timeline as text: per rank its phases (sum, and the span first start..last end), the
    CPU it and the host spent, and per bucket when each rank finished each phase (ms from the
    first step)."""
    if not steps:
        return "timeline: no bucket events"
    t0 = min(s.start for s in steps)
    ms = lambda x: (x - t0) * 1000  # noqa: E731 - local shorthand
    sums = summarize(steps)
    lines = ["timeline (ms from the first step; per phase: busy ms summed over buckets, and first start-last end):"]
    for rank in sorted(sums):
        mine = [s for s in steps if s.rank == rank]
        lines.append(_rank_line(rank, mine, sums[rank], (paths or {}).get(rank, "?"), total_bytes,
                                (cpu or {}).get(rank) or {}, ms))
    host = _host_line(cpu or {})
    if host:
        lines.append(host)
    if per_bucket:
        lines.extend(_bucket_table(steps, ms))
    return "\n".join(lines)


def _rank_line(rank: int, mine: list[Step], sums: Mapping[str, float], path: str, total_bytes: int,
               c: Mapping[str, Any], ms: Any) -> str:
    parts = []
    for phase in sorted(sums, key=lambda p: PHASE_ORDER.index(p) if p in PHASE_ORDER else 99):
        ph = [s for s in mine if s.phase == phase]
        busy = _union([(s.start, s.end) for s in ph])
        parts.append(f"{phase} {sums[phase] * 1000:.0f}"
                     + (f" (union {busy * 1000:.0f})" if abs(busy - sums[phase]) > 0.002 else "")
                     + f" [{ms(min(s.start for s in ph)):.0f}-{ms(max(s.end for s in ph)):.0f}]")
    span = max(s.end for s in mine) - min(s.start for s in mine)
    rate = f", {total_bytes / span / 1e9:.2f} GB/s" if total_bytes and span > 0 else ""
    cpu_txt = f"; cpu {c['process_s']:.2f} s" if _num(c.get("process_s")) is not None else ""
    return f"  rank {rank} {path:9} {span * 1000:6.0f} ms{rate}: {', '.join(parts)}{cpu_txt}"


def _host_line(cpu: Mapping[int, Mapping[str, Any]]) -> str | None:
    host = [c for c in cpu.values() if _num(c.get("host_busy_s")) is not None and _num(c.get("wall_s"))]
    if not host:
        return None
    h = max(host, key=lambda c: float(c["wall_s"]))
    cores = int(h.get("cores") or 1)
    return (f"  host: {float(h['host_busy_s']):.2f} busy core-seconds of {cores} x {float(h['wall_s']):.2f} s "
            f"during the longest transfer ({100 * float(h['host_busy_s']) / (cores * float(h['wall_s'])):.0f}% "
            f"of the cores; hwtui's ranks {sum(float(c.get('process_s') or 0) for c in cpu.values()):.2f} "
            "of them, the rest other work and the kernel's network softirqs)")


def _bucket_table(steps: list[Step], ms: Any) -> list[str]:
    cols = sorted({(s.rank, s.phase) for s in steps if s.bucket >= 0},
                  key=lambda rp: (rp[0], PHASE_ORDER.index(rp[1]) if rp[1] in PHASE_ORDER else 99))
    end = {(s.rank, s.phase, s.bucket): s.end for s in steps}
    buckets = sorted({s.bucket for s in steps if s.bucket >= 0})
    lines = ["  per bucket, when each rank ended each phase (ms):",
             "    bucket " + " ".join(f"{f'r{r}.{p}':>12}" for r, p in cols)]
    for b in buckets:
        cells = [end.get((r, p, b)) for r, p in cols]
        lines.append(f"    {b:6} " + " ".join(f"{ms(c):12.0f}" if c is not None else f"{'-':>12}" for c in cells))
    return lines


def follower_lag(steps: list[Step], leader: int, follower: int) -> dict[str, float]:
    """Medians (s) of how far a follower trails its leader per bucket: from the leader's verify end
    to the follower's copy start, and to its verify end."""
    lv = {s.bucket: s.end for s in steps if s.rank == leader and s.phase == "verify"}
    fc = {s.bucket: s.start for s in steps if s.rank == follower and s.phase == "copy"}
    fv = {s.bucket: s.end for s in steps if s.rank == follower and s.phase == "verify"}
    common = sorted(set(lv) & set(fc) & set(fv))
    if not common:
        return {}
    return {"to_copy_start": statistics.median(fc[b] - lv[b] for b in common),
            "to_verified": statistics.median(fv[b] - lv[b] for b in common)}


# ------------------------------------------------------------------ CPU during the transfer


def cpu_sample() -> tuple[float, float, float, float, float]:
    """(this process's CPU seconds, all threads; the host's busy CPU seconds; a wall clock reading;
    this process's system (kernel) CPU seconds; the host's irq + softirq CPU seconds)."""
    import time

    ru = resource.getrusage(resource.RUSAGE_SELF)
    busy, irq = _host_busy()
    return ru.ru_utime + ru.ru_stime, busy, time.perf_counter(), ru.ru_stime, irq


def _host_busy() -> tuple[float, float]:
    """Busy CPU seconds of the whole host since boot (/proc/stat: everything but idle and iowait),
    and the irq + softirq part of them (the kernel's network receive work runs there)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()[1:]
        ticks = [int(x) for x in fields[:8]]
    except (OSError, ValueError):
        return 0.0, 0.0
    hz = float(os.sysconf("SC_CLK_TCK"))
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, (ticks[5] + ticks[6]) / hz


def cpu_between(a: tuple[float, ...], b: tuple[float, ...]) -> dict[str, float | int]:
    """What the report row's ``transfer_cpu`` holds: this rank's CPU seconds (and the kernel's part
    of them: its sockets' copies, and the network softirqs that ran in its context), the host's
    busy core-seconds (and their irq/softirq part) and the wall seconds between two samples, and
    the host's cores."""
    out: dict[str, float | int] = {"process_s": round(b[0] - a[0], 4), "host_busy_s": round(b[1] - a[1], 4),
                                   "wall_s": round(b[2] - a[2], 4), "cores": os.cpu_count() or 1}
    if len(a) >= 5 and len(b) >= 5:
        out["process_sys_s"] = round(b[3] - a[3], 4)
        out["host_softirq_s"] = round(b[4] - a[4], 4)
    return out
