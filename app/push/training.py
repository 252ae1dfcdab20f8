"""``hwtui train --push-to AGENTS``: the merged model pushed to node agents while and after it trains.

Each export the training announces (``train.export``: every ``--push-every`` rounds, and always
the last round's, which is ``--save-hf``'s directory when given) is planned from the exported
``model.safetensors`` (the very file ``--save-hf`` writes) and pushed through
:func:`hwtui.app.push.orchestrate.run_push`: the same verified, all-or-nothing push as ``hwtui
push``, in-process, on a thread of its own so training never waits for a push.

One push at a time: an export that arrives while one is in flight waits, and a newer one replaces
it (it is recorded as superseded); the last round's is always pushed. A push that fails is
recorded (and said on stderr by the command), never raised: the training run, its checkpoints,
``--save-hf`` and its report stand whatever the agents do.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.app.push.options import PushOptions
from hwtui.core.errors import HwtuiError


@dataclass(frozen=True)
class Export:
    round: int
    step: int
    path: str  # the exported Hugging Face directory
    final: bool
    keep: bool  # --save-hf's directory: never removed here


def version_prefix() -> str:
    """This run's versions: ``train-<UTC time>-<random>-step<N>`` (a version names a directory on
    every agent and can never be pushed twice, so each run's are new)."""
    return f"train-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def weight_files(directory: str) -> list[str]:
    """The safetensors files --save-hf wrote: model.safetensors, or the shards its index names."""
    d = Path(directory)
    if (d / "model.safetensors").is_file():
        return [str(d / "model.safetensors")]
    return sorted(str(p) for p in d.glob("model-*-of-*.safetensors"))


