"""Hostile and careless input to the probes and the check/snapshot CLI (issue 12, items 5 and 6).

Every file the probes read is bounded and non-blocking (a recorded tree whose proc/cpuinfo is
/dev/zero reached 6 GB RSS; a 1 GB file OOMed ``snapshot``; a FIFO blocked forever), and every bad
input ends as one line on stderr with exit 2 (never 3, never a traceback). The hypothesis
properties say, for each loader and grammar: it returns or raises its one clean error, nothing else,
and it finishes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.core.bounded_read import HOST_FILE_CAP, RECORD_CAP, NotRegularFile, read_bounded
from hwtui.probes.distributed import parsers
from hwtui.probes.gpu_ids import GpuIdError, parse_cuda_ids, parse_gpu_ids
from hwtui.probes.host import SNAPSHOT_SCHEMA, FsHost, ReplayHost, validate_snapshot
from hwtui.probes.inventory import detect_devices
from tests import cli_proc, machines

# -- bounded, non-blocking reads ---------------------------------------------------------------------------


def _link_to_dev_zero(tree, path: str) -> None:
    os.unlink(tree.path(path))
    os.symlink("/dev/zero", tree.path(path))


@pytest.fixture
def tree(tmp_path):
    return machines.h100_x8(tmp_path / "tree")


@pytest.mark.timeout(30)  # a hang guard: opening a FIFO for reading blocks until a writer comes
def test_fifo_and_devices_in_a_sysroot_are_refused_without_blocking(tree):
    os.mkfifo(tree.path("/proc/meminfo.fifo"))
    os.replace(tree.path("/proc/meminfo.fifo"), tree.path("/proc/meminfo"))
    _link_to_dev_zero(tree, "/proc/cpuinfo")
    host = tree.host()
    assert host.read_text("/proc/meminfo") is None
    assert host.read_text("/proc/cpuinfo") is None
    assert host.read_text("/proc") is None  # a directory
    assert host.read_text("/etc/os-release")  # a regular file still reads
    with pytest.raises(NotRegularFile, match="FIFO"):
        read_bounded(tree.path("/proc/meminfo"), 10)


def test_a_huge_file_is_read_up_to_the_cap(tree):
    with open(tree.path("/etc/os-release"), "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB on paper, nothing on disk
    text = FsHost(tree.root, {}).read_text("/etc/os-release")
    assert text is not None and len(text) == HOST_FILE_CAP
    assert text.startswith('PRETTY_NAME="Test Linux 12"')


def test_read_bounded_reports_what_was_cut(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert read_bounded(p, 100) == (b"x" * 100, False)
    assert read_bounded(p, 99) == (b"x" * 99, True)


# -- snapshot / replay loader -------------------------------------------------------------------------------

def _snap(**tables):
    return {"schema": SNAPSHOT_SCHEMA, **tables}


WRONG_TYPED = [
    [1, 2],
    "text",
    _snap(files=[1]),
    _snap(files={"/etc/os-release": 3}),
    _snap(dirs={"/sys": "abc"}),
    _snap(dirs={"/sys": [1]}),
    _snap(exists={"/x": "yes"}),
    _snap(links={"/x": ["a"]}),
    _snap(stat={"/x": [1, 2]}),
    _snap(stat={"/x": [float("inf"), 0, 0]}),
    _snap(stat={"/x": [2**70, 0, 0]}),
    _snap(stat={"/x": [True, 0, 0]}),
    _snap(env={"PATH": 1}),
    _snap(env=[]),
    _snap(facts=[]),
    _snap(source="me"),
    {"schema": ["hwtui.snapshot/1"]},
]


@pytest.mark.parametrize("raw", WRONG_TYPED, ids=range(len(WRONG_TYPED)))
def test_wrong_typed_snapshot_fields_are_one_clean_error(raw):
    with pytest.raises(ValueError) as exc:
        ReplayHost(raw)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 300


def test_loader_refuses_deep_huge_fifo_and_invalid_utf8(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(RECORD_CAP + 1)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    bad_utf8 = tmp_path / "bad.json"
    bad_utf8.write_bytes(b'{"schema": "\xff"}')
    for path, words in ((deep, "nested too deeply"), (huge, "larger than 64 MiB"), (fifo, "FIFO"),
                        (bad_utf8, "not valid JSON"), (tmp_path / "missing.json", "cannot read")):
        with pytest.raises(ValueError, match=words):
            ReplayHost.load(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
tables = st.sampled_from(["env", "files", "dirs", "exists", "links", "stat", "facts", "source"])


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(tables, json_values, max_size=6), st.lists(st.text(max_size=12), max_size=5))
def test_any_snapshot_json_loads_cleanly_or_is_refused_cleanly(body, paths):
    """Never raises anything but ValueError; once loaded, no host method raises on any path."""
    raw = {"schema": SNAPSHOT_SCHEMA, **body}
    try:
        host = ReplayHost(json.loads(json.dumps(raw)))
    except ValueError:
        return
    for path in [*paths, *(k for t in ("files", "dirs", "stat") for k in raw.get(t, {}))]:
        host.read_text(path)
        host.listdir(path)
        host.exists(path)
        host.readlink(path)
        host.stat(path)
        host.read_int(path)
        host.is_dir(path)


@settings(max_examples=50, deadline=None)
@given(json_values)
def test_validate_snapshot_rejects_anything_without_the_schema(value):
    with pytest.raises(ValueError):
        validate_snapshot(value)


# -- the environment grammars in probes/distributed/parsers.py ----------------------------------------------------

GRAMMARS = {
    "int": lambda s: parsers.parse_int(s, "X", 0, 10),
    "port": parsers.parse_port,
    "number": lambda s: parsers.parse_positive_number(s, "X"),
    "host": parsers.parse_host,
    "nccl_list": lambda s: parsers.parse_nccl_list(s, "NCCL_SOCKET_IFNAME"),
    "hca_list": lambda s: parsers.parse_nccl_list(s, "NCCL_IB_HCA", with_ports=False),
    "debug": parsers.parse_nccl_debug,
    "subsys": parsers.parse_nccl_debug_subsys,
    "visible": lambda s: parsers.parse_visible_devices(s, "CUDA_VISIBLE_DEVICES"),
    "ze": parsers.parse_ze_affinity_mask,
    "modules": parsers.parse_module_list,
    "ucx": parsers.parse_ucx_devices,
}
FILE_GRAMMARS = [parsers.parse_nccl_conf, parsers.parse_ld_so_conf, parsers.parse_mounts, parsers.parse_key_values,
                 parsers.parse_chrony_tracking]

env_text = st.text(alphabet=st.sampled_from([*"0123456789abcxyzGPUMIG-_:=^.,[]/@ \t\n", "²", "٣", "\x00", "\udcff"]),
                   max_size=40) | st.text(max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(GRAMMARS)), env_text)
def test_env_grammars_never_raise(name, raw):
    result = GRAMMARS[name](raw)
    problems = result.problems
    assert isinstance(problems, tuple) and len(problems) <= parsers.MAX_PROBLEMS + 1
    assert all(isinstance(p, str) and len(p) < 400 for p in problems)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(range(len(FILE_GRAMMARS))), st.text(max_size=200))
def test_file_grammars_never_raise(index, text):
    FILE_GRAMMARS[index](text)


# Shapes that each made some scan restart at every character; 100 KB where the work is regex
# scanning, 20 KB where each entry costs a Python step (lists of entries).
HUGE = ["9" * 5000, "a" * 100_000, "1," * 10_000, "a:" * 10_000, "x" * 50_000 + ":" + "1" * 50_000, "0." * 10_000,
        "1.1," * 5_000, "GPU-" + "a-" * 50_000, "http://" + "a" * 100_000, "[" + "a" * 100_000, "\\000" * 25_000]


@pytest.mark.timeout(60)  # a hang guard, not a timing: a quadratic scan of these takes minutes
@pytest.mark.parametrize("raw", HUGE, ids=lambda s: f"{s[:6]!r}x{len(s)}")
def test_env_grammars_stay_linear_and_bounded_on_huge_values(raw):
    for name, grammar in GRAMMARS.items():
        result = grammar(raw)
        assert len(result.problems) <= parsers.MAX_PROBLEMS + 1, name
    for grammar in FILE_GRAMMARS:
        grammar(raw)


def test_5000_digit_port_is_out_of_range_not_a_crash():
    port = parsers.parse_port("9" * 5000)
    assert port.value is None and "digits" in port.problems[0] and len(port.problems[0]) < 200


# -- --gpu-ids ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    fs = machines.rtx4090_rx7800xt_arc_a750(tmp_path_factory.mktemp("mixed"))
    return detect_devices(fs.host())[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*"0123456789,: cpudahixr", "²", "٣", "cuda:", "hip:", "cpu"]), max_size=12).map("".join)
       | st.text(max_size=30))
def test_gpu_ids_resolve_or_fail_cleanly(devices, spec):
    for parse in (parse_gpu_ids, parse_cuda_ids):
        try:
            refs = parse(spec, devices)
        except GpuIdError as exc:
            assert "\n" not in str(exc).split("; available")[0]
            continue
        assert refs and len({r.spec for r in refs}) == len(refs)


@pytest.mark.parametrize("spec", ["", " ", "²", "cuda:²", "٣", "9" * 5000, "cuda:" + "9" * 5000, ",", "0,,1"])
def test_gpu_ids_edge_cases_are_errors(devices, spec):
    with pytest.raises(GpuIdError):
        parse_gpu_ids(spec, devices)


# -- the CLI end to end: exit 2 and one line, or a normal result, never exit 3 -------------------------------

def _hwtui(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "MASTER_", "WORLD_", "RANK", "LOCAL_"))}
    env.update(env_extra or {})
    return cli_proc.run([sys.executable, "-m", "hwtui.app", *args], capture_output=True, text=True, env=env,
                        timeout=120, errors="replace")


def _one_line_exit_2(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwtui"), r.stderr
    return lines[0]


def test_cli_bad_replay_files_are_exit_2(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(_snap(files={"/proc/cpuinfo": ["not", "text"]})))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, words in ((deep, "nested too deeply"), (wrong, "files['/proc/cpuinfo']"), (fifo, "FIFO")):
        assert words in _one_line_exit_2(_hwtui("--check", "--replay", str(path)))


def test_cli_only_takes_the_areas_help_lists(tree):
    from hwtui.app.cli import CHECK_AREAS, build_parser
    from hwtui.probes.catalog import areas

    assert set(CHECK_AREAS) == set(areas())
    help_text = " ".join(build_parser().format_help().split())
    assert f"from: {', '.join(CHECK_AREAS)}" in help_text
    line = _one_line_exit_2(_hwtui("--check", "--only", "env,nccl", "--sysroot", str(tree.root)))
    assert "nccl" in line and "env, gpu, hardware" in line


def test_cli_survives_hostile_environment_and_sysroot(tree, tmp_path):
    """Invalid UTF-8 with --junit, a 5,000-digit MASTER_PORT, /dev/zero as cpuinfo, a FIFO, a 1 GiB file."""
    _link_to_dev_zero(tree, "/proc/cpuinfo")
    os.unlink(tree.path("/proc/meminfo"))
    os.mkfifo(tree.path("/proc/meminfo"))
    with open(tree.path("/etc/os-release"), "r+b") as fh:
        fh.truncate(1 << 30)
    junit = tmp_path / "j.xml"
    env = {"MASTER_PORT": "9" * 5000, "MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "2", "RANK": "0",
           "NCCL_DEBUG": os.fsdecode(b"\xff\xfeINFO"), "NCCL_SOCKET_IFNAME": os.fsdecode(b"eth\x01\xff")}
    r = _hwtui("--check", "--sysroot", str(tree.root), "--junit", str(junit), env_extra=env)
    assert r.returncode == 1, r.stderr  # MASTER_PORT is a failed check, not a crash
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert "MASTER_PORT" in r.stdout
    ET.parse(junit)  # well-formed despite the control and invalid bytes
    snap = tmp_path / "snap.json"
    s = _hwtui("snapshot", "-o", str(snap), "--sysroot", str(tree.root), env_extra=env)
    assert s.returncode == 0, s.stderr
    assert snap.stat().st_size < 3 * HOST_FILE_CAP * 6  # the 1 GiB file is recorded only up to its cap
    replay = _hwtui("--check", "--replay", str(snap), "--json")
    assert replay.returncode in (0, 1), replay.stderr


def test_cli_gpu_ids_bad_input_is_exit_2(tree):
    for spec in ("²", ""):
        line = _one_line_exit_2(_hwtui("train", "--gpu-ids", spec, "--sysroot", str(tree.root)))
        assert "--gpu-ids" in line


def test_the_caps_are_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trust.md").read_text()
    for words in ("4 MiB", "64 MiB", "FIFO"):
        assert words in doc


def test_env_exports_file_executes_nothing_when_sourced(tmp_path):
    """`hwtui env --write` makes a file to `source`: values from the environment, a replayed
    snapshot or a sysroot path must never leave their quotes or comments."""
    tree = machines.h100_x8(tmp_path / "tree\ntouch pwned-by-path")
    out = tmp_path / "exports.sh"
    hostile = {"NCCL_NET_PLUGIN": "x\ntouch pwned-by-plugin\n", "MASTER_ADDR": "head;touch pwned-by-addr",
               "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "0", "NCCL_DEBUG": "INFO$(touch pwned-by-debug)",
               "NCCL_SOCKET_IFNAME": "eth0`touch pwned-by-ifname`"}
    r = _hwtui("env", "--sysroot", str(tree.root), "--write", str(out), env_extra=hostile)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "pwned-by-plugin" in text  # the value is shown, inside a comment
    work = tmp_path / "work"
    work.mkdir()
    s = subprocess.run(["bash", "-c", f"source {out}"], cwd=work, capture_output=True, text=True, timeout=30)
    assert s.returncode == 0, s.stderr
    assert list(work.iterdir()) == [] and not list(tmp_path.glob("pwned*"))


def test_bounded_reads_keep_text_mode_semantics(tree):
    """Same text as open(..., encoding='utf-8', errors='replace').read(): CRLF, CR, invalid bytes."""
    raw = b"a\r\nb\rc\n\xff\xfe d\xc3\xa9"
    tree.path("/etc/os-release").write_bytes(raw)
    with open(tree.path("/etc/os-release"), encoding="utf-8", errors="replace") as fh:
        assert tree.host().read_text("/etc/os-release") == fh.read()


def test_terminal_escapes_from_a_hostile_tree_are_shown_not_sent(tmp_path):
    """A device name from a sysroot's pci.ids (or a replayed snapshot) reaches the table and the
    check report; an ESC sequence in it must print as text, not retitle or clear the terminal."""
    fs = machines.FakeSys(tmp_path / "t")
    machines._base(fs)
    machines.nvidia_gpu(fs, "0000:01:00.0", 0x1234, 0)
    fs.file("/usr/share/misc/pci.ids", "10de  NVIDIA Corporation\n\t1234  Evil\x1b]0;pwned\x07\x1b[2J GPU\n")
    table = _hwtui("list-gpus", "--sysroot", str(fs.root), env_extra={"NO_COLOR": "1"})
    report = _hwtui("--check", "--only", "hardware", "--sysroot", str(fs.root), env_extra={"NO_COLOR": "1"})
    assert table.returncode == 0, table.stderr
    assert "Evil" in table.stdout and "\\x1b]0;pwned" in table.stdout
    for out in (table.stdout, report.stdout):
        assert "\x1b" not in out and "\x07" not in out
