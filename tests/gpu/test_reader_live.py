"""The parallel file -> device reader on a live CUDA GPU (issue 23.1): bit-exact, every mode.

Skipped with its reason where there is no NVIDIA GPU (tests/gpu/conftest.py); the same code's
ring, ordering, backpressure and error paths run everywhere in tests/engine/replication/test_reader.py
with a host-memory stand-in for the device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
MB = 1 << 20


@pytest.fixture(scope="module")
def weight_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    # 96 MiB + 4099 bytes: several 64 MiB slices, an unaligned tail for O_DIRECT.
    data = np.random.default_rng(23).integers(0, 256, 96 * MB + 4099, dtype=np.uint8)
    p = tmp_path_factory.mktemp("reader") / "w.bin"
    data.tofile(p)
    return p, data


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("direct", ["off", "on"])
def test_file_to_cuda_is_bit_exact(weight_file: tuple[Path, np.ndarray], threads: int, direct: str) -> None:
    import torch

    from hwtui.engine.replication.reader import Extent, ParallelReader, TorchSeam, WeightFile

    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA (a CPU build of torch on a GPU machine)")
    p, data = weight_file
    dst = torch.full((len(data),), 0x5A, dtype=torch.uint8, device="cuda")
    seam = TorchSeam("cuda")
    r = ParallelReader(seam, threads=threads, slice_bytes=16 * MB)
    with WeightFile(p, direct) as wf:
        r.read(wf, [Extent(0, wf.size, 0)], dst)
        # Unaligned scattered extents too (the pieces of a packed bucket).
        part = torch.zeros(3 * MB, dtype=torch.uint8, device="cuda")
        r.read(wf, [Extent(4097, MB, 0), Extent(50 * MB + 1, 2 * MB - 1, MB)], part)
    r.close()
    assert seam.pinned, "torch with CUDA pins host memory"
    assert torch.equal(dst.cpu(), torch.from_numpy(data))
    want = np.concatenate([data[4097:4097 + MB], data[50 * MB + 1:52 * MB]])
    assert torch.equal(part[:3 * MB - 1].cpu(), torch.from_numpy(want))


def test_planned_buckets_to_cuda_match_the_plan_checksums(tmp_path: Path) -> None:
    import torch

    from hwtui.engine.replication.bucket_reader import BucketReader
    from hwtui.engine.replication.checksum import xxh3_hex
    from hwtui.engine.replication.plan import load_plan
    from tests.engine.replication.helpers import make_model, write_plan

    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA (a CPU build of torch on a GPU machine)")
    make_model(tmp_path / "m")
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1", bucket_kib=48, align=64)
    plan = load_plan(tmp_path / "p.json")
    from hwtui.engine.replication.weights import load_torch_state, tensor_bytes

    states = {i: {k: tensor_bytes(v) for k, v in load_torch_state(f["path"]).items()}
              for i, f in enumerate(plan["files"]) if f["format"] != "safetensors"}
    buf = torch.full((max(b["size"] for b in plan.buckets),), 0xAB, dtype=torch.uint8, device="cuda")
    r = BucketReader(plan["files"], "cuda", readers=4, direct="off")
    try:
        for b, bk in enumerate(plan.buckets):
            r.fill(plan.bucket_items[b], bk["size"], buf,
                   lambda it: states[it["file"]][it["name"]][it["tensor_offset"]:it["tensor_offset"] + it["nbytes"]])
            assert xxh3_hex(buf[:bk["size"]].cpu().numpy()) == bk["checksum"], b
            buf.fill_(0xAB)
    finally:
        r.close()


def test_the_source_keeps_one_pinned_ring_per_gpu(tmp_path: Path) -> None:
    """Set-up warms the ring for "cuda"; the buckets' buffers say "cuda:0": the same reader."""
    import torch

    from hwtui.engine.replication.plan import load_plan
    from hwtui.engine.replication.source_reader import SourceReader
    from tests.engine.replication.helpers import make_model, write_plan

    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA (a CPU build of torch on a GPU machine)")
    make_model(tmp_path / "m")
    write_plan(tmp_path / "m", tmp_path / "p.json", version="v1", bucket_kib=48)
    src = SourceReader(load_plan(tmp_path / "p.json"), readers=2)
    try:
        src.warm("cuda")
        assert src.reader("cuda") is src.reader(torch.empty(1, device="cuda").device)
    finally:
        src.close()


def test_queued_reads_to_cuda_are_exact_whatever_order_they_are_waited_in(weight_file: tuple[Path, np.ndarray]) -> None:
    """The source's read-ahead: reads queued back to back into separate device buffers, the later
    ones waited on first (their copies on the threads' streams, the earlier ones still landing)."""
    import torch

    from hwtui.engine.replication.reader import Extent, ParallelReader, TorchSeam, WeightFile

    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA (a CPU build of torch on a GPU machine)")
    p, data = weight_file
    parts = [(0, 32 * MB), (32 * MB, 32 * MB), (64 * MB, len(data) - 64 * MB)]
    dsts = [torch.full((n,), 0x5A, dtype=torch.uint8, device="cuda") for _, n in parts]
    r = ParallelReader(TorchSeam("cuda"), threads=4, slice_bytes=8 * MB)
    with WeightFile(p) as wf:
        readings = [r.submit(wf, [Extent(off, n, 0)], d) for (off, n), d in zip(parts, dsts, strict=True)]
        for reading in reversed(readings):
            reading.wait()
    r.close()
    for (off, n), d in zip(parts, dsts, strict=True):
        assert torch.equal(d.cpu(), torch.from_numpy(data[off:off + n])), off


def test_an_agent_loads_its_served_version_onto_the_gpu_through_the_reader(tmp_path: Path) -> None:
    """`hwtui agent --device cuda` serving a version from disk (its start, a switch finished from a
    staged copy): the data section goes into the device slot through the parallel reader, exact."""
    import time

    import torch
    from safetensors.torch import save_file

    from hwtui.engine.resident.device_served import DeviceServed

    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA (a CPU build of torch on a GPU machine)")
    g = torch.Generator().manual_seed(7)
    tensors = {f"w{i}": torch.randint(-(2**31), 2**31 - 1, (32 * MB,), dtype=torch.int32, generator=g) for i in range(4)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    path.read_bytes()  # warm in the page cache, as a version the agent just staged is
    d = DeviceServed("cuda")
    try:
        t = time.perf_counter()
        d.load("v1", path)
        dt = time.perf_counter() - t
        version, buf = d.served()
        raw = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
        assert version == "v1" and torch.equal(buf.cpu(), raw[len(raw) - buf.numel():])
        print(f"\nagent load from disk: {buf.numel() / 1e9:.2f} GB onto cuda in {dt * 1e3:.1f} ms "
              f"({buf.numel() / dt / 1e9:.2f} GB/s, slot allocation included)")
    finally:
        d.close()