class TrainPusher:
    """Call with every training event (a sink); :meth:`close` waits for the last push and returns
    one record per export: version, round, step, seconds, nodes, outcome. Nothing is printed here:
    the command says each push in its summary."""

    def __init__(self, opts: Callable[[str], PushOptions], targets: Sequence[Any], work_dir: str,
                 bucket_mb: float | None = None):
        from hwtui.probes.distributed.replication_defaults import DEFAULT_BUCKET_MB

        self._opts, self._targets, self._work = opts, list(targets), Path(work_dir)
        self._bucket = int((bucket_mb or DEFAULT_BUCKET_MB) * (1 << 20))
        self._prefix = version_prefix()
        self._lock = threading.RLock()  # _superseded records under it
        self._pending: Export | None = None
        self._current: Export | None = None  # the export being pushed now
        self._thread: threading.Thread | None = None
        self.records: list[dict[str, Any]] = []

    # -- the sink --------------------------------------------------------------------------------
    def __call__(self, ev: Any) -> None:
        if getattr(ev, "kind", None) != "train.export":
            return
        if not ev.path:
            self._record({"round": ev.round, "step": ev.step, "version": None, "outcome": "not exported",
                          "ok": False, "seconds": 0.0, "nodes": [], "error": ev.error or "the export failed"})
            return
        export = Export(round=ev.round, step=ev.step, path=ev.path, final=ev.final,
                        keep=not Path(ev.path).resolve().is_relative_to(self._work.resolve()))
        with self._lock:
            if self._pending is not None:
                self._superseded(self._pending)
            self._pending = export
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, name="train-push", daemon=True)
                self._thread.start()

    def in_flight(self) -> str | None:
        """The version being pushed now (None when idle): what the command says it waits for."""
        with self._lock:
            current = self._current
        return None if current is None else f"{self._prefix}-step{current.step}"

    def close(self, timeout: float | None = None, give_up: threading.Event | None = None) -> list[dict[str, Any]]:
        """Wait for the pushes still to run (the last round's included); the records, in order.

        ``give_up`` set (the user pressed Ctrl-C again while the command waited) stops the wait:
        the push in flight is recorded as interrupted and the one waiting as never pushed. Why that
        is safe: a push is all-or-nothing on the agents' side (each aborts before the vote when its
        pusher goes silent, and finishes a decided commit), so nothing half-switched is left, and
        the training run's report still gets written."""
        thread = self._thread
        deadline = None if timeout is None else time.monotonic() + timeout
        while thread is not None and thread.is_alive():
            if give_up is not None and give_up.is_set():
                self._abandon()
                break
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                break
            thread.join(left)
        shutil.rmtree(self._work, ignore_errors=True)
        with self._lock:
            return sorted(self.records, key=lambda r: r["round"])

    def _abandon(self) -> None:
        with self._lock:
            current, pending, self._pending = self._current, self._pending, None
            self._current = None  # the pushing thread's late record, if it ever comes, is dropped
            if current is not None:
                self.records.append({
                    "round": current.round, "step": current.step, "version": f"{self._prefix}-step{current.step}",
                    "final": current.final, "outcome": "interrupted", "ok": False, "seconds": 0.0, "nodes": [],
                    "error": "interrupted while it ran: every agent finishes or aborts it on its own, all or "
                             "nothing (`hwtui agents` shows what each serves)"})
            if pending is not None:
                self.records.append({
                    "round": pending.round, "step": pending.step, "version": None, "final": pending.final,
                    "outcome": "not pushed", "ok": False, "seconds": 0.0, "nodes": [],
                    "error": "interrupted before this export was pushed"})

    # -- the pushing thread ----------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            with self._lock:
                export, self._pending = self._pending, None
                self._current = export
                if export is None:
                    self._thread = None
                    return
            rec = self._push(export)
            with self._lock:
                if self._current is not export:  # given up on (close): recorded as interrupted there
                    return
                self._current = None
                self.records.append(rec)
            if not export.keep:
                shutil.rmtree(export.path, ignore_errors=True)

    def _superseded(self, export: Export) -> None:
        self._record({"round": export.round, "step": export.step, "version": None, "outcome": "superseded",
                      "ok": False, "seconds": 0.0, "nodes": [],
                      "error": "a newer round was exported while the previous push ran"})
        if not export.keep:
            shutil.rmtree(export.path, ignore_errors=True)

    @property
    def work_dir(self) -> Path:
        return self._work

    def _record(self, rec: dict[str, Any]) -> None:
        # Said by the command once training is over (its progress line is drawn from another thread).
        with self._lock:
            self.records.append(rec)

    def _push(self, export: Export) -> dict[str, Any]:
        from hwtui.app.push.orchestrate import run_push
        from hwtui.app.push.report import final_line

        version = f"{self._prefix}-step{export.step}"
        rec: dict[str, Any] = {"round": export.round, "step": export.step, "version": version, "final": export.final}
        t0 = time.monotonic()
        try:
            plan = self._plan(export, version)
            doc = run_push(self._opts(plan), self._targets)
        except HwtuiError as exc:  # an agent refusing, unreachable, a plan that could not be made
            return rec | {"outcome": "failed", "ok": False, "seconds": round(time.monotonic() - t0, 3), "nodes": [],
                          "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a push never loses the training run: recorded, with why
            return rec | {"outcome": "failed", "ok": False, "seconds": round(time.monotonic() - t0, 3), "nodes": [],
                          "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        nodes = [{"node": n.get("node") or n["agent"], "role": n["role"], "outcome": n["outcome"],
                  "serving": n.get("serving")} for n in doc["nodes"]]
        return rec | {"outcome": doc["state"], "ok": bool(doc["ok"]), "seconds": doc["seconds"],
                      "transfer_s": doc["transfer_s"], "bytes": doc["total_bytes"], "push_id": doc["push_id"],
                      "nodes": nodes, "error": None if doc["ok"] else final_line(doc)}

    def _plan(self, export: Export, version: str) -> str:
        """The plan of the exported weight files (paths the source agent reads on this host)."""
        from hwtui.engine.replication.plan import build_plan_from_files, write_plan

        files = weight_files(export.path)
        if not files:
            raise HwtuiError(f"the export {export.path} holds no safetensors weights")
        plan = build_plan_from_files(files, model=Path(export.path).name, version=version, bucket_bytes=self._bucket)
        out = self._work / f"{version}.plan"
        write_plan(out, plan)
        return str(out)


def line(rec: dict[str, Any]) -> str:
    """One push's line for the training summary (and stderr for a failure)."""
    where = f"round {rec['round']} (step {rec['step']})"
    if rec.get("ok"):
        nodes = ", ".join(n["node"] for n in rec["nodes"] if n["role"] == "receiver")
        return f"push {rec['version']} of {where}: committed on {nodes} in {rec['seconds']:.2f} s"
    return f"push of {where} FAILED ({rec['outcome']}): {rec.get('error') or 'see the report'}"
