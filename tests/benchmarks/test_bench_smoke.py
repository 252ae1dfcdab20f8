"""The benchmarks still run (at a toy size): a speed target nobody can run is no target."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_replication_benchmark_runs_bit_exact_at_toy_size():
    r = subprocess.run([sys.executable, str(BENCH / "bench_replication.py"), "--mb", "8", "--tensors", "40", "--rounds", "1",
                        "--planner-tensors", "0"], capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr[-2000:]
    table = {row[0]: row[-1] for row in (line.split() for line in r.stdout.splitlines())
             if len(row) == 4 and row[-1] in ("True", "False")}
    assert {"hwtui", "flat", "ddp_coalesced_25mb", "tensor_by_tensor"} <= set(table)
    assert set(table.values()) == {"True"}  # every method bit-exact
    assert "hwtui / flat" in r.stdout
