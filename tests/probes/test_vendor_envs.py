"""Per-vendor environments: the plan, `hwtui setup`, the config record, and the per-device verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from hwtui.app.cli import main
from hwtui.core.finding import Status
from hwtui.probes import vendor_envs as ve
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import collect, run_checks
from tests.probes import recorded
from tests.probes.recorded import PYTHON, version_py_text

CONFIG = "/home/alice/.config/hwtui/config.json"
ENV = {"HOME": "/home/alice"}


def check(fs, env=None):
    collectors, rules = catalog()
    wanted = ("pci", "host", "nvml", "torch_build", "vendor_envs")
    result = run_checks(fs.host({**ENV, **(env or {})}), [c for c in collectors if c.name in wanted],
                        [r for r in rules if r.name == "vendor_envs"])
    return {f.id: f for f in result.findings}


def venv_with_torch(fs, prefix, version, **consts):
    python = f"{prefix}/bin/python"
    fs.file(python, "")
    fs.file(f"{prefix}/lib/python3.12/site-packages/torch/version.py",
            version_py_text({"__version__": version, **consts}))
    return python


def test_mixed_host_with_cuda_torch_is_no_longer_a_silent_pass(tmp_path):
    got = check(recorded.mixed3(tmp_path))
    assert got["torch.interpreter[cuda:0]"].status == Status.PASS and PYTHON in got["torch.interpreter[cuda:0]"].title
    for dev, vendor, backend in (("hip:0", "AMD", "HIP"), ("xpu:0", "Intel", "XPU")):
        f = got[f"torch.interpreter[{dev}]"]
        assert f.status == Status.WARN, f
        assert f.remedy.startswith(f"hwtui setup --vendor {vendor}") and f"HWTUI_PYTHON_{backend}=" in f.remedy


def test_configured_environments_drive_the_other_vendors(tmp_path):
    fs = recorded.mixed3(tmp_path)
    hip = venv_with_torch(fs, "/home/alice/.local/share/hwtui/envs/hip", "2.8.0+rocm6.4", hip="6.4.1", rocm="6.4.1")
    fs.file(CONFIG, json.dumps({"schema": "hwtui.tui-config/1", "steps": 9,
                                "environments": {"hip": {"python": hip, "tag": "rocm6.4"},
                                                 "xpu": {"python": "/gone/bin/python", "tag": "xpu"}}}))
    xpu = venv_with_torch(fs, "/opt/xpu", "2.8.0+xpu", xpu="20250101")
    got = check(fs)
    assert got["torch.interpreter[hip:0]"].status == Status.PASS and hip in got["torch.interpreter[hip:0]"].title
    assert got["torch.environments[xpu]"].status == Status.FAIL
    assert got["torch.interpreter[xpu:0]"].status == Status.WARN
    got = check(fs, {"HWTUI_PYTHON_XPU": xpu})
    assert got["torch.interpreter[xpu:0]"].status == Status.PASS and "HWTUI_PYTHON_XPU" in got["torch.interpreter[xpu:0]"].title


def test_broken_config_file_is_named(tmp_path):
    fs = recorded.mixed3(tmp_path)
    fs.file(CONFIG, "{not json")
    f = check(fs)["torch.environments"]
    assert f.status == Status.FAIL and CONFIG in f.title


def test_plan_picks_each_vendors_wheel(tmp_path):
    fs = recorded.mixed3(tmp_path)
    collectors, _ = catalog()
    facts, _ = collect(fs.host(ENV), [c for c in collectors if c.name in ("pci", "nvml", "host")])
    plans = ve.plan_environments(facts, "/envs")
    assert [(p.vendor, p.backend, p.tag, p.python) for p in plans] == [
        ("NVIDIA", "cuda", "cu126", "/envs/cuda/bin/python"), ("AMD", "hip", "rocm6.4", "/envs/hip/bin/python"),
        ("Intel", "xpu", "xpu", "/envs/xpu/bin/python")]
    assert [p.vendor for p in ve.plan_environments(facts, "/envs", {"Intel"})] == ["Intel"]
    uv = ve.commands_for(plans[1], "/usr/bin/python3", "uv", "/src")
    assert uv[1] == ["uv", "pip", "install", "--python", "/envs/hip/bin/python", "torch", "--index-url",
                     "https://download.pytorch.org/whl/rocm6.4"]


def test_setup_dry_run_prints_exact_commands_and_writes_nothing(tmp_path, capsys, monkeypatch):
    recorded.mixed3(tmp_path / "tree")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    code = main(["setup", "--dry-run", "--sysroot", str(tmp_path / "tree"), "--tool", "pip", "--dir", "/e d",
                 "--python", "/usr/bin/python3"])
    out = capsys.readouterr()
    assert code == 0
    lines = [line for line in out.out.splitlines() if not line.startswith("#")]
    assert lines[:2] == ["/usr/bin/python3 -m venv --without-pip '/e d/cuda'",
                         "/usr/bin/python3 -m pip --python '/e d/cuda/bin/python' install torch "
                         "--index-url https://download.pytorch.org/whl/cu126"]
    assert "--index-url https://download.pytorch.org/whl/rocm6.4" in out.out and "whl/xpu" in out.out
    assert "dry run" in out.err and not (tmp_path / "cfg").exists()


def test_record_keeps_the_tuis_choices_and_interpreter_precedence(tmp_path):
    from hwtui.app.tui.config import TuiConfig

    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = tmp_path / "hwtui" / "config.json"
    TuiConfig(steps=77).save(path)
    python = tmp_path / "py"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    ve.record_environments({"hip": {"python": str(python), "tag": "rocm6.4"}}, env)
    assert TuiConfig.load(path).steps == 77
    TuiConfig(steps=78).save(path)  # the wizard saving its choices keeps the environments
    assert ve.load_environments(env)["hip"]["tag"] == "rocm6.4"
    assert ve.interpreter_for("hip", env, default="/default") == str(python)
    assert ve.interpreter_for("hip", {**env, "HWTUI_PYTHON_HIP": "/override"}, default="/d") == "/override"
    assert ve.interpreter_for("xpu", env, default="/default") == "/default"
    python.chmod(0o644)  # a vanished or broken environment falls back instead of failing every worker
    assert ve.interpreter_for("hip", env, default="/default") == "/default"
    path.write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        ve.record_environments({"hip": {"python": "x"}}, env)


# -- a real install, against a fake local index (no network) --------------------------------------

def wheel(folder, name, version, files):
    dist = f"{name}-{version}"
    path = folder / name / f"{dist}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    (folder / name / "index.html").write_text(f'<html><body><a href="{path.name}">{path.name}</a></body></html>')


def test_setup_installs_from_a_fake_index_and_records_the_interpreter(tmp_path):
    torch_index, deps_index = tmp_path / "whl" / "xpu", tmp_path / "pypi"
    wheel(torch_index, "torch", "2.99.0+xpu", {"torch/__init__.py": "", "torch/version.py":
                                                 version_py_text({"__version__": "2.99.0+xpu", "xpu": "20250101"})})
    for name in ("numpy", "safetensors", "xxhash"):
        wheel(deps_index, name, "99.0", {f"{name}/__init__.py": ""})
    tree = tmp_path / "tree"
    recorded.arc_a770(tree)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run([sys.executable, "-m", "hwtui", "setup", "--sysroot", str(tree), "--tool", "pip",
                           "--dir", str(tmp_path / "envs"), "--index-url", (tmp_path / "whl").as_uri(),
                           "--deps-index-url", deps_index.as_uri()], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    python = str(tmp_path / "envs" / "xpu" / "bin" / "python")
    recorded_envs = ve.load_environments({"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert recorded_envs["xpu"]["python"] == python and recorded_envs["xpu"]["tag"] == "xpu"
    assert ve.interpreter_for("xpu", {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == python
    # What `train` will start for xpu workers (launcher.py asks interpreter_for) imports this hwtui
    # tree through the .pth and has the vendor's torch build.
    probe = subprocess.run([python, "-c", "import hwtui.probes.vendor_envs, torch.version as v; print(v.__version__)"],
                           env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "2.99.0+xpu", probe.stderr[-800:]


def test_a_failed_install_step_is_one_line_exit_1_and_records_nothing(tmp_path):
    (tmp_path / "whl" / "xpu").mkdir(parents=True)  # an index without torch
    tree = tmp_path / "tree"
    recorded.arc_a770(tree)
    cfg = tmp_path / "cfg"
    proc = subprocess.run([sys.executable, "-m", "hwtui", "setup", "--sysroot", str(tree), "--tool", "pip",
                           "--dir", str(tmp_path / "envs"), "--index-url", (tmp_path / "whl").as_uri()],
                          env={**os.environ, "XDG_CONFIG_HOME": str(cfg)}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hwtui: error: `") and "exited with status" in last and "nothing was recorded" in last
    assert not cfg.exists() and not (tmp_path / "envs" / "xpu").exists()
