"""The agent benchmark still runs (toy size): a speed target nobody can run is no target."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_agent.py"


@pytest.mark.timeout(60)
def test_view_benchmark_runs_and_every_node_stays_fresh():
    r = subprocess.run([sys.executable, str(BENCH), "--nodes", "4", "--seconds", "1.5"], capture_output=True, text=True,
                       timeout=50)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = {line[:30].strip(): line[30:].strip() for line in r.stdout.splitlines()}
    assert lines["nodes"] == "4"
    worst = float(lines["worst node age"].split()[0])
    interval = float(lines["refresh interval (adaptive)"].split()[0])
    assert 0 < worst <= 2 * interval  # a figure the machine's load cannot turn red: ages are bounded by design


@pytest.mark.timeout(120)
@pytest.mark.netns
def test_push_benchmark_runs_across_namespaces():
    """The hot-push figure between "hosts" (one network namespace per agent): a warm second push."""
    from tests.engine.cluster.netns import unavailable_reason

    if why := unavailable_reason():
        pytest.skip(f"cannot create network namespaces: {why}")
    r = subprocess.run([sys.executable, str(BENCH), "--push", "--mb", "4", "--pushes", "2", "--receivers", "1", "--netns"],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "one network namespace per agent" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [("1", "False"), ("2", "True")]  # the second push was warm
