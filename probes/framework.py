"""Collectors gather facts, rules turn facts into findings, the runner keeps both on a leash.

A *collector* reads the machine (through the host) and returns a JSON-able fact; it may be slow
(a child process importing torch) so every collector runs in its own daemon thread with its own
timeout. A *rule* is a pure function of the collected facts. Splitting the two keeps rules
trivially testable on recorded facts and lets one slow runtime probe feed many verdicts.

The runner never lets a probe take hwtui down: an exception, a hang past the timeout, or a child
process that crashes each turns into an ``error`` finding naming the probe.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hwtui.core.finding import Finding, Status
from hwtui.probes.host import FactUnavailable, Host


@dataclass(frozen=True)
class Collector:
    name: str
    fn: Callable[[Host], Any]
    area: str
    timeout: float = 10.0


@dataclass(frozen=True)
class Rule:
    name: str
    fn: Callable[[Facts], Iterable[Finding]]
    area: str
    needs: tuple[str, ...] = ()


@dataclass
class Facts:
    """What the collectors produced, by collector name. Failed collectors are absent."""

    values: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    host: Host | None = None

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


@dataclass
class CheckResult:
    findings: list[Finding]
    facts: Facts
    duration_s: float

    @property
    def worst(self) -> Status:
        return max((f.status for f in self.findings), key=lambda s: s.rank, default=Status.PASS)


class _Outcome:
    __slots__ = ("value", "exc", "tb", "done")

    def __init__(self) -> None:
        self.value: Any = None
        self.exc: BaseException | None = None
        self.tb = ""
        self.done = threading.Event()


def one_line(text: str) -> str:
    """An exception's text on one line (a message may hold newlines from a recorded value)."""
    return " ".join(text.split())


def where_raised(exc: BaseException) -> str:
    """One line naming where ``exc`` was raised (file:line in function), never a traceback.

    A finding is read by people and parsed by tools: a multi-line traceback in its detail broke
    both (and leaked source paths into reports). The place is enough to report the bug with.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "raised where no Python frame shows"
    last = frames[-1]
    path = last.filename.replace("\\", "/")
    short = "/".join(path.split("/")[-2:])
    return f"raised at {short}:{last.lineno} in {last.name}"


def _collect_in_thread(collector: Collector, host: Host) -> _Outcome:
    outcome = _Outcome()

    def target() -> None:
        try:
            outcome.value = collector.fn(host)
        except BaseException as exc:  # noqa: BLE001 - a probe must never take hwtui down
            outcome.exc = exc
            outcome.tb = where_raised(exc)
        finally:
            outcome.done.set()

    # Daemon threads: a probe stuck in a syscall cannot be killed, but it must not keep the
    # process alive once the report is out either.
    threading.Thread(target=target, name=f"probe-{collector.name}", daemon=True).start()
    return outcome


def collect(host: Host, collectors: Iterable[Collector], timeout_scale: float = 1.0) -> tuple[Facts, list[Finding]]:
    """Run collectors concurrently; return the facts and an error/skip finding per failure."""
    collectors = list(collectors)
    started = time.monotonic()
    outcomes = [(c, _collect_in_thread(c, host)) for c in collectors]
    facts = Facts(host=host)
    problems: list[Finding] = []
    for collector, outcome in outcomes:
        deadline = started + collector.timeout * timeout_scale
        finished = outcome.done.wait(max(0.0, deadline - time.monotonic()))
        fid = f"hwtui.probe.{collector.name}"
        if not finished:
            msg = f"probe {collector.name!r} did not finish within {collector.timeout * timeout_scale:.1f} s"
            facts.problems[collector.name] = msg
            problems.append(Finding(fid, Status.ERROR, msg, "The probe was abandoned; other checks went on without its facts.",
                                    "Re-run with HWTUI_PROBE_TIMEOUT_SCALE=3 on a slow or loaded machine", area=collector.area))
        elif isinstance(outcome.exc, FactUnavailable):
            facts.problems[collector.name] = str(outcome.exc)
            problems.append(Finding(fid, Status.SKIP, f"{collector.name}: runtime facts not available here",
                                    str(outcome.exc), area=collector.area))
        elif outcome.exc is not None:
            msg = one_line(f"{type(outcome.exc).__name__}: {outcome.exc}")
            facts.problems[collector.name] = msg
            problems.append(Finding(fid, Status.ERROR, f"probe {collector.name!r} failed: {msg}"[:200], outcome.tb.strip(),
                                    "Report this at the hwtui issue tracker with `hwtui snapshot -o host.json` attached",
                                    area=collector.area))
        else:
            facts.values[collector.name] = outcome.value
    return facts, problems


def apply_rules(facts: Facts, rules: Iterable[Rule]) -> list[Finding]:
    findings: list[Finding] = []
    for rule in rules:
        missing = [n for n in rule.needs if n not in facts]
        if missing:
            continue  # the collector's own error/skip finding already says why
        try:
            findings.extend(rule.fn(facts))
        except Exception as exc:  # noqa: BLE001
            findings.append(Finding(f"hwtui.rule.{rule.name}", Status.ERROR,
                                    f"rule {rule.name!r} failed: {one_line(f'{type(exc).__name__}: {exc}')}"[:200],
                                    where_raised(exc), area=rule.area))
    return findings


def run_checks(host: Host, collectors: Iterable[Collector], rules: Iterable[Rule], *, only: set[str] | None = None,
               timeout_scale: float = 1.0) -> CheckResult:
    """Run the selected rules and just the collectors they need."""
    started = time.monotonic()
    rules = [r for r in rules if not only or r.area in only]
    by_name: Mapping[str, Collector] = {c.name: c for c in collectors}
    if only:
        wanted = {n for r in rules for n in r.needs} | {c.name for c in by_name.values() if c.area in only}
        chosen = [by_name[n] for n in by_name if n in wanted]
    else:
        chosen = list(by_name.values())
    facts, problems = collect(host, chosen, timeout_scale)
    findings = problems + apply_rules(facts, rules)
    return CheckResult(findings, facts, time.monotonic() - started)
