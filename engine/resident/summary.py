"""An agent's ``/v1/summary`` as typed values: the one parser every client of the agents uses.

An agent is another machine: whatever it sends is untrusted input. The CLI (`hwtui agents`), the
TUI's cluster view and its JSON output all read a node through ``parse_summary``, never the raw
document. Each field is checked for its type and a plausible range; a value that fails (a wrong
type, NaN or infinity, a negative or absurd number, a string or list beyond its cap) is *unknown*:
``None`` in its field and its name in ``unknown``, which views show as ``?`` (``-`` is "not
reported"). Every string kept is passed through ``core.terminal_text.clean``, so nothing an agent
sends reaches a terminal as a control sequence. Parsing never raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hwtui.core.terminal_text import clean
from hwtui.engine.resident.device_slots import DeviceSlots
from hwtui.engine.resident.slot_holds import MAX_HOLD_S, MAX_HOLDS

# Caps: beyond these a value is not an agent's honest answer (a node name is a host name, at most
# 253 characters; a node with more than 256 devices does not exist).
MAX_NAME = 253
MAX_LABEL = 128
MAX_DEVICES = 256
MAX_BYTES = float(1 << 60)  # 1 EiB of device memory
MAX_AGE_S = 1e9
MAX_ERROR = 300  # the agent cuts its device error to this
WORST = frozenset({"pass", "warn", "fail", "error", "skip"})

# Range of each numeric device field: (low, high), both inclusive.
_DEVICE_NUMBERS: dict[str, tuple[float, float]] = {
    "util": (0.0, 100.0),
    "mem_used": (0.0, MAX_BYTES),
    "mem_total": (0.0, MAX_BYTES),
    "temp_c": (0.0, 200.0),
    "power_w": (0.0, 1e5),
    "power_limit_w": (0.0, 1e5),
}


class _Fields:
    """Collects one object's checked fields and the names of those found invalid."""

    def __init__(self, doc: Any, prefix: str = "") -> None:
        self.doc: Mapping[str, Any] = doc if isinstance(doc, Mapping) else {}
        self.prefix = prefix
        self.unknown: list[str] = []

    def _bad(self, key: str) -> None:
        self.unknown.append(self.prefix + key)

    def number(self, key: str, low: float, high: float) -> float | None:
        v = self.doc.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self._bad(key)
            return None
        try:
            f = float(v)
        except OverflowError:  # an integer beyond any float
            self._bad(key)
            return None
        if not math.isfinite(f) or not low <= f <= high:
            self._bad(key)
            return None
        return f

    def text(self, key: str, limit: int) -> str | None:
        v = self.doc.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or len(v) > limit:
            self._bad(key)
            return None
        out = clean(v).strip()
        if not out:  # nothing printable left: as good as absent, and said so
            self._bad(key)
            return None
        return out


@dataclass(frozen=True)
class Device:
    device: str | None = None  # "cuda:0", "cpu"
    name: str | None = None
    util: float | None = None  # percent
    mem_used: float | None = None  # bytes
    mem_total: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    unknown: tuple[str, ...] = ()

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "name": self.name, "util": self.util, "mem_used": self.mem_used,
                "mem_total": self.mem_total, "temp_c": self.temp_c, "power_w": self.power_w,
                "power_limit_w": self.power_limit_w, "unknown": list(self.unknown)}


@dataclass(frozen=True)
class InFlight:
    version: str | None = None
    progress: float | None = None  # 0..1


@dataclass(frozen=True)
class DeviceServed:
    """A GPU-resident agent's served slot (``hwtui agent --device cuda``): where the version lives,
    and how many serving processes hold that slot (a push landing in a held slot is refused)."""

    device: str | None = None  # "cuda:0"
    slot: str | None = None  # "A" / "B"
    holds: int | None = None  # live holds (either slot: one on the slot not serving refuses the next push)
    held: tuple[str, ...] = ()  # the versions they hold, each once, in the agent's order
    hold_left_s: float | None = None  # until the last of them ends, unless renewed
    error: str | None = None  # why the version on disk could not be loaded onto the device

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "slot": self.slot, "holds": self.holds, "held": list(self.held),
                "hold_left_s": self.hold_left_s, "error": self.error}


