"""The NCCL net plugin really loads (a compiled .so in a child), and NCCL_MESH_* are checked."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from hwtui.core.finding import Status
from hwtui.probes.catalog import catalog
from hwtui.probes.distributed.nccl_plugin import mesh_findings, plugin_load_findings
from hwtui.probes.framework import run_checks
from hwtui.probes.host import FsHost

PLUGIN_C = r"""
typedef struct { const char* name; void* init; void* devices; } ncclNet_t;
ncclNet_t ncclNetPlugin_v9 = { "Mesh", 0, 0 };
ncclNet_t ncclNetPlugin_v8 = { "Mesh", 0, 0 };
"""
NOT_A_PLUGIN_C = "int something_else(void) { return 42; }\n"

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build a test plugin")


def build_so(tmp_path, name, source):
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"lib{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, timeout=60)
    return out


def live_check(plugin_path, **env):
    collectors, rules = catalog()
    host = FsHost("/", {"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent", "NCCL_NET_PLUGIN": str(plugin_path), **env})
    result = run_checks(host, [c for c in collectors if c.name in ("nccl_plugin",)],
                        [r for r in rules if r.name in ("nccl_plugin", "nccl_mesh")])
    return {f.id: f for f in result.findings}


@needs_gcc
def test_compiled_plugin_loads_and_names_itself(tmp_path):
    so = build_so(tmp_path, "nccl-net-mesh", PLUGIN_C)
    got = live_check(so, NCCL_MESH_DEBUG="1")
    f = got["nccl.net_plugin.load"]
    assert f.status == Status.PASS and f.data == {"name": "Mesh", "version": 9, "versions": [8, 9]}
    assert "Loaded net plugin Mesh (v9)" in f.detail
    assert got["nccl.mesh[NCCL_MESH_DEBUG]"].status == Status.PASS and "nccl.mesh.plugin" not in got


@needs_gcc
def test_elf_without_the_plugin_symbol_fails(tmp_path):
    so = build_so(tmp_path, "nccl-net-other", NOT_A_PLUGIN_C)
    f = live_check(so)["nccl.net_plugin.load"]
    assert f.status == Status.FAIL and "not an NCCL net plugin" in f.title


def test_random_bytes_so_fails(tmp_path):
    so = tmp_path / "libnccl-net.so"
    so.write_bytes(os.urandom(4096))
    f = live_check(so)["nccl.net_plugin.load"]
    assert f.status == Status.FAIL and "does not load" in f.title and f"ldd {so}" in f.remedy


def test_unrecorded_load_skips_and_crash_is_a_failure():
    assert next(plugin_load_findings({"path": "/p.so", "load": None})).status == Status.SKIP
    f = next(plugin_load_findings({"path": "/p.so", "load": {"loaded": False, "child": "crash", "error": "SIGSEGV"}}))
    assert f.status == Status.FAIL and "crashed" in f.title


# -- NCCL_MESH_* ----------------------------------------------------------------------------------

MESH = {"path": "/opt/mesh/libnccl-net.so", "load": {"loaded": True, "net": {"9": "Mesh"}}}


def by_id(findings):
    return {f.id: f for f in findings}


def test_mesh_variables_without_the_mesh_plugin_and_typos():
    got = by_id(mesh_findings({"NCCL_MESH_DEBUG": "5", "NCCL_MESH_GID_IDX": "3"}, {"path": None}))
    assert got["nccl.mesh.plugin"].status == Status.WARN and "NCCL_NET_PLUGIN" in got["nccl.mesh.plugin"].remedy
    assert got["nccl.mesh[NCCL_MESH_GID_IDX]"].status == Status.WARN
    assert got["nccl.mesh[NCCL_MESH_DEBUG]"].status == Status.WARN
    other = {"path": "/x.so", "load": {"loaded": True, "net": {"8": "AWS Libfabric"}}}
    assert by_id(mesh_findings({"NCCL_MESH_DEBUG": "1"}, other))["nccl.mesh.plugin"].status == Status.WARN
    assert list(mesh_findings({}, MESH)) == []
