"""Secrets never reach a snapshot, a check report (text, JSON, JUnit) or a finding.

Attacks from issue 12: a snapshot used to record the whole environment and mask by name only, so
DB_PASS, GITHUB_PAT, SSHPASS, JWTs and webhook URLs leaked; URL passwords holding '/' or '@'
leaked; ``MASTER_ADDR=admin:pw@host`` leaked into check JSON and JUnit; a 100 KB value made
redaction take 38 s (an unanchored scheme regex).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.core.redact import MASK, redact, redact_env, redact_text
from hwtui.probes.catalog import catalog
from hwtui.probes.envnames import PROBE_ENV_NAMES, PROBE_ENV_PREFIXES, probe_reads
from hwtui.probes.framework import run_checks
from hwtui.probes.host import RecordingHost, ReplayHost
from tests import cli_proc, machines

ROOT = Path(__file__).resolve().parents[2]
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"

# (text, the secret that must disappear, what must survive)
FREE_TEXT = [
    ("https://bob:pa/ss@pypi.corp/simple", "pa/ss", "pypi.corp/simple"),
    ("https://bob:p@ss@pypi.corp:443/simple", "p@ss", "pypi.corp:443/simple"),
    ("postgres://app:s3cr@t/x@db.local:5432/app", "s3cr@t/x", "db.local:5432/app"),
    ("MASTER_ADDR=admin:pw0rd@head-node", "pw0rd", "head-node"),
    ("admin:pw0rd@10.0.0.1", "pw0rd", "10.0.0.1"),
    ("https://hooks.slack.com/services/T0001/B0001/XXXXXXXXXXXXXXXX", "XXXXXXXXXXXXXXXX", "hooks.slack.com"),
    ("https://discord.com/api/webhooks/1234/AbCdEfGh", "AbCdEfGh", "discord.com"),
    (f"session {JWT} ok", JWT[:20], "session"),
    ("DB_PASS=hunter2 GITHUB_PAT=ghtoken1 SSHPASS=sshpw1 --password=cli-pw", "hunter2", "DB_PASS="),
    ("GITHUB_PAT=ghtoken1", "ghtoken1", "GITHUB_PAT="),
    ("SSHPASS=sshpw1", "sshpw1", "SSHPASS="),
    ("--password=cli-pw", "cli-pw", "--password="),
    ("s3://b/k?X-Amz-Signature=abc123def&X-Amz-Date=1", "abc123def", "X-Amz-Date=1"),
    ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop", "Authorization"),
    ("token ghp_" + "a" * 36, "ghp_aaaa", "token"),
    ("glpat-" + "b" * 20, "glpat-bbbb", ""),
]
# Values that look a little like credentials and must be left alone.
INNOCENT = ["git@github.com:org/repo.git", "https://medium.com/@user", "[fe80::1%eth0]:29500", "10.0.0.1:29500",
            "tcp://10.0.0.1:29500", "NCCL_SOCKET_IFNAME=eth0:1", "bob@example.com", "mlx5_0:1,mlx5_1:1",
            "https://h:8080/p@q"]


@pytest.mark.parametrize(("text", "secret", "kept"), FREE_TEXT)
def test_credentials_in_free_text_are_masked(text, secret, kept):
    out = redact_text(text)
    assert secret not in out and MASK in out
    assert kept in out
    assert redact_text(out) == out  # idempotent: a report redacted twice reads the same


@pytest.mark.parametrize("text", INNOCENT)
def test_look_alikes_survive(text):
    assert redact_text(text) == text


def test_secret_names_masked_whatever_the_value():
    env = redact_env({"DB_PASS": "a", "GITHUB_PAT": "b", "SSHPASS": "c", "SENTRY_DSN": "d", "SLACK_WEBHOOK": "e",
                      "PWD": "/home/a", "PATH": "/bin", "MASTER_ADDR": "admin:pw@h"})
    assert env["DB_PASS"] == env["GITHUB_PAT"] == env["SSHPASS"] == env["SENTRY_DSN"] == env["SLACK_WEBHOOK"] == MASK
    assert env["PWD"] == "/home/a" and env["PATH"] == "/bin" and env["MASTER_ADDR"] == f"{MASK}@h"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", [
    "a" * 1_000_000, "eth0," * 200_000, "http" * 250_000, "eyJ" * 333_333, "sk-" * 333_333, "@" * 1_000_000,
    ":@" * 500_000, "a://" * 250_000 + "@", "token=" * 166_666, "x " * 500_000, "bearer" + " " * 1_000_000,
    "a:" * 500_000 + "@h",
], ids=lambda s: f"{s[:8]!r}x{len(s)}")
def test_redaction_of_a_1mb_value_is_linear(shape):
    """Each shape made some regex restart its scan at every character (quadratic: 38 s for 100 KB).

    A hang guard rather than a timing: a quadratic scan of 1 MB takes hours, so the timeout only
    trips on a regression. The figure (under 0.1 s per MB) comes from benchmarks/bench_redact.py.
    """
    big = redact_text(shape)
    assert redact_text(big) == big
    assert big.count(MASK) <= max(1, len(shape) // 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([*"ab:/@=?&.%- \"'", "://", "token=", "DB_PASS=", "pass", "hooks.slack.com/",
                                  "Bearer ", "eyJ", "hf_"]), max_size=30).map("".join))
def test_redaction_is_idempotent_on_hostile_mixtures(s):
    once = redact_text(s)
    assert redact_text(once) == once


# -- snapshots record only what the probes read ------------------------------------------------------------

HOSTILE_ENV = {
    "PATH": "/usr/bin:/bin", "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "admin:pw0rd@head-node",
    "MASTER_PORT": "29500", "NCCL_SOCKET_IFNAME": "eth0",
    "DB_PASS": "dbsecret1", "GITHUB_PAT": "patsecret1", "SSHPASS": "sshsecret1", "MY_JWT": JWT,
    "ALERTS": "https://hooks.slack.com/services/T1/B1/hooksecret1", "WEIRD": "plainsecret1",
}
SECRETS = ("pw0rd", "dbsecret1", "patsecret1", "sshsecret1", JWT[:30], "hooksecret1", "plainsecret1")


def test_snapshot_keeps_only_the_variables_probes_read(tmp_path):
    fs = machines.h100_x8(tmp_path / "tree")
    recorder = RecordingHost(fs.host(dict(HOSTILE_ENV)))
    collectors, rules = catalog()
    run_checks(recorder, collectors, rules)
    snap = recorder.snapshot()
    text = json.dumps(snap)
    for secret in SECRETS:
        assert secret not in text, secret
    assert set(snap["env"]) == {"PATH", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME"}
    assert snap["env"]["MASTER_ADDR"] == f"{MASK}@head-node"
    # And the replay still sees what the probes need.
    replay = ReplayHost(json.loads(text))
    assert replay.env["NCCL_SOCKET_IFNAME"] == "eth0" and replay.env["WORLD_SIZE"] == "2"


@pytest.mark.parametrize("name", sorted(machines.MACHINES))
def test_every_variable_a_probe_looks_up_is_on_the_allow_list(tmp_path, name):
    """The allow-list is derived from what the code reads: a new probe reading a new name fails here."""
    fs = machines.MACHINES[name](tmp_path / "tree")
    env = {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
           "SLURM_PROCID": "1", "TORCHELASTIC_RUN_ID": "x", "NCCL_IB_HCA": "mlx5_0", "OMPI_COMM_WORLD_RANK": "1"}
    recorder = RecordingHost(fs.host(env))
    collectors, rules = catalog()
    run_checks(recorder, collectors, rules)
    unlisted = sorted(n for n in recorder.env.looked_up if not probe_reads(n))
    assert not unlisted, f"probes read {unlisted}: add them to hwtui/probes/envnames.py and docs/trust.md"
    assert recorder.env.looked_up  # the recorder did see the probes' lookups


def _is_env(node: ast.expr) -> bool:
    """Whether an expression names the probed environment (``env``, ``host.env``, ``facts.host.env``);
    a child process's own ``child_env`` is not it."""
    text = ast.unparse(node)
    return text.endswith("env") and not text.endswith("child_env")


