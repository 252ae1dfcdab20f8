"""The suite's runner (tests/shards.py): every module runs once, whole, in one shard; failures reach
the exit code and the terminal; the summary counts every shard's tests."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULE = '''
import os
import pytest

RECORD = {record!r}


def _note(what):
    with open(RECORD, "a") as f:
        f.write(f"{{what}} {{os.getpid()}}\\n")


@pytest.fixture(scope="module")
def world():
    _note("setup {name}")
    yield
    _note("teardown {name}")


@pytest.mark.parametrize("i", range({count}))
def test_case(world, i):
    _note(f"run {name}::{{i}}")
    assert not ({fail} and i == 1), "planted failure in {name}"
'''


def _suite(tmp_path: Path, fail_in: str | None = None) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / "record.txt"
    for name, count in (("alpha", 4), ("beta", 3), ("gamma", 5), ("delta", 2)):
        (suite / f"test_{name}.py").write_text(MODULE.format(record=str(record), name=name, count=count, fail=name == fail_in))
    return suite


def _run(suite: Path, *also: str, shards: int = 2) -> subprocess.CompletedProcess[str]:
    checks = [a for cmd in also for a in ("--also", cmd)]
    return subprocess.run([sys.executable, "-m", "tests.shards", "-n", str(shards), *checks, str(suite), "-c",
                           str(suite / "pytest.ini"), "--rootdir", str(suite), "-p", "no:cacheprovider", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


def _records(tmp_path: Path) -> list[tuple[str, str, int]]:
    rows = []
    for line in (tmp_path / "record.txt").read_text().splitlines():
        kind, what, pid = line.split()
        rows.append((kind, what, int(pid)))
    return rows


def test_every_test_runs_once_and_a_module_stays_in_one_shard(tmp_path: Path) -> None:
    lint = f"HWTUI_SHARD_TEST=yes {sys.executable} -c 'import os, sys; sys.exit(os.environ[\"HWTUI_SHARD_TEST\"] != \"yes\")'"
    proc = _run(_suite(tmp_path), lint)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"`{lint}` passed" in proc.stdout, proc.stdout
    rows = _records(tmp_path)
    runs = Counter(what for kind, what, _ in rows if kind == "run")
    assert runs == Counter({f"{m}::{i}": 1 for m, n in (("alpha", 4), ("beta", 3), ("gamma", 5), ("delta", 2)) for i in range(n)})
    for module in ("alpha", "beta", "gamma", "delta"):
        pids = {pid for kind, what, pid in rows if what.startswith(module)}
        assert len(pids) == 1, f"{module} ran in {pids}"
        # The module-scoped fixture: set up once and torn down once, around all of its tests.
        kinds = [kind for kind, what, _ in rows if what.startswith(module)]
        assert kinds[0] == "setup" and kinds[-1] == "teardown" and kinds.count("setup") == kinds.count("teardown") == 1, kinds
    assert "14 passed" in proc.stdout.splitlines()[-1], proc.stdout
    # One progress line per module, from the shard that ran it.
    assert sum(" tests, 0 failed" in line for line in proc.stdout.splitlines()) == 4, proc.stdout


def test_a_failure_reaches_the_exit_code_and_the_terminal(tmp_path: Path) -> None:
    proc = _run(_suite(tmp_path, fail_in="gamma"), shards=1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "planted failure in gamma" in proc.stdout
    assert "test_gamma.py::test_case[1]" in proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert "1 failed" in last and "13 passed" in last, last


def test_a_failing_check_beside_the_shards_fails_the_run_and_shows_its_output(tmp_path: Path) -> None:
    lint = f"{sys.executable} -c 'print(\"core imports app: forbidden\"); raise SystemExit(3)'"
    proc = _run(_suite(tmp_path), lint, shards=1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"`{lint}` FAILED (exit 3" in proc.stdout and "core imports app: forbidden" in proc.stdout, proc.stdout
    assert "14 passed" in proc.stdout.splitlines()[-1], proc.stdout
