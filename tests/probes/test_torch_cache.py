"""The torch runtime cache: hit, invalidation, atomic file; a warm check never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hwtui.probes import torch_cache, torchwheel


@pytest.fixture()
def fake_install(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.8.0+cu128'\ncuda = '12.8'\n")
    dist = site / "torch-2.8.0+cu128.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text("torch/__init__.py,,\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(torch_cache, "locate_torch", lambda: {"package": str(site / "torch"),
                                                               "version_py": str(site / "torch" / "version.py"),
                                                               "dist_info": str(dist)})
    calls = []

    def fake_child(target, args, timeout, env):
        calls.append((target, args, env.get("CUDA_DEVICE_ORDER")))
        return {"version": {"torch": "2.8.0+cu128"}, "arch_list": ["sm_90"], "n": len(calls)}

    monkeypatch.setattr(torchwheel, "run_in_child", fake_child)
    return dist, calls


def test_hit_then_invalidated_by_reinstall(fake_install, tmp_path):
    dist, calls = fake_install
    args = {"probe_xpu": True, "probe_ccl": False, "probe_hpu": False}
    first = torchwheel.live_runtime(args)
    assert first["cached"] is False and first["n"] == 1 and calls[0][2] == "PCI_BUS_ID"
    second = torchwheel.live_runtime(args)
    assert second["cached"] is True and second["n"] == 1 and len(calls) == 1
    doc = json.loads((tmp_path / "cache" / "hwtui" / "torch-runtime.json").read_text())
    assert doc["schema"] == torch_cache.CACHE_SCHEMA and len(doc["entries"]) == 1
    # pip rewrites RECORD on reinstall: different size and mtime -> a new probe.
    (dist / "RECORD").write_text("torch/__init__.py,,\ntorch/version.py,,\n")
    third = torchwheel.live_runtime(args)
    assert third["cached"] is False and len(calls) == 2
    # Different probe arguments (an Intel GPU appeared) are a different entry too.
    torchwheel.live_runtime({**args, "probe_ccl": True})
    assert len(calls) == 3


def test_env_that_changes_what_torch_sees_is_part_of_the_key(fake_install, monkeypatch):
    _, calls = fake_install
    args = {"probe_xpu": True}
    torchwheel.live_runtime(args)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert torchwheel.live_runtime(args)["cached"] is False and len(calls) == 2


def test_failures_are_not_cached(tmp_path, monkeypatch):
    """A torch whose import kills the probe child (a broken install, a driver that aborts): the real
    child runs and dies, the failure is reported, and nothing is cached, so the next check retries."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("import os, sys\nsys.stderr.write('torch: driver aborted\\n')\nos._exit(7)\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.8.0+cu128'\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(site))  # the probe child imports from our sys.path first
    out = torchwheel.live_runtime({})
    assert out["installed"] is True and out["error"]["kind"] == "exit"
    assert "driver aborted" in out["error"]["stderr"]
    assert not torch_cache.cache_path().exists()
    assert torchwheel.live_runtime({})["error"]["kind"] == "exit", "tried again, not answered from a cache"


def test_corrupt_cache_is_ignored_and_replaced(fake_install):
    _, calls = fake_install
    path = torch_cache.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert torchwheel.live_runtime({})["cached"] is False
    assert json.loads(path.read_text())["schema"] == torch_cache.CACHE_SCHEMA
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


WARM_SCRIPT = textwrap.dedent("""
    import json, sys
    from hwtui.probes import torchwheel
    calls = []
    real = torchwheel.run_in_child
    def counting(*a, **k):
        calls.append(a[0])
        return real(*a, **k)
    torchwheel.run_in_child = counting
    from hwtui.probes.catalog import catalog
    from hwtui.probes.framework import run_checks
    from hwtui.probes.host import FsHost
    collectors, rules = catalog()
    res = run_checks(FsHost("/"), collectors, rules, only={"gpu"}, timeout_scale=3)
    rt = res.facts.get("torch_runtime") or {}
    print(json.dumps({"torch_imported": "torch" in sys.modules, "children": calls,
                      "cached": rt.get("cached"), "version": (rt.get("version") or {}).get("torch"),
                      "ids": sorted(f.id for f in res.findings)}))
""")


@pytest.mark.timeout(240)
def test_warm_check_does_not_import_torch(tmp_path):
    """A real cold check probes torch in a child once; the warm one imports nothing."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}

    def run():
        out = subprocess.run([sys.executable, "-c", WARM_SCRIPT], env=env, capture_output=True, text=True, timeout=200)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run()
    import importlib.metadata

    assert cold["children"] == ["hwtui.probes.runtime_child:torch_facts"]
    assert cold["cached"] is False and cold["version"] == importlib.metadata.version("torch")
    assert cold["torch_imported"] is False  # even cold, torch is imported only in the child
    warm = run()
    assert warm == {**cold, "children": [], "cached": True}
