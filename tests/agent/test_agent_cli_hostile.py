"""`hwtui agent` given bad input (issue 22 F8, F9): one line on stderr, exit 2, never a hang.

Each case runs the real command; a case that used to hang (a FIFO as --cert) is bounded by the
subprocess timeout, so a regression fails instead of blocking the suite.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys

import pytest

from hwtui.app.node_api import token as tokens


def _agent(tmp_path, *args: str, token_file: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HWTUI_AGENT_TOKEN": ""}
    cmd = [sys.executable, "-m", "hwtui.app", "agent", "--token-file", token_file or str(tmp_path / "tok"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def _one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def test_a_directory_as_token_file_is_one_line_exit_2(tmp_path):
    _one_line_exit_2(_agent(tmp_path, "--listen", "127.0.0.1:0", token_file=str(tmp_path)), "not a regular file")


def test_a_fifo_as_token_file_is_one_line_exit_2(tmp_path):
    os.mkfifo(tmp_path / "fifo", 0o600)
    _one_line_exit_2(_agent(tmp_path, "--listen", "127.0.0.1:0", token_file=str(tmp_path / "fifo")),
                     "not a regular file")


@pytest.mark.parametrize("listen", ["evil;host:1", "a b:1", "-x:1", "host:99999", "host:+1", "[::1]:"])
def test_a_malformed_listen_address_is_one_line_exit_2(tmp_path, listen):
    _one_line_exit_2(_agent(tmp_path, "--listen", listen), "--listen")


def test_a_host_that_does_not_resolve_is_one_line_exit_2(tmp_path):
    # Valid as a name, fails in bind (getaddrinfo): the path that ran server_close before __init__.
    _one_line_exit_2(_agent(tmp_path, "--listen", "no-such-host.invalid:1"), "--listen")


def test_a_port_in_use_is_named_in_one_line_exit_2(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        done = _agent(tmp_path, "--listen", f"127.0.0.1:{port}")
    _one_line_exit_2(done, f"port {port}", "in use")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_cert_or_key_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path, kind):
    bad = {"fifo": tmp_path / "fifo", "directory": tmp_path, "device": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(bad, 0o600)  # opening it for reading would wait for a writer forever
    good = tmp_path / "cert.pem"
    good.write_text("not used\n")
    _one_line_exit_2(_agent(tmp_path, "--listen", "127.0.0.1:0", "--cert", str(bad), "--key", str(bad)), "--cert")
    _one_line_exit_2(_agent(tmp_path, "--listen", "127.0.0.1:0", "--cert", str(good), "--key", str(bad)), "--key")


def test_an_encrypted_key_is_refused_instead_of_prompting(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-passout", "pass:secret", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=x"],
                   check=True, capture_output=True, timeout=30)
    _one_line_exit_2(_agent(tmp_path, "--listen", "127.0.0.1:0", "--cert", str(cert), "--key", str(key)), "encrypted")


def test_a_token_file_owned_by_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a file owned by another user needs root")
    path = tmp_path / "agent.token"
    path.write_text("s3cret-token\n")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)  # nobody: could read the token, or swap in one of their choosing
    with pytest.raises(tokens.HwtuiError, match="owned by uid 65534"):
        tokens.read_token_file(path)
    _one_line_exit_2(_agent(tmp_path, "--listen", "127.0.0.1:0", token_file=str(path)), "owned by uid 65534")


def test_a_token_file_of_this_user_mode_0600_is_read(tmp_path):
    path = tmp_path / "agent.token"
    path.write_text("s3cret-token\n")
    path.chmod(0o600)
    assert tokens.read_token_file(path) == "s3cret-token"
    path.chmod(0o640)
    with pytest.raises(tokens.HwtuiError, match="readable by others"):
        tokens.read_token_file(path)
    path.chmod(0o600)
    path.write_bytes(b"tok\x1b]0;x\x07en\n")
    with pytest.raises(tokens.HwtuiError, match="one token"):
        tokens.read_token_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
