"""The variable grammars: examples that pin the semantics, and any-string properties for each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtui.probes.distributed import parsers as P

# Strings biased toward the grammars' own characters, plus anything at all.
GRAMMAR_CHARS = st.text(alphabet=st.sampled_from(list("^=,:.-_/ \t0123456789abcdefxGPUMIG[]()@#\n\\") + ["é", "\x00"]),
                        max_size=40)
ANY = st.one_of(st.text(max_size=60), GRAMMAR_CHARS)

PARSERS = {
    "parse_int": lambda s: P.parse_int(s, "X", 0, 10),
    "parse_port": P.parse_port,
    "parse_switch": lambda s: P.parse_switch(s, "NCCL_IB_DISABLE"),
    "parse_positive_mb": lambda s: P.parse_positive_mb(s, "X"),
    "parse_positive_number": lambda s: P.parse_positive_number(s, "X"),
    "parse_host": P.parse_host,
    "parse_nccl_list": lambda s: P.parse_nccl_list(s, "NCCL_IB_HCA"),
    "parse_nccl_list_noports": lambda s: P.parse_nccl_list(s, "GLOO_SOCKET_IFNAME", with_ports=False),
    "parse_nccl_debug": P.parse_nccl_debug,
    "parse_nccl_debug_subsys": P.parse_nccl_debug_subsys,
    "parse_choice": lambda s: P.parse_choice(s, "PJRT_DEVICE", ("TPU", "CPU")),
    "parse_visible_devices": lambda s: P.parse_visible_devices(s, "CUDA_VISIBLE_DEVICES"),
    "parse_ze_affinity_mask": P.parse_ze_affinity_mask,
    "parse_module_list": P.parse_module_list,
    "parse_ucx_devices": P.parse_ucx_devices,
    "parse_nccl_conf": P.parse_nccl_conf,
    "parse_ld_so_conf": P.parse_ld_so_conf,
    "parse_mounts": P.parse_mounts,
    "parse_key_values": P.parse_key_values,
    "parse_chrony_tracking": P.parse_chrony_tracking,
}


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=120, deadline=None)
@given(text=ANY)
def test_every_parser_takes_any_string(name, text):
    result = PARSERS[name](text)
    # Results that carry problems must carry them as strings, and a value-less result must say why.
    problems = getattr(result, "problems", ())
    assert all(isinstance(p, str) and p for p in problems)
    for attr in ("value", "host", "entries"):
        if hasattr(result, attr) and getattr(result, attr) in (None,) and not isinstance(result, P.Choice):
            assert problems, f"{name}({text!r}) gave no {attr} and no problem"


def test_parse_int_ranges_and_garbage():
    assert P.parse_int("3", "RANK", 0, 7).ok
    assert P.parse_int("8", "RANK", 0, 7).problems == ("RANK=8 is above 7",)
    assert P.parse_int("-1", "RANK", 0).problems == ("RANK=-1 is below 0",)
    assert P.parse_int("1.5", "RANK").value is None
    assert P.parse_int("١", "RANK").value is None  # int() would accept an Arabic-Indic digit; shells do not
    assert P.parse_int(" 2", "RANK").value == 2 and not P.parse_int(" 2", "RANK").ok


@pytest.mark.parametrize(("raw", "kind", "host", "suggestion"), [
    ("10.0.0.1", "ipv4", "10.0.0.1", None),
    ("[fd00::1]", "ipv6", "fd00::1", None),
    ("node-01.cluster", "name", "node-01.cluster", None),
    ("tcp://10.0.0.1:29500", "invalid", None, "10.0.0.1"),
    ("node1:29500", "invalid", None, "node1"),
    ("two words", "invalid", None, None),
    ("", "invalid", None, None),
])
def test_parse_host(raw, kind, host, suggestion):
    v = P.parse_host(raw)
    assert (v.kind, v.host, v.suggestion) == (kind, host, suggestion)
    assert bool(v.problems) == (kind == "invalid")


def test_nccl_list_semantics():
    prefix = P.parse_nccl_list("mlx5_1", "NCCL_IB_HCA")
    assert prefix.matches("mlx5_1") and prefix.matches("mlx5_10") and not prefix.matches("mlx5_2")
    exact = P.parse_nccl_list("=mlx5_1:1", "NCCL_IB_HCA")
    assert exact.matches("mlx5_1", 1) and not exact.matches("mlx5_1", 2) and not exact.matches("mlx5_10", 1)
    excl = P.parse_nccl_list("^docker,lo", "NCCL_SOCKET_IFNAME")
    assert excl.matches("eth0") and not excl.matches("docker0") and not excl.matches("lo")
    assert P.parse_nccl_list("eth0,^lo", "X").problems  # '^' mid-list is literal in NCCL
    assert P.parse_nccl_list("mlx5_0:x", "X").problems
    assert P.parse_nccl_list(",", "X").problems


def test_visible_devices_stop_at_first_bad_entry():
    v = P.parse_visible_devices("0,1,x,2", "CUDA_VISIBLE_DEVICES")
    assert [e.index for e in v.entries] == [0, 1] and v.ignored == "x,2" and v.problems
    assert P.parse_visible_devices("-1", "CUDA_VISIBLE_DEVICES").hides_all
    assert not P.parse_visible_devices("-1", "CUDA_VISIBLE_DEVICES").problems
    uuid = P.parse_visible_devices("GPU-8f6b0c1e-aaaa-bbbb-cccc-0123456789ab", "CUDA_VISIBLE_DEVICES")
    assert uuid.entries[0].uuid.startswith("GPU-")
    assert P.parse_visible_devices("1,1", "CUDA_VISIBLE_DEVICES").problems
    ze = P.parse_ze_affinity_mask("0.1,1")
    assert [(e.index, e.sub) for e in ze.entries] == [(0, 1), (1, None)]


def test_debug_and_subsys():
    assert P.parse_nccl_debug("info").value == "INFO"
    assert P.parse_nccl_debug("verbose").value is None
    sub = P.parse_nccl_debug_subsys("^INIT,NETT")
    assert sub.exclude and sub.names == ("INIT",) and sub.unknown == ("NETT",)


def test_files():
    conf = P.parse_nccl_conf("# comment\nNCCL_IB_HCA = mlx5_0\nbroken line\nNCCL_DEBUG=WARN\n", "/etc/nccl.conf")
    assert conf.settings == {"NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "WARN"}
    assert conf.problems == ("/etc/nccl.conf:3: 'broken line' is not NAME=VALUE",)
    dirs, inc = P.parse_ld_so_conf("include /etc/ld.so.conf.d/*.conf\n/opt/lib # x\n")
    assert dirs == ["/opt/lib"] and inc == ["/etc/ld.so.conf.d/*.conf"]
    m = P.parse_mounts("srv:/ck /mnt/check\\040points nfs4 rw,relatime 0 0\n")
    assert m[0].mountpoint == "/mnt/check points" and m[0].fstype == "nfs4"
    assert P.parse_positive_number("0.5", "X").value == 0.5
    assert P.parse_positive_number("0", "X").value is None
    assert P.parse_positive_number("nan", "X").value is None
    assert P.parse_ucx_devices("mlx5_0:1,eth0").entries == (P.ListEntry("mlx5_0", 1), P.ListEntry("eth0"))
