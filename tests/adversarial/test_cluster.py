"""`hwtui cluster init` under hostile input: nothing a user types can run as a command.

The launch files are run by people as root on every node, so quoting is proved by running them:
every generated file is sourced or executed with stub `mpirun`/`srun`/interpreter programs on PATH
that record what they were given, inside a scratch directory; a payload that escaped its quotes
would create the file ``pwned`` there. The stubs' records also prove every value arrives byte for
byte, which a check like ``bash -n`` cannot.
"""

from __future__ import annotations

import json
import os
import shlex
import string
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtui.app.cli import main
from hwtui.engine.cluster import launchfiles
from hwtui.engine.cluster import spec as specmod
from hwtui.engine.cluster.spec import ClusterSpec, Node, SpecError, valid_host

PAYLOADS = ["$(touch pwned)", "`touch pwned`", "';touch pwned;'", '";touch pwned;"', "\ntouch pwned\n",
            "x\\\n$(touch pwned)", "${IFS}touch${IFS}pwned", "a'b\"c$HOME", "\\';touch pwned;#"]

# Records argv and environment (NUL-separated) under $STUB_LOG; srun also runs its command the way
# srun would on a node, with SLURMD_NODENAME set.
RECORDER = """#!/bin/sh
n=$(basename "$0").$(date +%s%N).$$
printf '%s\\0' "$@" > "$STUB_LOG/$n.argv"
env -0 > "$STUB_LOG/$n.env"
"""
SRUN = RECORDER + """while :; do case "$1" in --*) shift;; *) break;; esac; done
SLURMD_NODENAME="$STUB_NODE" exec "$@"
"""


