"""The pieces of a GPU-resident receiver that need no agent process: the ``--device cuda`` refusal,
who may have the served slot's export (the asking socket's user), the agent's slots (alloc, reuse,
free, load from disk) and the consumer's and the rank's checks of what they are handed."""

from __future__ import annotations

import os
import secrets
import socket
import sys

import pytest

from hwtui.app.commands.agent import device_slots
from hwtui.app.node_api.peer import export_refusal, may_consume, peer_uid
from hwtui.core.errors import HwtuiError
from tests import cli_proc
from tests.agent.helpers import ipc_memfds

CUDA_BUILD = {"__version__": "2.13.0+cu128", "cuda": "12.8", "hip": None, "xpu": None}


def test_agent_device_cuda_without_a_cuda_torch_is_one_line_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWTUI_")}
    done = cli_proc.run([sys.executable, "-m", "hwtui.app", "agent", "--listen", "127.0.0.1:0", "--out",
                         str(tmp_path / "out"), "--device", "cuda", "--token-file", str(tmp_path / "tok")],
                        capture_output=True, text=True, timeout=120, env=env)
    from hwtui.engine.replication.transport import torch_build

    build = torch_build()
    if build.get("cuda") or build.get("hip"):
        pytest.skip("this torch has a GPU build: the refusal is the no-GPU-visible one (tested below)")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda needs a CUDA (or ROCm) build of torch" in lines[0]
    assert "pip install torch --index-url" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_device_cuda_where_no_gpu_is_visible_names_the_fix(tmp_path):
    with pytest.raises(HwtuiError, match="no NVIDIA GPU is visible here .* or run the agent with --device cpu"):
        device_slots("cuda", str(tmp_path), {"CUDA_VISIBLE_DEVICES": "-1"}, CUDA_BUILD)
    with pytest.raises(HwtuiError, match="--device cuda goes with --out"):
        device_slots("cuda", None, {}, CUDA_BUILD)
    assert device_slots("cpu", None) is None
    assert device_slots("cuda", str(tmp_path), {"HWTUI_TEST_IPC": "host"}) == "host"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_asking_sockets_user_is_found_from_the_kernels_table(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        srv = socket.socket(family)
        srv.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    srv.listen(1)
    cli = socket.socket(family)
    cli.connect(srv.getsockname()[:2])
    conn, peer = srv.accept()
    try:
        assert peer_uid(peer, conn.getsockname()) == os.geteuid()
        assert export_refusal(peer, conn.getsockname(), None) is None
        # a connection that is not in the table (already gone, or made up): nobody is trusted
        assert peer_uid((host, 1), conn.getsockname()) is None
        assert "could not be found" in (export_refusal((host, 1), conn.getsockname(), None) or "")
    finally:
        for s in (cli, conn, srv):
            s.close()


def test_an_ipv4_client_of_a_dual_stack_listener_is_found_too():
    try:
        srv = socket.socket(socket.AF_INET6)
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.bind(("::", 0))
    except OSError:
        pytest.skip("no dual-stack IPv6 here")
    srv.listen(1)
    cli = socket.socket(socket.AF_INET)
    cli.connect(("127.0.0.1", srv.getsockname()[1]))
    conn, peer = srv.accept()
    try:
        assert peer[0] == "::ffff:127.0.0.1"
        assert peer_uid(peer, conn.getsockname()) == os.geteuid()
        assert export_refusal(peer, conn.getsockname(), None) is None
    finally:
        for s in (cli, conn, srv):
            s.close()


def test_only_the_agents_user_or_its_serve_group_may_consume():
    assert may_consume(os.geteuid(), os.geteuid(), None)
    assert not may_consume(65534, 0, None)
    import pwd

    try:
        nobody = pwd.getpwuid(65534)
    except KeyError:
        pytest.skip("no uid 65534 here")
    assert may_consume(65534, 0, nobody.pw_gid)  # its primary group is the serve group
    assert not may_consume(65534, 0, 0 if nobody.pw_gid != 0 else 1)
    assert "over loopback" in (export_refusal(("10.0.0.5", 4000), ("10.0.0.1", 9477), None) or "")


# ---------------------------------------------------------------------------- the agent's slots

torch = pytest.importorskip("torch")


def test_slots_reuse_in_steady_state_free_a_failed_push_and_close_frees_both():
    from hwtui.engine.resident.device_served import DeviceServed

    before = ipc_memfds()
    d = DeviceServed("host")
    for v in ("v1", "v2", "v3", "v4"):
        d.stage(v, 4096)
        assert d.commit(v) is not None
    st = d.state()
    assert (st["serving"], st["slot"], st["allocs"], st["frees"]) == ("v4", "B", 2, 0)
    assert ipc_memfds() == before + 2
    d.stage("v5", 4096)
    d.rollback()  # a push that did not commit: its slot goes, the served one stays
    assert d.state()["serving"] == "v4" and ipc_memfds() == before + 1
    assert d.commit("v5") is None  # nothing staged: nothing switches
    d.close()
    assert ipc_memfds() == before and d.served() == (None, None)


def test_a_version_on_disk_is_loaded_into_a_slot_byte_for_byte(tmp_path):
    from safetensors.torch import save_file

    from hwtui.engine.resident.device_served import DeviceServed
    from hwtui.engine.resident.served_export import layout_of, open_served

    tensors = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.arange(77, dtype=torch.int8),
               "c": torch.ones(3, 5, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    d = DeviceServed("host")
    d.load("v1", tmp_path / "m.safetensors")
    version, buf = d.served()
    doc = {"version": version, "kind": "host", "bytes": d.state()["bytes"], "run": d.run, "handle": d.handle(buf),
           "layout": layout_of(tmp_path / "m.safetensors")}
    served = open_served(doc)
    try:
        for name, t in tensors.items():
            assert torch.equal(served.tensors[name], t), name
    finally:
        served.close()
        d.close()


def test_a_version_cut_short_on_disk_is_not_served_and_its_slot_is_freed(tmp_path):
    from safetensors.torch import save_file

    from hwtui.engine.resident.device_served import DeviceServed

    save_file({"a": torch.arange(10_000, dtype=torch.float32)}, str(tmp_path / "m.safetensors"))
    with open(tmp_path / "m.safetensors", "r+b") as fh:
        fh.truncate(os.path.getsize(tmp_path / "m.safetensors") - 100)
    before = ipc_memfds()
    d = DeviceServed("host")
    with pytest.raises((OSError, HwtuiError)):
        d.load("v1", tmp_path / "m.safetensors")
    assert d.served() == (None, None) and d.state()["receiving"] is None and ipc_memfds() == before
    d.close()


@pytest.mark.parametrize("change, why", [
    (lambda doc: doc["layout"]["a"].update(offset=doc["bytes"]), "outside the slot"),
    (lambda doc: doc["layout"]["a"].update(shape=[999]), "dtype times its shape"),
    (lambda doc: doc["layout"]["a"].update(dtype="F128"), "unknown dtype"),
    (lambda doc: doc["layout"]["a"].update(extra=1), "exactly dtype, shape, offset, nbytes"),
    (lambda doc: doc["handle"].update(fd=True), "export is refused"),
    (lambda doc: doc.update(run="0" * 32), "not this run's shared buffer"),
])
def test_a_consumer_refuses_an_export_that_is_not_what_it_says(change, why):
    from hwtui.engine.resident.device_served import DeviceServed
    from hwtui.engine.resident.served_export import open_served

    d = DeviceServed("host")
    d.stage("v1", 4000)
    d.commit("v1")
    _, buf = d.served()
    doc = {"version": "v1", "kind": "host", "bytes": 4000, "run": d.run, "handle": d.handle(buf),
           "layout": {"a": {"dtype": "F32", "shape": [1000], "offset": 0, "nbytes": 4000}}}
    change(doc)
    try:
        with pytest.raises(HwtuiError, match=why):
            open_served(doc)
    finally:
        d.close()


def test_the_rank_fills_the_agents_slot_and_refuses_a_descriptor_of_another_file():
    from hwtui.engine.replication.ipc_provider import HostStandIn, OpenError
    from hwtui.engine.replication.ipc_wire import WireError
    from hwtui.engine.resident.device_served import DeviceServed
    from hwtui.engine.resident.slot_fill import SlotFill, SlotFillError

    d = DeviceServed("host")
    desc = d.stage("v1", 1000)
    fill = SlotFill(desc)
    data = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    fill.copy(data, [(100, 200), (500, 50)])
    fill.fill_rest(data, 1000)  # the gaps: 0-100, 300-500, 550-1000
    assert fill.copied == 1000
    with pytest.raises(SlotFillError):
        fill.check_size(1001)
    fill.close()
    d.commit("v1")
    assert torch.equal(d.served()[1][:1000], data)  # what the rank wrote is what the agent serves
    for bad in ({**desc, "extra": 1}, {**desc, "nbytes": True}, {**desc, "kind": "xpu"}):
        with pytest.raises(WireError):
            SlotFill(bad)
    other = HostStandIn(secrets.token_hex(8))  # another run's memfd: refused after opening it
    buf = other.alloc(1000)
    with pytest.raises(OpenError, match="not this agent's slot"):
        SlotFill({**desc, "handle": other.handle(buf).to_wire()})
    other.free(buf)
    d.close()


# ---------------------------------------------------------------------------- what carries a push


def test_a_push_into_gpu_resident_agents_moves_device_buffers_ipc_in_a_node_nccl_across():
    from hwtui.app.push.orchestrate import device_settings
    from hwtui.engine.resident.resident import PushRefused, push_settings, push_transport

    one_node = [{"device": "cuda", "host": "h1"}, {"device": "cuda", "host": "h1"}, {"device": "cuda", "host": "h1"}]
    assert device_settings(one_node) == {"device": "cuda", "nodes": 1}
    assert device_settings([*one_node, {"device": "cuda", "host": "h2"}]) == {"device": "cuda", "nodes": 2}
    assert device_settings([*one_node, {"device": "cpu", "host": "h1"}]) == {}  # one host-memory agent: all host
    assert device_settings([{"device": "cuda"}, {"device": "cuda"}]) == {"device": "cuda", "nodes": 2}  # unknown: apart
    ipc, nccl, host = push_transport("cuda", 1), push_transport("cuda", 3), push_transport("cpu", 1)
    assert (ipc.name, ipc.backend) == ("cuda-ipc", "gloo") and ipc.line == "Using SOTA CUDA-IPC Transport Layer."
    assert (nccl.name, nccl.backend) == ("nccl", "nccl") and (host.name, host.backend) == ("gloo", "gloo")
    assert push_settings({"device": "cuda", "nodes": 2}, "cuda")[0].device == "cuda"
    for kind in (None, "host"):  # an agent without a GPU copy (or the test stand-in) is never asked
        with pytest.raises(PushRefused, match="start its agent with --device cuda"):
            push_settings({"device": "cuda"}, kind)
    with pytest.raises(PushRefused, match="settings.device must be cpu or cuda"):
        push_settings({"device": "xpu"}, "cuda")
    with pytest.raises(PushRefused, match="settings.nodes"):
        push_settings({"device": "cuda", "nodes": 0}, "cuda")


def test_a_version_changed_on_disk_while_it_loads_is_named_and_not_served(tmp_path, monkeypatch):
    """The load reads through the parallel reader (several threads): a file rewritten under it is
    a named error, the slot it was filling is freed, nothing is served."""
    from safetensors.torch import save_file

    from hwtui.engine.replication import reader as rd
    from hwtui.engine.replication.reader import ReadFailed
    from hwtui.engine.resident.device_served import DeviceServed

    path = tmp_path / "m.safetensors"
    save_file({"a": torch.arange(1 << 20, dtype=torch.float32)}, str(path))
    real = os.preadv
    calls = [0]

    def rewrite_after_first(fd, bufs, offset):
        calls[0] += 1
        if calls[0] == 1:
            with open(path, "r+b") as fh:
                fh.seek(-8, os.SEEK_END)
                fh.write(b"\x7f" * 8)
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return real(fd, bufs, offset)

    before = ipc_memfds()
    d = DeviceServed("host")
    monkeypatch.setattr(rd.os, "preadv", rewrite_after_first)
    with pytest.raises(ReadFailed, match="was modified while it was read"):
        d.load("v1", path, readers=3)
    assert calls[0] > 1  # the read went on in slices
    assert d.served() == (None, None) and d.state()["receiving"] is None and ipc_memfds() == before
    monkeypatch.setattr(rd.os, "preadv", real)
    d.load("v1", path, readers=3)  # the file as it is now: served, byte for byte
    version, buf = d.served()
    raw = path.read_bytes()
    assert version == "v1" and bytes(buf.numpy()) == raw[len(raw) - buf.numel():]
    d.close()
