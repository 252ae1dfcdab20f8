"""The wheel installs everything under the hwtui namespace and nothing generic at top level."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path_factory.mktemp("src") / "hwtui"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", ".ruff_cache", ".hypothesis"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("hwtui-*.whl")
    return zipfile.ZipFile(whl)


def test_only_hwtui_at_top_level(wheel):
    tops = {n.split("/", 1)[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hwtui"}
    names = set(wheel.namelist())
    for pkg in ("app", "core", "probes", "engine", "widgets"):
        assert f"hwtui/{pkg}/__init__.py" in names


def test_metadata_extras_and_entry_point(wheel):
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    text = wheel.read(meta).decode()
    for extra in ("nvidia", "amd", "intel", "engine", "dev", "all"):
        assert f"Provides-Extra: {extra}" in text
    assert "nvidia-ml-py" in text and "Requires-Dist: pynvml" not in text
    base = [line for line in text.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [line for line in base if any(x in line for x in ("torch", "nvidia-ml-py", "amdsmi", "intel"))]
    (eps,) = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    assert "hwtui = hwtui.app.cli:entry" in wheel.read(eps).decode()


def test_a_clone_imports_its_own_tree(tmp_path):
    """Tests (and the processes they start) import the tree they sit in, not the editable install."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info",
                                                                               "__pycache__", ".pytest_cache", ".hypothesis"))
    code = ("import hwtui.core.events, hwtui.engine.replication.plan, hwtui.core.supervisor as s; "
            "print(hwtui.core.events.__file__); print(hwtui.engine.replication.plan.__file__); print(s.hwtui_root())")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=clone, env={**env, "PYTHONPATH": str(clone)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    events, plan, root = out.stdout.split()
    assert Path(events).resolve() == (clone / "core" / "events.py").resolve()
    assert Path(plan).resolve() == (clone / "engine" / "replication" / "plan.py").resolve()
    assert Path(root) == clone.resolve()