PERSIST_STATES = ("none", "writing", "done", "failed", "superseded")


@dataclass(frozen=True)
class Persist:
    """A GPU-resident node's disk copy of the version it serves, written after the commit
    (``hwtui agent --persist after-commit``): being written, done, failed (with why), or
    superseded (its write stopped for a push of a newer version)."""

    state: str | None = None
    version: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "version": self.version, "error": self.error}


@dataclass(frozen=True)
class Replication:
    serving: str | None = None
    in_flight: InFlight | None = None
    device: DeviceServed | None = None  # None: the agent serves from host memory (no --device)
    persist: Persist | None = None  # None: the agent sent none (no push has ended yet, or an older agent)

    @property
    def disk_pending(self) -> str | None:
        """"writing", "failed" or "superseded" while the disk copy of the version this node serves
        is still owed (a GPU-resident node serves it from its device meanwhile), else None: what
        views show."""
        p = self.persist
        owed = ("writing", "failed", "superseded")
        return p.state if p is not None and p.version == self.serving and p.state in owed else None

    def to_dict(self) -> dict[str, Any]:
        f = self.in_flight
        return {"serving": self.serving,
                "in_flight": None if f is None else {"version": f.version, "progress": f.progress},
                "device": None if self.device is None else self.device.to_dict(),
                "persist": None if self.persist is None else self.persist.to_dict()}


@dataclass(frozen=True)
class Summary:
    """One node's checked ``/v1/summary``."""

    node: str | None = None
    devices: tuple[Device, ...] = ()
    devices_age_s: float | None = None
    worst: str | None = None
    replication: Replication = field(default_factory=Replication)
    unknown: tuple[str, ...] = ()  # invalid fields, dotted ("devices[2].temp_c", "replication.serving")

    @property
    def host(self) -> Device | None:
        """The node's host CPU (``util``: percent busy) and memory (``mem_used``/``mem_total``): the
        agent's ``cpu`` entry of ``devices``, checked like every device. ``None``: the agent sent
        none, or sent it invalid (``unknown`` names it), so views show it as unknown."""
        return next((d for d in self.devices if d.is_cpu), None)


def parse_device(doc: Any) -> Device:
    """One entry of ``devices``; ``unknown`` names its own invalid fields (an entry that is not an
    object has every field unknown: ``("device",)``)."""
    f = _Fields(doc)
    if not isinstance(doc, Mapping):
        return Device(unknown=("device",))
    numbers = {k: f.number(k, lo, hi) for k, (lo, hi) in _DEVICE_NUMBERS.items()}
    device = f.text("device", 64)
    name = f.text("name", MAX_LABEL)
    return Device(device=device, name=name, unknown=tuple(f.unknown), **numbers)


def parse_summary(doc: Any) -> Summary:
    """The typed summary of ``doc`` (anything ``json.loads`` returns); never raises."""
    f = _Fields(doc)
    if not isinstance(doc, Mapping):
        return Summary(unknown=("summary",))
    node = f.text("node", MAX_NAME)
    devices: list[Device] = []
    raw = doc.get("devices")
    if isinstance(raw, list) and len(raw) <= MAX_DEVICES:
        for i, d in enumerate(raw):
            dev = parse_device(d)
            devices.append(dev)
            if not isinstance(d, Mapping):
                f.unknown.append(f"devices[{i}]")
            else:
                f.unknown.extend(f"devices[{i}].{u}" for u in dev.unknown)
    elif raw is not None:
        f.unknown.append("devices")
    age = f.number("devices_age_s", 0.0, MAX_AGE_S)
    worst = f.text("worst", 16)
    if worst is not None and worst not in WORST:
        f.unknown.append("worst")
        worst = None
    rep_raw = doc.get("replication")
    replication = Replication()
    if isinstance(rep_raw, Mapping):
        r = _Fields(rep_raw, "replication.")
        serving = r.text("serving", MAX_LABEL)
        flight = None
        flight_raw = rep_raw.get("in_flight")
        if isinstance(flight_raw, Mapping):
            fl = _Fields(flight_raw, "replication.in_flight.")
            flight = InFlight(fl.text("version", MAX_LABEL), fl.number("progress", 0.0, 1.0))
            r.unknown.extend(fl.unknown)
        elif flight_raw is not None:
            r.unknown.append("replication.in_flight")
        device = _nested(rep_raw, "device", _device_served, r.unknown)
        persist = _nested(rep_raw, "persist", _persist, r.unknown)
        replication = Replication(serving, flight, device, persist)
        f.unknown.extend(r.unknown)
    elif rep_raw is not None:
        f.unknown.append("replication")
    return Summary(node=node, devices=tuple(devices), devices_age_s=age, worst=worst, replication=replication,
                   unknown=tuple(f.unknown))


