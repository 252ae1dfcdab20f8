"""Ctrl-C while `hwtui train --push-to` waits for its last push: the wait stops, the push in flight
is recorded as interrupted, the report is written, exit 130, and no traceback (issue 26's noticed
"second Ctrl-C during the push wait": the handlers used to be restored before the wait, so the
signal was a KeyboardInterrupt that lost the report)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import cli_proc
from tests.agent.helpers import TOKEN
from tests.agent.hostile import HostileAgent, answer
from tests.app.test_train_push_options import GPT2

pytest.importorskip("transformers")
pytest.importorskip("httpx")


PREFLIGHT = answer(b"{}")


class _Stalling:
    """Answers the preflight (its first request) at once; every later request gets an answer that
    drips one byte per half second (HostileAgent's drip, which keeps each per-read timeout happy):
    a push that stays in flight for as long as the test wants."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self._seen = 0
        self._lock = threading.Lock()

    def __call__(self, _path: str) -> bytes:
        with self._lock:
            self._seen += 1
            first = self._seen == 1
        if first:
            return PREFLIGHT  # short enough to go out before the drip starts
        self.held.set()
        return answer(b" " * 100_000 + b"{}")


def _wait(what: str, pred, proc: subprocess.Popen, seconds: float = 180) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"train exited ({proc.returncode}) before {what}")
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_ctrl_c_during_the_last_push_stops_the_wait_and_keeps_the_report(tmp_path: Path) -> None:
    model = tmp_path / "gpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GPT2))
    token = tmp_path / "agent.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    stalls = [_Stalling(), _Stalling()]
    agents = [HostileAgent(s, drip_s=0.5, drip_from=len(PREFLIGHT)) for s in stalls]
    try:
        argv = ["train", "--gpu-ids", "cpu:0", "--steps", "4", "--model", str(model),
                "--report", str(tmp_path / "r.json"), "--save-hf", str(tmp_path / "hf"),
                "--push-to", ",".join(f"127.0.0.1:{a.port}" for a in agents), "--token-file", str(token)]
        proc = cli_proc.Popen([sys.executable, "-m", "hwtui.app", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        # Each pipe has one reader, a thread of its own (communicate() would race the stderr reader
        # for the last lines: a loaded run lost the FAILED line that way).
        lines: list[str] = []
        outs: list[str] = []
        readers = [threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True),  # type: ignore[union-attr]
                   threading.Thread(target=lambda: outs.extend(iter(proc.stdout.readline, "")), daemon=True)]  # type: ignore[union-attr]
        for r in readers:
            r.start()
        try:
            # Training is over and the command says it waits for the final push, which an agent holds.
            _wait("the waiting line", lambda: any("waiting for the push of" in ln for ln in lines), proc)
            # The line can come before the push's next request reaches an agent: wait for that too.
            _wait("an agent holding the push", lambda: any(s.held.is_set() for s in stalls), proc)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)  # the dripped answer would take 14 hours
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            for r in readers:
                r.join(30)  # both pipes reach EOF once the process is gone
    finally:
        for a in agents:
            a.close()
    err, out = "".join(lines), "".join(outs)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is True and report["step"] == 4  # the training itself delivered
    assert (tmp_path / "hf" / "model.safetensors").is_file()  # --save-hf is the user's, kept
    (push,) = report["pushes"]
    assert push["outcome"] == "interrupted" and push["ok"] is False and push["final"] is True, push
    assert push["version"].endswith("-step4"), push
    assert "waiting for the push of" in err and push["version"] in err, err
    failed = [ln for ln in err.splitlines() if "FAILED" in ln]
    assert len(failed) == 1 and "interrupted" in failed[0], err
    assert not list(tmp_path.glob(".hwtui-push-*"))  # the pusher's own working directory is gone
    assert "push" in out
