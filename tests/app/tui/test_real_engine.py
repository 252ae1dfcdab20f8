"""The wizard, end to end on a replayed H100 box, starting the REAL engines on CPU ranks.

``hwtui plan`` + ``hwtui replicate`` (2 gloo ranks on loopback) and ``hwtui train`` (cpu:0,cpu:1)
run as child processes exactly as a user's run would; the dashboard must show what they report.
"""

from __future__ import annotations

import importlib.util

import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from hwtui.widgets.bucket_lanes import BucketLanes
from hwtui.widgets.progress_eta import ProgressEta
from hwtui.widgets.worker_table import WorkerTable
from tests.app.tui.conftest import FixedSampler, to_engine_step, wait_for

pytestmark = [
    pytest.mark.torch,
    pytest.mark.timeout(240),
    pytest.mark.skipif(importlib.util.find_spec("hwtui.app.commands.replicate") is None
                       or importlib.util.find_spec("hwtui.app.commands.train") is None,
                       reason="the engine commands are not in this build"),
]


@pytest.fixture
def weights(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(7)
    path = tmp_path / "model.safetensors"
    save_file({f"layer{i}.weight": torch.randn(256, 256, generator=gen) for i in range(8)}, str(path))  # 2 MiB
    return path


async def test_real_replication_then_training_from_the_wizard(snapshots, weights):
    app = HwtuiApp(ReplayHost.load(snapshots["example:h100_x8"]), TuiConfig.load(), config_file=config_path(),
                   sampler_factory=FixedSampler)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.devices)
        await to_engine_step(pilot)
        engine = app.screen
        assert engine.STEP == "engine"
        engine.query_one("#source").value = "weights"
        engine.query_one("#in-weights").value = str(weights)
        engine.query_one("#in-device").value = "cpu"  # the replayed H100s are not here; CPU ranks are
        engine.query_one("#in-nproc").value = "2"
        engine.query_one("#in-bucket_mb").value = "1"
        engine.query_one("#in-chunk_mb").value = "1"
        await pilot.press("ctrl+s")
        run = app.screen
        assert run.STEP == "run"
        await wait_for(pilot, lambda: run.state.finished, timeout=120)
        await pilot.pause(0.3)
        log = "\n".join(t for _, t in run.state.log)
        assert run.state.exit_code == 0, log
        repl = run.state.repl
        assert repl.n_buckets == 2 and repl.count("done") == 2, log
        assert repl.done and repl.done.ok and repl.peak_gbps > 0
        assert repl.start.world_size == 2 and repl.start.window == app.defaults["window"]
        # What is drawn is what the engine itself reports.
        source = next(r for r in repl.done.report["ranks"] if r["rank"] == 0)
        # On one host the receivers copy from the source's page cache: the source's window then moves
        # nothing over the network and its report has no occupancy; the lanes must say the same.
        assert repl.peak_lanes == source["window"].get("peak_occupancy", 0) <= repl.start.window
        assert repl.bytes_done == repl.done.report["bytes"]
        assert "buckets 2/2" in str(run.query_one(BucketLanes).render())
        assert run.query_one(ProgressEta).status == "done"
        assert "Using CPU broadcast transport" in log

        # Back to the Engine step, switch to training, run it.
        await pilot.press("b")
        engine = app.screen
        engine.query_one("#mode").value = "train"
        engine.query_one("#in-gpu_ids").value = "cpu:0,cpu:1"
        engine.query_one("#in-steps").value = "4"
        # The user's own model and text, as `hwtui train --model --data` takes them.
        engine.query_one("#in-model").value = "tests.engine.training._models:tiny"
        text = weights.parent / "corpus.txt"
        text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400)))
        engine.query_one("#in-data").value = str(text)
        await pilot.press("ctrl+s")
        run = app.screen
        await wait_for(pilot, lambda: run.state.finished, timeout=180)
        await pilot.pause(0.3)
        log = "\n".join(t for _, t in run.state.log)
        assert run.state.exit_code == 0, log
        train = run.state.train
        assert train.done and train.done.ok, log
        assert train.step == train.done.report["step"] == 4, "progress is the engine's own step count"
        from tests.engine.training._models import tiny

        assert train.start.params == sum(p.numel() for p in tiny().parameters()), "the user's model was trained"
        assert "--model tests.engine.training._models:tiny --data" in log
        assert set(train.workers) == {0, 1} and train.step >= 4  # dynamic balance: a fast worker may take more
        assert len(train.loss) >= 1 and train.merges
        assert run.query_one(WorkerTable).row_count == 2
        assert run.query_one(ProgressEta).status == "done"