_T = TypeVar("_T")


def _nested(rep: Mapping[str, Any], key: str, parse: Callable[[Mapping[str, Any], list[str]], _T],
            unknown: list[str]) -> _T | None:
    """``replication.<key>``, an object parsed by ``parse`` (None when absent; unknown when not an object)."""
    raw = rep.get(key)
    if isinstance(raw, Mapping):
        return parse(raw, unknown)
    if raw is not None:
        unknown.append(f"replication.{key}")
    return None


def _persist(doc: Mapping[str, Any], unknown: list[str]) -> Persist:
    p = _Fields(doc, "replication.persist.")
    state, version, error = p.text("state", 16), p.text("version", MAX_LABEL), p.text("error", MAX_ERROR)
    if state is not None and state not in PERSIST_STATES:
        p.unknown.append("replication.persist.state")
        state = None
    unknown.extend(p.unknown)
    return Persist(state, version, error)


def _device_served(doc: Mapping[str, Any], unknown: list[str]) -> DeviceServed:
    d = _Fields(doc, "replication.device.")
    device, slot, error = d.text("device", MAX_LABEL), d.text("slot", 1), d.text("error", MAX_ERROR)
    if slot is not None and slot not in DeviceSlots.NAMES:
        d.unknown.append("replication.device.slot")
        slot = None
    holds: int | None = None
    held: tuple[str, ...] = ()
    left: float | None = None
    raw = doc.get("holds")
    if isinstance(raw, list) and len(raw) <= MAX_HOLDS:
        checked = [_Fields(h) for h in raw]  # an item that is no object has neither field
        lefts = [c.number("left_s", 0.0, MAX_HOLD_S) for c in checked]
        versions = [c.text("version", MAX_LABEL) for c in checked]
        if all(x is not None for x in lefts + versions):
            holds = len(raw)
            held = tuple(dict.fromkeys(v for v in versions if v is not None))
            left = max((x for x in lefts if x is not None), default=None)
        else:
            d.unknown.append("replication.device.holds")
    elif raw is not None:
        d.unknown.append("replication.device.holds")
    unknown.extend(d.unknown)
    return DeviceServed(device, slot, holds, held, left, error)


# Processes listed from one node's ``/v1/processes`` (the node's detail view): an honest node has
# tens; beyond this the rest is counted, not kept.
MAX_PROCESSES = 1024
MAX_PID = 1 << 22  # Linux's pid_max limit


@dataclass(frozen=True)
class Process:
    pid: int | None = None
    name: str | None = None
    devices: tuple[str, ...] = ()  # the device nodes it holds open ("/dev/nvidia0")
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class Processes:
    """One node's checked ``/v1/processes``: the processes holding an accelerator open."""

    items: tuple[Process, ...] = ()
    age_s: float | None = None  # of the agent's own scan
    more: int = 0  # entries beyond MAX_PROCESSES, not kept
    unknown: tuple[str, ...] = ()


def parse_process(doc: Any) -> Process:
    if not isinstance(doc, Mapping):
        return Process(unknown=("process",))
    f = _Fields(doc)
    pid = f.number("pid", 0, MAX_PID)
    if pid is not None and not pid.is_integer():
        f.unknown.append("pid")
        pid = None
    name = f.text("name", MAX_LABEL)
    raw = doc.get("devices")
    devices: tuple[str, ...] = ()
    if isinstance(raw, list) and len(raw) <= MAX_DEVICES and all(isinstance(d, str) and len(d) <= MAX_LABEL for d in raw):
        devices = tuple(c for c in (clean(d).strip() for d in raw) if c)
    elif raw is not None:
        f.unknown.append("devices")
    return Process(pid=None if pid is None else int(pid), name=name, devices=devices, unknown=tuple(f.unknown))


