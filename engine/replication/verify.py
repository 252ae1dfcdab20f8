"""A rank checks its bytes against the plan: bucket by bucket as they land, tensor by tensor what
was copied, and (on the source) the files it sent. A mismatch is recorded in ``failures`` and
reported; the rank still finishes the schedule and then votes no, so every rank aborts together
with the real reason."""

from __future__ import annotations

from typing import Any

from hwtui.core.events import ErrorEvent
from hwtui.engine.replication.checksum import Streaming, xxh3_hex
from hwtui.engine.replication.plan import Plan
from hwtui.engine.replication.rank_base import RankBase
from hwtui.engine.replication.source_reader import in_place_tensors


class RankVerify(RankBase):
    def _send_hash_spans(self) -> None:
        """The timeline's "hash" spans (engine.replication.host_copy); nothing here."""

    def _staged_digest(self, plan: Plan, b: int) -> str:
        """xxh3 of bucket b as this rank's staging copy holds it (pieces and zero padding)."""
        region = self.direct.get(b)
        if region is not None:
            return xxh3_hex(region.numpy())
        h, pos = Streaming(), 0
        for it in plan.bucket_items[b]:
            h.pad(it["offset"] - pos)
            h.update(self.staging.region(it["name"])[it["tensor_offset"]:it["tensor_offset"] + it["nbytes"]].numpy())
            pos = it["offset"] + it["nbytes"]
        h.pad(plan.buckets[b]["size"] - pos)
        return h.hexdigest()

    def _verify_digest(self, plan: Plan, ob: int, got: str) -> bool:
        if got == plan.buckets[ob]["checksum"]:
            return True
        self.failures.append(f"bucket {ob} failed verification on rank {self.rank} "
                             f"(xxh3 {got} != plan {plan.buckets[ob]['checksum']})")
        self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="verify"))
        return False

    def _verify_bucket(self, plan: Plan, ob: int, data: Any) -> bool:
        size = data.numel()
        if data.device.type == "cpu":
            got = xxh3_hex(data.numpy())
        else:  # the bytes must reach the host to be hashed; a pinned, pooled buffer
            hbuf = self._host_pooled().acquire(size)
            hbuf[:size].copy_(data)
            got = xxh3_hex(hbuf[:size].numpy())
            self._host_pooled().release(hbuf)
        return self._verify_digest(plan, ob, got)

    def _check_sources(self, plan: Plan) -> None:
        """The source's own check that it sent what was planned, hashed beside the send (see _send).

        A file changed since planning makes every receiver fail verification; this names the cause
        (the file, not the wire) and makes it bad input (exit 2). Nothing commits either way.
        """
        for b in range(len(plan.buckets)):
            future = self.source_digests.get(b)
            digest = future.result() if future is not None else self._sources.bucket_digest(plan, b)
            if digest != plan.buckets[b]["checksum"]:
                self.bad_input = True
                self.failures.append(f"the weight files changed since planning: bucket {b} hashes to {digest}, "
                                     f"the plan says {plan.buckets[b]['checksum']}")
                self.emit(ErrorEvent(message=f"rank {self.rank}: {self.failures[-1]}", rank=self.rank, where="source"))
                return
        self._send_hash_spans()

    def _verify_staging(self, plan: Plan) -> None:
        """Bytes received straight into the staging copy were verified there, bucket by bucket;
        what was copied (unpacked from the pool, kept from the served version) is checked again
        per tensor against the plan."""
        in_place = in_place_tensors(plan, set(self.direct))
        bad = self.staging.verify([tt["name"] for tt in plan["tensors"] if tt["name"] not in in_place])
        if bad:
            self.failures.append(f"{len(bad)} tensor(s) of the staging copy on rank {self.rank} do not match "
                                 f"the plan (first: {bad[0]!r})")
            self.emit(ErrorEvent(message=self.failures[-1], rank=self.rank, where="verify"))
