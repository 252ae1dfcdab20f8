"""--device is validated against the installed torch build before any transport is chosen or announced."""

from __future__ import annotations

import sys

import pytest

from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.transport import torch_build, validate_device
from tests import cli_proc
from tests.engine.replication.helpers import make_model, write_plan

CPU = {"__version__": "2.13.0+cpu", "cuda": None, "hip": None, "xpu": None}


@pytest.mark.parametrize("device, build, wheel", [
    ("cuda", CPU, "whl/cu128"),
    ("hip", {**CPU, "cuda": "12.8"}, "whl/rocm"),
    ("xpu", CPU, "whl/xpu"),
])
def test_a_build_that_cannot_drive_the_device_names_the_wheel(device, build, wheel):
    with pytest.raises(HwtuiError, match=wheel) as exc:
        validate_device(device, build)
    assert f"--device {device}" in str(exc.value) and "2.13.0+cpu" in str(exc.value)


def test_builds_that_can_drive_the_device_pass():
    assert validate_device("cpu", CPU) == "cpu"
    assert validate_device("cuda", {**CPU, "cuda": "12.8"}) == "cuda"
    assert validate_device("cuda", {**CPU, "hip": "6.4"}) == "cuda"
    assert validate_device("hip", {**CPU, "hip": "6.4"}) == "cuda"  # ROCm torch drives AMD GPUs as "cuda"
    assert validate_device("xpu", {**CPU, "xpu": "20250101"}) == "xpu"
    assert validate_device("hpu", CPU, habana=True) == "hpu"
    with pytest.raises(HwtuiError, match="habana_frameworks"):
        validate_device("hpu", CPU, habana=False)


def test_cli_device_cuda_on_this_torch_is_exit_2_before_any_transport_line(tmp_path):
    build = torch_build()
    if build.get("cuda") or build.get("hip"):
        pytest.skip("this torch can drive CUDA")
    make_model(tmp_path / "src", seed=3, big=100, n=2)
    write_plan(tmp_path / "src", tmp_path / "p.json", version="d1")
    proc = cli_proc.run([sys.executable, "-m", "hwtui.app.cli", "replicate", "--plan", str(tmp_path / "p.json"),
                         "--device", "cuda", "--nproc", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "download.pytorch.org/whl/cu128" in proc.stderr
    assert "Using" not in proc.stderr and "Traceback" not in proc.stderr
