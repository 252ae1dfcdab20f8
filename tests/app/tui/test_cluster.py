"""The cluster choice of the Engine step: describe, write the launch files, smoke-test, see results.

The launch files are written by the real `hwtui cluster init` subprocess and compared with
``engine.cluster.launchfiles.plan`` for the same description; the smoke test is the real
`hwtui cluster test` under `torchrun --standalone` (2 gloo ranks on loopback, a 64K sweep).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from hwtui.widgets.cluster_summary import ClusterSummary
from hwtui.widgets.launch_commands import LaunchCommands
from hwtui.widgets.progress_eta import ProgressEta
from tests.app.tui.conftest import FixedSampler, RecordedEngine, to_engine_step, wait_for

pytestmark = pytest.mark.timeout(120)


def make_app(snapshot, engine=None) -> HwtuiApp:
    return HwtuiApp(ReplayHost.load(snapshot), TuiConfig.load(), config_file=config_path(), engine_stages=engine,
                    sampler_factory=FixedSampler)


async def to_cluster_form(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.devices)
    await to_engine_step(pilot)
    assert app.screen.STEP == "engine"
    app.screen.query_one("#mode").focus()
    await pilot.press("right", "right")  # replicate -> train -> cluster, by keyboard
    assert app.screen.query_one("#mode").value == "cluster"
    assert app.screen.has_class("-cluster")


async def test_cluster_form_writes_the_launch_files(snapshots, tmp_path):
    from hwtui.engine.cluster import launchfiles
    from hwtui.engine.cluster.spec import ClusterSpec, parse_nodes

    out = tmp_path / "cluster"
    app = make_app(snapshots["example:rtx4090_rx7800xt_arc_a750"])
    async with app.run_test(size=(80, 24)) as pilot:
        await to_cluster_form(pilot)
        screen = app.screen
        # The interface default comes from the replayed machine's interfaces: eth0 (lo is loopback).
        await wait_for(pilot, lambda: screen.interfaces)
        assert screen.query_one("#in-c-interface").placeholder.startswith("eth0 (detected")
        screen.query_one("#in-c-nodes").value = "a=10.0.0.1,b=10.0.0.2"
        screen.query_one("#in-c-devices").value = "2"
        screen.query_one("#in-c-out").value = str(out)
        await pilot.press("ctrl+o")
        table = screen.query_one(LaunchCommands)
        await wait_for(pilot, lambda: table.row_count > 0)
        assert not str(screen.query_one("#problems").render()).strip()

        spec = ClusterSpec(nodes=parse_nodes("a=10.0.0.1,b=10.0.0.2"), devices_per_node=2, interface="eth0").validate()
        expected = launchfiles.plan(spec, out)
        assert dict(table.commands) == expected.commands and set(expected.commands) == {"a", "b"}
        for rel in [*expected.files, launchfiles.SPEC_FILE]:
            assert (out / rel).is_file(), rel
        assert json.loads((out / "cluster.json").read_text())["interface"] == "eth0"
        assert "export NCCL_SOCKET_IFNAME=eth0" in (out / "env" / "b.env").read_text()
        files = str(screen.query_one("#cluster-files").render())
        assert "cluster.json" in files and "submit.sbatch" in files

        # The highlighted command is the one copied.
        table.focus()
        await pilot.press("down", "ctrl+y")
        assert app.clipboard == expected.commands["b"]

        # Remembered for next time.
        saved = json.loads(config_path().read_text())
        assert saved["mode"] == "cluster" and saved["cluster_nodes"] == "a=10.0.0.1,b=10.0.0.2"
        assert saved["cluster_devices"] == 2 and saved["cluster_out"] == str(out)

        # A second write refuses to clobber cluster.json until asked twice.
        before = (out / "cluster.json").stat().st_mtime_ns
        screen.query_one("#in-c-nodes").value = "a=10.0.0.1,b=10.0.0.2,c=10.0.0.3"
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: "ctrl+o again" in str(screen.query_one("#cluster-files").render()))
        assert (out / "cluster.json").stat().st_mtime_ns == before
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: table.row_count == 3)
        assert (out / "launch-c.sh").is_file()


async def test_bad_node_list_shows_the_cli_error(snapshots, tmp_path):
    from hwtui.engine.cluster.spec import ClusterSpec, SpecError, parse_nodes

    engine = RecordedEngine("cluster_two_nodes.jsonl")
    app = make_app(snapshots["example:rtx4090_rx7800xt_arc_a750"], engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await to_cluster_form(pilot)
        screen = app.screen
        screen.query_one("#in-c-nodes").value = "a=10.0.0.1,bad_host!"
        screen.query_one("#in-c-out").value = str(tmp_path / "never")
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        with pytest.raises(SpecError) as cli_error:
            ClusterSpec(nodes=parse_nodes("a=10.0.0.1,bad_host!")).validate()
        problems = str(screen.query_one("#problems").render()).strip()
        assert problems == str(cli_error.value), "the same one-line message the CLI prints"
        assert "\n" not in problems
        assert screen.query_one("#in-c-nodes").has_class("-invalid")
        assert not (tmp_path / "never").exists()
        await pilot.press("ctrl+s")
        assert app.screen.STEP == "engine" and engine.calls == 0, "a bad description starts nothing"


async def test_recorded_smoke_test_on_the_run_screen(snapshots):
    """What the user sees of a recorded two-node test: the summary, the bandwidth table (largest
    size last), the worst finding's remedy on `c`, the bar at done, the monitor column hidden."""
    engine = RecordedEngine("cluster_two_nodes.jsonl", delay=0.005)
    app = make_app(snapshots["example:rtx4090_rx7800xt_arc_a750"], engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await to_cluster_form(pilot)
        await pilot.press("ctrl+s")  # no nodes needed for the local smoke test
        run = app.screen
        assert run.STEP == "run"
        eta = run.query_one(ProgressEta)
        await wait_for(pilot, lambda: _plain(app, eta).startswith("done"))
        await pilot.pause(0.3)
        assert "2 nodes reported" in _plain(app, eta)
        assert engine.cfg.mode == "cluster"
        assert run.query_one("#views").current == "view-cluster"
        rendered = _plain(app, run.query_one(ClusterSummary))
        assert "PASSED: 2 rank(s) on 2 node(s)" in rendered
        assert "node-b" in rendered and "all-reduce ok" in rendered
        table = rendered[rendered.index("GB/s size"):].splitlines()[1:]
        sizes = [line.split()[0] for line in table if line.strip()]
        assert sizes == ["16K", "256K", "4M", "64M"], "sizes in order, the largest last"
        assert table[-1].split()[1:] == ["1.920", "1.920", "1.210", "1.210"]
        # The findings list opens on the worst finding (the interface mismatch); c copies its remedy.
        await pilot.press("c")
        assert app.clipboard.startswith("hwtui cluster init") and "--node-interface node-b=ens5" in app.clipboard
        assert not run.query_one("#monitor-col").display, "a cluster test has no device monitor beside it"


def _plain(_app, widget) -> str:
    import io

    from rich.console import Console

    console = Console(width=98, no_color=True, file=io.StringIO())
    console.print(widget.render())
    return console.file.getvalue()


@pytest.mark.torch
@pytest.mark.timeout(120)
async def test_real_two_rank_smoke_test_from_the_wizard(snapshots):
    app = make_app(snapshots["example:rtx4090_rx7800xt_arc_a750"])
    async with app.run_test(size=(100, 30)) as pilot:
        await to_cluster_form(pilot)
        screen = app.screen
        screen.query_one("#in-c-devices").value = "2"  # one node, two ranks: torchrun --standalone
        screen.query_one("#in-c-max_bytes").value = "64K"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: getattr(app.screen, "STEP", "") == "run")
        run = app.screen
        await wait_for(pilot, lambda: run.state.finished, timeout=90)
        await pilot.pause(0.3)
        log = "\n".join(t for _, t in run.state.log)
        assert run.state.exit_code == 0, log
        assert "torch.distributed.run --standalone --nproc-per-node=2" in log
        cluster = run.state.cluster
        assert set(cluster.nodes) == {0, 1} and cluster.correctness.ok
        assert cluster.done and cluster.done.ok and cluster.done.world_size == 2
        summary = run.query_one(ClusterSummary)
        rows = summary.bandwidth_rows()
        assert [size for size, _ in rows][-1] == 64 * 1024
        assert all(set(ops) == {"broadcast", "all_reduce"} for _, ops in rows)
        assert all(b.busbw > 0 for _, ops in rows for b in ops.values())
        rendered = _plain(app, summary)
        assert "PASSED: 2 rank(s)" in rendered and "64K" in rendered
        assert run.query_one(ProgressEta).status == "done"


def test_stage_for_the_local_smoke_test():
    from hwtui.app.tui.engine_process import build_stages

    defaults = {"devices_per_node": 1, "nproc": 2, "device": "cpu"}
    one = build_stages(TuiConfig(mode="cluster"), defaults, Path("."))
    assert one[0].argv[1:] == ["-m", "hwtui.app", "cluster", "test", "--events", "-"]
    two = build_stages(TuiConfig(mode="cluster", cluster_devices=2, cluster_max_bytes="1M"), defaults, Path("."))
    assert two[0].argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0"]
    assert two[0].argv[-2:] == ["--max-bytes", "1M"]