def _stub(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Sandbox:
    """A scratch directory with stub programs first on PATH; `run` starts a command there."""

    def __init__(self, root: Path, python_dir: str = "venv/bin"):
        self.root = root
        self.work = root / "work"
        self.log = root / "log"
        self.work.mkdir(parents=True)
        self.log.mkdir()
        self.bin = root / "bin"
        for name in ("mpirun", "torchrun", "hwtui", "sbatch"):
            _stub(self.bin / name, RECORDER)
        _stub(self.bin / "srun", SRUN)
        self.python = _stub(root / python_dir / "python", RECORDER)

    def run(self, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        full = {"PATH": f"{self.bin}:/usr/bin:/bin", "STUB_LOG": str(self.log), "HOME": str(self.root), **env}
        return subprocess.run(argv, cwd=self.work, env=full, capture_output=True, text=True, timeout=20)

    def records(self, program: str) -> list[tuple[list[str], dict[str, str]]]:
        out = []
        for argv_file in sorted(self.log.glob(f"{program}.*.argv")):
            argv = argv_file.read_bytes().decode().split("\0")[:-1]
            pairs = argv_file.with_suffix(".env").read_bytes().decode().split("\0")[:-1]
            out.append((argv, dict(p.split("=", 1) for p in pairs)))
        return out

    def clear(self) -> None:
        for f in self.log.iterdir():
            f.unlink()

    def escaped(self) -> list[str]:
        """Anything a payload created: the work directory must stay empty."""
        return sorted(p.name for p in self.work.iterdir())


def _run_every_file(box: Sandbox, out: Path, spec: ClusterSpec) -> dict[str, list[tuple[list[str], dict[str, str]]]]:
    """Source every env file and run every script; return what the stubs saw, per file."""
    seen = {}
    files = json.loads((out / launchfiles.MANIFEST).read_text())
    for rel in files:
        if rel == launchfiles.SPEC_FILE:
            continue
        box.clear()
        if rel.endswith(".env"):
            # Sourcing must define the variables and nothing else; the stub then reports what it got.
            done = box.run(["sh", "-c", '. "$1" && exec "$2"', "sh", str(out / rel), str(box.python)])
        elif rel == "submit.sbatch":
            done = box.run(["bash", str(out / rel)], STUB_NODE=launchfiles.safe_name(spec.nodes[-1].name))
        elif rel == "slurm-task.sh":
            continue  # run through submit.sbatch's srun, as on a real cluster
        else:
            done = box.run(["sh", str(out / rel)])
        assert done.returncode == 0, (rel, done.stderr)
        assert box.escaped() == [], f"{rel} executed a payload"
        seen[rel] = box.records("python") + box.records("mpirun")
    return seen


def _init_hostile(tmp_path: Path, values: list[str], nodes: str = "a=10.77.0.1,b=fe80::2%eth0,node-3.example.org"):
    box = Sandbox(tmp_path, python_dir="py $(touch pwned) 'dir\"")
    out = tmp_path / "out $(touch pwned) ';x"
    plugin = "/opt/$(touch pwned) `touch pwned`/libnccl-net.so"
    env = [a for i, v in enumerate(values) for a in ("--env", f"HWTUI_PAYLOAD_{i}={v}")]
    rc = main(["cluster", "init", "--nodes", nodes, "--interface", "eth0", "--net-plugin", plugin, "--launcher", "slurm",
               "--python", str(box.python), *env, "-o", str(out)])
    assert rc == 0
    return box, out, specmod.load(out / "cluster.json"), plugin


def test_every_generated_file_runs_without_executing_user_values(tmp_path):
    box, out, spec, plugin = _init_hostile(tmp_path, PAYLOADS)
    seen = _run_every_file(box, out, spec)
    assert set(seen) == {*(f"env/{launchfiles.safe_name(n.name)}.env" for n in spec.nodes),
                         *(f"launch-{launchfiles.safe_name(n.name)}.sh" for n in spec.nodes),
                         "launch-mpirun.sh", "submit.sbatch"}
    for rel, records in seen.items():
        assert records, f"{rel} never reached the interpreter or mpirun"
        for argv, env in records:
            # Values arrive byte for byte: the payload is data, the paths are the paths.
            assert [env[f"HWTUI_PAYLOAD_{i}"] for i in range(len(PAYLOADS))] == PAYLOADS, rel
            assert env["NCCL_NET_PLUGIN"] == plugin
            assert env["LD_LIBRARY_PATH"].split(":")[0] == os.path.dirname(plugin)
            if "--spec" in argv:
                assert argv[argv.index("--spec") + 1] == str((out / "cluster.json").resolve())
    # Each script checks the interpreter and runs the preflight before it launches anything.
    for rel in ("launch-a.sh", "launch-mpirun.sh", "submit.sbatch"):
        argvs = [argv for argv, _ in seen[rel]]
        assert argvs[0] == ["-c", "import hwtui"], rel
        assert argvs[1][:5] == ["-m", "hwtui.app", "cluster", "preflight", "--spec"], rel
    assert seen["launch-a.sh"][1][0][-1] == "--hosts-store" and seen["launch-b.sh"][1][0][-1] != "--hosts-store"
    mpi_argv = seen["launch-mpirun.sh"][-1][0]
    assert mpi_argv[mpi_argv.index("-m") - 1] == str(box.python)
    task_argv, task_env = seen["submit.sbatch"][-1]
    assert task_argv[:4] == ["-m", "hwtui.app", "cluster", "test"] and task_env["HWTUI_CLUSTER_NODE"] == "node-3.example.org"


HOSTILE_HOSTS = ["fe80::1%x\ntouch pwned", "fe80::1%x$(touch pwned)", "fe80::1%x;touch", "a;touch pwned", "$(id)",
                 "a b", "a\n", "\na", "a\r", "-rf", "a..b", ".a", "a.", "10.0.0.1\n", "10.0.0.1%eth0", "1.2.3.4.5",
                 "fe80::1%", "fe80::1%" + "x" * 16, "fe80::1%eth0%eth1", "::g", "a" * 64, "é.example", "[::1]",
                 "10.0.0.1:22", "host_name", "x`id`", "'a'", "a\x00b"]


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_hostile_host_names_and_addresses_are_refused_in_one_line(tmp_path, capsys, host):
    out = tmp_path / "cl"
    for nodes in (f"a={host}", host):
        assert main(["cluster", "init", f"--nodes={nodes}", "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hwtui: error: ") and err.count("\n") == 1, err
    assert main(["cluster", "init", "--nodes", "a", f"--master-addr={host}", "-o", str(out)]) == 2
    assert not out.exists() and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("host", ["fe80::1%eth0", "fe80::1%enp0s31f6", "fe80::1%3", "::ffff:10.0.0.1", "2001:db8::7",
                                  "10.0.0.1", "node-1", "n1.cluster.example.org", "A1"])
def test_the_grammar_accepts_real_names(host):
    assert valid_host(host)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.text(alphabet="0123456789abcdef:.%$();`\n -_",
                                                                            max_size=40))
def test_anything_accepted_as_a_host_needs_no_quoting(text):
    """The strongest form of the grammar's promise: an accepted value is inert in any shell context."""
    if valid_host(text):
        assert shlex.quote(text) == text and text.isascii()
        assert not set(text) & set(string.whitespace + "$`;&|<>()'\"\\*?[]{}!#~")


_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_NAMES = st.lists(_LABEL, min_size=1, max_size=3).map(".".join).filter(lambda n: not n.replace(".", "").isdigit())
_SCOPED_V6 = st.tuples(st.ip_addresses(v=6).map(str),
                       st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,14}", fullmatch=True)).map("%".join)
_ADDRS = st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(str) | _SCOPED_V6


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(names=st.lists(_NAMES, min_size=1, max_size=3, unique=True), addrs=st.lists(_ADDRS, min_size=3, max_size=3,
                                                                                     unique=True),
       value=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=30))
def test_every_file_from_any_grammatical_cluster_runs_inert(tmp_path_factory, names, addrs, value):
    tmp = tmp_path_factory.mktemp("hyp")
    nodes = ",".join(f"{n}={a}" for n, a in zip(names, addrs, strict=False))
    box, out, spec, _ = _init_hostile(tmp, [value], nodes=nodes)
    for records in _run_every_file(box, out, spec).values():
        assert all(env["HWTUI_PAYLOAD_0"] == value for _, env in records)


# -- the description loader ---------------------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                     max_leaves=20)
_FIELDS = st.sampled_from(sorted(ClusterSpec.__dataclass_fields__))


@settings(max_examples=80, deadline=None)
@given(body=st.dictionaries(_FIELDS, _JSON, max_size=6),
       nodes=st.lists(st.dictionaries(st.sampled_from(["name", "address", "interface", "x"]), _JSON, max_size=3)
                      | _JSON, max_size=3) | _JSON)
def test_loader_never_raises_anything_but_a_spec_error(body, nodes):
    raw = {"schema": specmod.SCHEMA, **body, "nodes": nodes}
    try:
        spec = ClusterSpec.from_dict(raw)
    except SpecError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600
    else:
        assert all(valid_host(n.name) and valid_host(n.addr) for n in spec.nodes)


@pytest.mark.parametrize("content", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"schema": "hwtui.cluster/1", "nodes": ["a"], "join_timeout": 1e999}',
    b'{"schema": "hwtui.cluster/1", "nodes": ["a"], "devices_per_node": true}',
    b'{"schema": "hwtui.cluster/1", "nodes": ["a"], "master_port": ' + b"9" * 5000 + b"}",
    b'{"schema": "hwtui.cluster/1", "nodes": [{"name": ["a"]}]}',
    b'{"schema": "hwtui.cluster/1", "nodes": ["a"], "extra_env": ["X"]}',
    b'{"schema": "hwtui.cluster/1", "nodes": ["a"], "python": 3}',
    b"\xff\xfe{}",
    b" " * (specmod.MAX_SPEC_BYTES + 1),
], ids=["deep", "inf", "bool", "5000-digits", "list-name", "env-list", "python-int", "not-utf8", "over-1MiB"])
def test_hostile_description_files_are_exit_2_in_one_line(tmp_path, capsys, content):
    path = tmp_path / "cluster.json"
    path.write_bytes(content)
    assert main(["cluster", "test", "--spec", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwtui: error: ") and err.count("\n") == 1 and len(err) < 600, err


def test_a_fifo_as_description_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "cluster.json"
    os.mkfifo(fifo)
    assert main(["cluster", "test", "--spec", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_node_objects_with_a_wrong_shape_name_the_node():
    with pytest.raises(SpecError, match="must be an object with name"):
        ClusterSpec.from_dict({"schema": specmod.SCHEMA, "nodes": [{"address": "10.0.0.1"}]})
    assert ClusterSpec.from_dict({"schema": specmod.SCHEMA, "nodes": [Node("a", "10.0.0.1").__dict__]}).nodes[0].addr == "10.0.0.1"


# -- --env values are secrets ---------------------------------------------------------------------

def test_env_values_are_owner_only_and_never_printed(tmp_path, capsys):
    token = "hf_" + "Zq9" * 12
    other = "s3cr3t/with@odd:chars"
    out = tmp_path / "cl"
    for extra in ([], ["--json"]):
        assert main(["cluster", "init", "--nodes", "a,b", "--env", f"HF_TOKEN={token}", "--env", f"MY_VAR={other}",
                     "-o", str(out), "--force", *extra]) == 0
        printed = capsys.readouterr()
        assert token not in printed.out + printed.err and other not in printed.out + printed.err
    assert json.loads(printed.out)["spec"]["extra_env"] == {"HF_TOKEN": "***REDACTED***", "MY_VAR": "***REDACTED***"}
    holders = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and token in p.read_text())
    assert holders == ["cluster.json", "env/a.env", "env/b.env"]
    for rel in holders:
        assert (out / rel).stat().st_mode & 0o777 == 0o600, rel
        assert other in (out / rel).read_text()


def test_a_malformed_env_argument_does_not_echo_its_value(tmp_path, capsys):
    assert main(["cluster", "init", "--nodes", "a", "--env", "=hunter2-value", "-o", str(tmp_path / "x")]) == 2
    assert main(["cluster", "init", "--nodes", "a", "--env", "1BAD=hunter2-value", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and err.count("\n") == 2
