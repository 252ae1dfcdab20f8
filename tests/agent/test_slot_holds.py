"""Holds on a served device slot (engine/resident/slot_holds.py and their use by DeviceServed): a
push is never received into a slot a consumer holds; holds renew, release and lapse by a clock."""

from __future__ import annotations

import math

import pytest

from hwtui.engine.resident.slot_holds import (
    DEFAULT_HOLD_S,
    MAX_HOLDS,
    HoldError,
    SlotHolds,
    check_hold_s,
    check_lease,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_hold_refuses_its_slot_until_it_lapses_is_renewed_or_released() -> None:
    clock = Clock()
    holds = SlotHolds(clock)
    h = holds.hold("A", "v1", 30, "uid 1000")
    assert h is not None and len(h.lease) == 32
    assert holds.refusal("B") is None  # the other slot is free
    why = holds.refusal("A")
    assert why is not None and "slot A still serves v1 to 1 consumer(s) holding it (uid 1000)" in why
    assert "the last hold ends in 30 s" in why and "POST /v1/served/release" in why
    clock.t += 29.9
    assert holds.refusal("A") is not None
    holds.renew(h.lease, 30)  # from now, on the slot it was granted on
    clock.t += 29.9
    assert holds.refusal("A") is not None
    clock.t += 0.2
    assert holds.refusal("A") is None and holds.state() == []  # lapsed: pruned
    with pytest.raises(HoldError, match="not held here"):
        holds.renew(h.lease, 30)
    h2 = holds.hold("A", "v1", 30, "uid 1000")
    assert h2 is not None and h2.lease != h.lease
    assert holds.release(h2.lease) and not holds.release(h2.lease)
    assert holds.refusal("A") is None


def test_several_consumers_the_latest_hold_counts_and_the_state_hides_lease_ids() -> None:
    clock = Clock()
    holds = SlotHolds(clock)
    holds.hold("A", "v1", 10, "uid 1000")
    holds.hold("A", "v1", 50, "uid 1001")
    why = holds.refusal("A")
    assert why is not None and "2 consumer(s)" in why and "uid 1000, uid 1001" in why and "ends in 50 s" in why
    state = holds.state()
    assert [s["left_s"] for s in state] == [10.0, 50.0]
    assert all(set(s) == {"slot", "version", "left_s", "holder"} for s in state)
    assert holds.hold("B", "v2", 0, "uid 1000") is None  # 0 takes no hold


def test_the_table_is_bounded() -> None:
    holds = SlotHolds(Clock())
    for _ in range(MAX_HOLDS):
        holds.hold("A", "v1", 5, "uid 1")
    with pytest.raises(HoldError, match=f"{MAX_HOLDS} holds are live"):
        holds.hold("A", "v1", 5, "uid 1")


@pytest.mark.parametrize("bad", [-1, 3601, math.nan, math.inf, True, "60", [60], {"s": 1}])
def test_hold_seconds_are_checked(bad: object) -> None:
    with pytest.raises(HoldError, match="hold_s must be a number of seconds from 0 to 3600"):
        check_hold_s(bad)
    assert check_hold_s(None) == DEFAULT_HOLD_S and check_hold_s(0) == 0 and check_hold_s(3600) == 3600.0


@pytest.mark.parametrize("bad", [None, "", "x" * 32, "A" * 32, "0" * 31, "0" * 33, 5, ["0" * 32]])
def test_lease_ids_are_checked(bad: object) -> None:
    with pytest.raises(HoldError, match="lease must be the 32 hex digits"):
        check_lease(bad)
    assert check_lease("0123456789abcdef" * 2) == "0123456789abcdef" * 2


# ---------------------------------------------------------------- the agent's device slots


def _served(clock: Clock):  # type: ignore[no-untyped-def]
    from hwtui.engine.resident.device_served import DeviceServed
    from hwtui.engine.resident.slot_holds import SlotHolds

    d = DeviceServed("host")
    d.holds = SlotHolds(clock)
    return d


def _push(d, version: str, fill: int):  # type: ignore[no-untyped-def]
    d.stage(version, 4096)
    _, buf = d._slots.receiving()
    buf[:4096].fill_(fill)
    assert d.commit(version) is not None


def test_a_push_is_never_received_into_a_held_slot() -> None:
    """v1 in A is exported and held; v2 lands in B; v3 would land in A: refused, A still v1, byte
    for byte, until the hold is released; then v3 lands in A."""
    pytest.importorskip("torch")
    from hwtui.engine.resident.device_slots import SlotHeld

    clock = Clock()
    d = _served(clock)
    try:
        _push(d, "v1", 1)
        got = d.export(30, "uid 1000")
        assert (got.version, got.slot) == ("v1", "A") and got.hold is not None
        _push(d, "v2", 2)  # into B: the held slot is not touched
        with pytest.raises(SlotHeld, match="slot A still serves v1"):
            d.stage("v3", 4096)
        assert d.state()["receiving"] is None and d.state()["holds"][0]["slot"] == "A"
        _, a = d._slots._view("A")
        assert bool((a[:4096] == 1).all())  # the consumer's weights, untouched
        assert d.holds.release(got.hold.lease)
        _push(d, "v3", 3)
        assert d.state()["slot"] == "A"
    finally:
        d.close()


def test_a_hold_lapses_and_a_zero_hold_holds_nothing() -> None:
    pytest.importorskip("torch")
    clock = Clock()
    d = _served(clock)
    try:
        _push(d, "v1", 1)
        assert d.export(0, "uid 1000").hold is None
        d.export(10, "uid 1000")
        _push(d, "v2", 2)
        clock.t += 10.5
        _push(d, "v3", 3)  # the hold on A lapsed: received there
    finally:
        d.close()


def test_loading_from_disk_respects_the_holds_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from hwtui.engine.resident.device_slots import SlotHeld

    save_file({"a": torch.arange(1000, dtype=torch.float32)}, str(tmp_path / "m.safetensors"))
    clock = Clock()
    d = _served(clock)
    try:
        _push(d, "v1", 1)
        d.export(30, "uid 1000")
        _push(d, "v2", 2)
        with pytest.raises(SlotHeld):
            d.load("v3", tmp_path / "m.safetensors")
        assert d.served()[0] == "v2"
    finally:
        d.close()