def parse_processes(doc: Any) -> Processes:
    """The typed ``/v1/processes`` answer of ``doc``; never raises."""
    if not isinstance(doc, Mapping):
        return Processes(unknown=("processes",))
    f = _Fields(doc)
    raw = doc.get("processes")
    items: list[Process] = []
    more = 0
    if isinstance(raw, list):
        items = [parse_process(p) for p in raw[:MAX_PROCESSES]]
        more = max(0, len(raw) - MAX_PROCESSES)
    elif raw is not None:
        f.unknown.append("processes")
    age = f.number("age_s", 0.0, MAX_AGE_S)
    return Processes(items=tuple(items), age_s=age, more=more, unknown=tuple(f.unknown))


@dataclass(frozen=True)
class NodeStatus:
    """What a view shows of one node: its last good summary (if any) and how fresh it is."""

    agent: str  # the address as the user gave it (validated by parse_agents)
    url: str
    stale: bool
    age_s: float | None = None  # since the last good answer; None: never answered
    error: str | None = None  # why the last poll failed (clean text)
    latency_s: float | None = None
    summary: Summary | None = None  # the last good answer: a stale node keeps it, views grey it
    tried_s: float | None = None  # since the first poll of this node; None: not polled yet
    processes: Processes | None = None  # only for the node whose detail is open
    processes_error: str | None = None  # why its last /v1/processes failed (clean text)

    @property
    def answered(self) -> bool:
        """The node answered at least once: there are last values to show, fresh or stale."""
        return self.summary is not None

    @property
    def host(self) -> Device | None:
        return self.summary.host if self.summary is not None else None

    @property
    def node(self) -> str:
        """The node's own name when it gave a valid one, else the address it was reached at."""
        return (self.summary.node if self.summary is not None else None) or self.agent

    @property
    def devices(self) -> tuple[Device, ...]:
        return self.summary.devices if self.summary is not None else ()

    @property
    def replication(self) -> Replication:
        return self.summary.replication if self.summary is not None else Replication()

    @property
    def unknown(self) -> tuple[str, ...]:
        return self.summary.unknown if self.summary is not None else ()

    def to_dict(self) -> dict[str, Any]:
        """The ``hwtui.agents/1`` node object: checked values only, ``unknown`` naming the invalid."""
        s = self.summary or Summary()
        return {"node": self.node, "agent": self.agent, "url": self.url, "stale": self.stale,
                "age_s": None if self.age_s is None else round(self.age_s, 3), "error": self.error,
                "tried_s": None if self.tried_s is None else round(self.tried_s, 3),
                "latency_s": None if self.latency_s is None else round(self.latency_s, 4),
                "devices": [d.to_dict() for d in s.devices], "devices_age_s": s.devices_age_s,
                "host": None if s.host is None else s.host.to_dict(),
                "worst": s.worst, "replication": s.replication.to_dict(), "unknown": list(s.unknown)}


# Facts (``/v1/facts``) feed the node comparison, whose rules expect these to be objects.
FACT_OBJECTS = ("platform", "torch", "drivers", "interfaces", "route", "env", "check")
MAX_DEPTH = 16
MAX_TEXT = 4096


def clean_tree(value: Any, depth: int = 0) -> Any:
    """A JSON value with every string (keys too) cleaned and capped, non-finite numbers as None,
    nesting beyond ``MAX_DEPTH`` cut to None: an agent's free-form document, safe to compare and print."""
    if isinstance(value, str):
        return clean(value, MAX_TEXT)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        return {clean(str(k), MAX_LABEL): clean_tree(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_tree(v, depth + 1) for v in value]
    return None


def parse_facts(doc: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """An agent's ``/v1/facts`` ``facts`` as a cleaned object, and the names of the top-level
    facts that had the wrong type (dropped). ``None`` when there is no object at all."""
    if not isinstance(doc, Mapping) or not doc:
        return None, []
    facts = clean_tree(doc)
    bad = [k for k in FACT_OBJECTS if facts.get(k) is not None and not isinstance(facts[k], dict)]
    for k in bad:
        del facts[k]
    return facts, bad