def _env_names_in_source(root: Path) -> dict[str, str]:
    """Every string constant the probes' code uses as an environment name: ``env.get("X")``,
    ``env["X"]``, ``"X" in env``, ``env_int(env, "X")`` and module tables named ``*_VARS``/``*_ENV``."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            keys: list[ast.expr] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and _is_env(node.func.value) and node.args:
                keys.append(node.args[0])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "env_int" \
                    and len(node.args) > 1:
                keys.append(node.args[1])
            elif isinstance(node, ast.Subscript) and _is_env(node.value):
                keys.append(node.slice)
            elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) \
                    and _is_env(node.comparators[-1]):
                keys.append(node.left)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id.endswith(("_VARS", "_ENV", "_ENV_KEYS")) for t in targets):
                    value = node.value
                    keys += [k for k in value.keys if k is not None] if isinstance(value, ast.Dict) \
                        else list(getattr(value, "elts", []))
            for key in keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found.setdefault(key.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_variable_named_in_probe_code_is_on_the_allow_list():
    """The static half of the derivation: names on code paths no recorded machine reaches."""
    found = _env_names_in_source(ROOT / "probes")
    assert len(found) > 40  # the scan does see the probes' reads
    unlisted = {name: where for name, where in found.items() if not probe_reads(name)}
    assert not unlisted, f"add to hwtui/probes/envnames.py and docs/trust.md: {unlisted}"


def test_the_allow_list_is_documented_exactly():
    doc = (ROOT / "docs" / "trust.md").read_text()
    section = doc.split("<!-- env-allow-list -->")[1].split("<!-- /env-allow-list -->")[0]
    documented = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", section))
    assert documented == set(PROBE_ENV_NAMES)
    for prefix in PROBE_ENV_PREFIXES:
        assert f"`{prefix}*`" in section


# -- the check CLI: text, JSON and JUnit all masked --------------------------------------------------------

def _hwtui(*args: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "MASTER_", "WORLD_", "RANK", "LOCAL_"))}
    env.update(env_extra)
    return cli_proc.run([sys.executable, "-m", "hwtui.app", *args], capture_output=True, text=True, env=env,
                        timeout=120)


def test_check_json_junit_and_text_mask_master_addr_credentials(tmp_path):
    fs = machines.h100_x8(tmp_path / "tree")
    junit = tmp_path / "report.xml"
    hostile = {"MASTER_ADDR": "admin:pw0rd@head-node", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "0",
               "NCCL_SOCKET_IFNAME": "https://bob:pa/ss@evil/x"}
    r = _hwtui("--check", "--json", "--only", "env", "--sysroot", str(fs.root), "--junit", str(junit),
               env_extra=hostile)
    assert r.returncode in (0, 1), r.stderr
    json.loads(r.stdout)
    t = _hwtui("--check", "--only", "env", "--sysroot", str(fs.root), env_extra=hostile)
    assert t.returncode in (0, 1), t.stderr
    for out in (r.stdout, junit.read_text(), t.stdout, r.stderr, t.stderr):
        assert "pw0rd" not in out and "pa/ss" not in out
    assert "head-node" in r.stdout  # the finding is still there, only the password is gone


def test_redact_masks_secret_keys_in_structures():
    doc = {"env": {"GITHUB_PAT": "p", "SSHPASS": "s"}, "cmd": ["curl", "https://u:p/w@h/x"], "n": 3}
    assert redact(doc) == {"env": {"GITHUB_PAT": MASK, "SSHPASS": MASK}, "cmd": ["curl", f"https://{MASK}@h/x"], "n": 3}


def test_redaction_benchmark_runs_at_toy_size():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_redact.py"), "--runs", "1", "--mb", "0.05"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    # Every shape prints its two times and their ratio (the figures themselves are the benchmark's, not a test's).
    assert len(rows) >= 10 and all(float(row[-1]) >= 0 and float(row[-2]) >= 0 for row in rows)
