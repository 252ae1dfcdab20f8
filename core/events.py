"""Typed engine events and their JSON-lines form.

Every engine (replication, training, cluster test) reports through events: the CLI prints them,
``--events FILE`` writes them as JSON lines (``-`` for stdout), and the TUI reads the same stream
from the engine's process. Events cross process boundaries as JSON, never pickled.

Concrete events live next to their engine (``engine/replication/events.py``...) and register
themselves with :func:`event`, so ``from_dict`` can rebuild any of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, TypeVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # textual, a base dependency, brings typing_extensions
    from typing_extensions import dataclass_transform

_REGISTRY: dict[str, type[Event]] = {}
E = TypeVar("E", bound="Event")


@dataclass
class Event:
    kind: ClassVar[str] = "event"
    t: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        """Strict JSON (RFC 8259): a non-finite float, which bare JSON cannot hold, travels as null.

        Engines refuse non-finite values where they mean something (training stops on a NaN loss);
        this keeps a stray one (a rate over zero seconds) from ever writing ``NaN`` into a stream.
        """
        raw = self.to_dict()
        try:
            return json.dumps(raw, separators=(",", ":"), default=str, allow_nan=False)
        except ValueError:
            return json.dumps(_finite(raw), separators=(",", ":"), default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@dataclass_transform(field_specifiers=(field,))
def event(kind: str) -> Callable[[type[E]], type[E]]:
    """Class decorator: make a dataclass an event with a stable ``kind`` string."""

    def register(cls: type[E]) -> type[E]:
        cls = dataclass(cls)
        cls.kind = kind
        if kind in _REGISTRY and _REGISTRY[kind].__qualname__ != cls.__qualname__:
            raise ValueError(f"event kind {kind!r} registered twice")
        _REGISTRY[kind] = cls
        return cls

    return register


@event("log")
class LogEvent(Event):
    """A human-readable line (the vendor guide's 'Using ... transport' lines travel as these)."""

    message: str
    level: str = "info"
    source: str = ""


@event("error")
class ErrorEvent(Event):
    message: str
    rank: int | None = None
    where: str = ""


# Where each family of events is defined (``"repl."`` -> its module), so a reader (the TUI, a
# test) that parses a stream can rebuild typed events without having imported that engine first.
# The families are registered by hwtui/__init__.py: core names no other layer.
_PROVIDERS: dict[str, str] = {}


def register_provider(prefix: str, module: str) -> None:
    """Kinds starting with ``prefix`` are defined in ``module`` (imported on first sight)."""
    _PROVIDERS[prefix] = module


def _lookup(kind: str) -> type[Event] | None:
    cls = _REGISTRY.get(kind)
    if cls is None:
        for prefix, module in _PROVIDERS.items():
            if kind.startswith(prefix):
                import importlib

                try:
                    importlib.import_module(module)
                except ImportError:
                    return None
                cls = _REGISTRY.get(kind)
                break
    return cls


def from_dict(raw: dict[str, Any]) -> Event:
    """Rebuild a registered event; unknown kinds come back as ``UnknownEvent``."""
    kind = raw.get("kind", "event")
    cls = _lookup(kind)
    if cls is None:
        return UnknownEvent(kind_name=kind, payload=raw, t=raw.get("t", time.time()))
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in raw.items() if k in names})
    except TypeError:
        # A line from a different hwtui version (missing fields): keep it readable, never crash
        # the reader over it.
        return UnknownEvent(kind_name=kind, payload=raw, t=raw.get("t", time.time()))


@event("unknown")
class UnknownEvent(Event):
    kind_name: str
    payload: dict[str, Any]


def parse_line(line: str) -> Event | None:
    line = line.strip()
    if not line:
        return None
    try:
        raw = json.loads(line)
    except ValueError:
        return LogEvent(message=line, source="stdout")
    return from_dict(raw) if isinstance(raw, dict) else None


def iter_events(stream: IO[str]) -> Iterator[Event]:
    for line in stream:
        ev = parse_line(line)
        if ev is not None:
            yield ev


class JsonlWriter:
    """Writes events as JSON lines, flushed per line so a reader sees them live. Thread-safe."""

    def __init__(self, target: str | IO[str]):
        if isinstance(target, str):
            self._fh: IO[str] = sys.stdout if target == "-" else open(target, "w", encoding="utf-8", buffering=1)
            self._owned = target != "-"
        else:
            self._fh, self._owned = target, False
        self._lock = threading.Lock()

    def __call__(self, ev: Event) -> None:
        line = ev.to_json() + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        if self._owned:
            self._fh.close()


EventSink = Callable[[Event], None]


class Fanout:
    """Send each event to several sinks (the CLI printer, a JSONL file, an in-process list)."""

    def __init__(self, *sinks: EventSink | None):
        self.sinks = [s for s in sinks if s is not None]

    def __call__(self, ev: Event) -> None:
        for sink in self.sinks:
            sink(ev)
