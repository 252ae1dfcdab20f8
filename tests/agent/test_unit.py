"""`hwtui agent --install-unit`: a hardened unit with an absolute ExecStart, never root."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hwtui.app.cli import main
from hwtui.app.node_api import unit

ROOT = Path(__file__).resolve().parents[2]


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.fixture
def opt_python(monkeypatch) -> str:
    """An interpreter where operators install services (this box's venv links into /root/.pyenv,
    which the unit hides: the test below shows that refusal)."""
    monkeypatch.setattr(sys, "executable", "/opt/hwtui/bin/python")
    return sys.executable


def _install(tmp_path: Path, *extra: str) -> str:
    path = tmp_path / "hwtui-agent.service"
    assert main(["agent", "--install-unit", str(path), *extra]) == 0
    assert path.stat().st_mode & 0o777 == 0o644
    return path.read_text()


def test_the_units_agent_reads_weights_as_this_command_was_told(tmp_path, opt_python):
    """--readers and --direct-io went unsaid into the unit: its agent read with the defaults."""
    [exec_start] = _directives(_install(tmp_path, "--readers", "8", "--direct-io", "on"))["ExecStart"]
    assert exec_start.split()[-4:] == ["--readers", "8", "--direct-io", "on"]
    assert main(["agent", "--install-unit", str(tmp_path / "bad.service"), "--readers", "0"]) == 2  # bounds first
    assert not (tmp_path / "bad.service").exists()


def test_unit_runs_this_interpreter_by_absolute_path_as_a_dynamic_user(tmp_path, capsys, opt_python):
    text = _install(tmp_path, "--listen", "0.0.0.0:9477", "--advertise", "127.0.0.1", "--node", "gpu-7")
    d = _directives(text)
    [exec_start] = d["ExecStart"]
    assert exec_start.split()[0] == opt_python
    assert "/usr/bin/env" not in text
    assert exec_start.split()[1:] == ["-m", "hwtui", "agent", "--listen", "0.0.0.0:9477", "--token-file",
                                      "/var/lib/hwtui-agent/agent.token", "--out", "/var/lib/hwtui-agent/served",
                                      "--node", "gpu-7", "--advertise", "127.0.0.1"]
    assert d["DynamicUser"] == ["yes"] and "User" not in d
    assert d["StateDirectory"] == ["hwtui-agent"] and d["StateDirectoryMode"] == ["0700"]
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("CapabilityBoundingSet", ""), ("RestrictSUIDSGID", "yes"),
                       ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK")):
        assert d[key] == [value], key
    assert d["SystemCallFilter"][0] == "@system-service"
    # The GPUs stay reachable: no device sandbox, and nothing that implies a device allow-list.
    assert not {"PrivateDevices", "DeviceAllow", "ProtectClock"} & set(d)
    assert "systemctl daemon-reload && systemctl enable --now hwtui-agent.service" in capsys.readouterr().out


def test_tls_key_reaches_the_dynamic_user_as_a_credential(tmp_path, opt_python):
    d = _directives(_install(tmp_path, "--cert", "/etc/hwtui/a%b.pem", "--key", "/etc/hwtui/key.pem"))
    assert d["LoadCredential"] == ["agent.crt:/etc/hwtui/a%%b.pem", "agent.key:/etc/hwtui/key.pem"]
    assert d["ExecStart"][0].endswith("--cert %d/agent.crt --key %d/agent.key")


def test_arguments_are_quoted_for_systemd():
    assert unit.quote("0.0.0.0:9477") == "0.0.0.0:9477"
    assert unit.quote("a b$HOME%h\"\\") == '"a b$$HOME%%h\\"\\\\"'
    with pytest.raises(unit.UnitError, match="control character"):
        unit.quote("x\nExecStartPre=/bin/sh")


@pytest.mark.parametrize("python", ["/home/ann/venv/bin/python", "/root/.venv/bin/python", "/tmp/v/bin/python"])
def test_an_interpreter_the_sandbox_hides_is_refused_with_the_fix(python):
    with pytest.raises(unit.UnitError, match=r"hides it|hides from the service.*python3 -m venv /opt/hwtui"):
        unit.check_interpreter(python)


def test_this_boxs_interpreter_is_refused_when_it_lives_where_the_unit_hides_it(tmp_path, capsys):
    path = tmp_path / "x.service"
    rc = main(["agent", "--install-unit", str(path)])
    hidden = any(p.startswith(unit.HIDDEN) for p in (sys.executable, str(Path(sys.executable).resolve())))
    if not hidden:
        pytest.skip(f"{sys.executable} is not under {', '.join(unit.HIDDEN)}")
    assert rc == 2 and not path.exists()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "which the unit hides from the service" in line and "python3 -m venv /opt/hwtui" in line


def test_install_unit_bad_input_is_one_line_exit_2(tmp_path, capsys, opt_python):
    (tmp_path / "plain").write_text("")
    assert main(["agent", "--install-unit", str(tmp_path / "plain" / "x.service")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--install-unit" in err[0]
    assert main(["agent", "--install-unit", str(tmp_path / "x.service"), "--cert", "/a.pem"]) == 2
    # An agent the unit would start must find its interface without this shell's environment.
    assert main(["agent", "--install-unit", str(tmp_path / "x.service"), "--listen", "0.0.0.0:9477"]) == 2
    assert "pass --advertise ADDR" in capsys.readouterr().err
    assert not (tmp_path / "x.service").exists()


def test_the_shipped_unit_is_the_generated_one():
    shipped = (ROOT / "packaging" / "hwtui-agent.service").read_text()
    assert shipped == unit.unit_text("/opt/hwtui/bin/python", "127.0.0.1:9477")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_rates_the_unit_ok(tmp_path):
    path = tmp_path / "hwtui-agent.service"
    path.write_text(unit.unit_text("/opt/hwtui/bin/python", "0.0.0.0:9477", cert="/etc/c.pem", key="/etc/k.pem"))
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(path)], capture_output=True, text=True,
                          timeout=60)
    m = re.search(r"Overall exposure level for hwtui-agent\.service: ([0-9.]+) (\w+)", done.stdout)
    assert m, done.stdout[-2000:] + done.stderr[-2000:]
    assert float(m.group(1)) <= 4.0 and m.group(2) == "OK", m.group(0)
