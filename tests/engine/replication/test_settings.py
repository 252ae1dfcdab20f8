"""One frozen settings type from the command line to the rank, and one default and one maximum for
every knob, read alike by ``hwtui replicate``, ``hwtui push``, the resident receiver, the TUI and
the environment checks (probes/distributed/replication_defaults.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from hwtui.app.cli import main
from hwtui.app.commands import push as push_cmd
from hwtui.app.commands import replicate as replicate_cmd
from hwtui.app.tui.defaults import engine_defaults
from hwtui.core.errors import HwtuiError
from hwtui.engine.replication.config import WorkerConfig
from hwtui.engine.replication.launcher import ReplicationOptions, resolve_settings
from hwtui.engine.replication.settings import ReplicationSettings
from hwtui.engine.replication.transport import choose_transport
from hwtui.engine.resident.resident import PushRefused, push_settings
from hwtui.probes.distributed.knobs import knob_values
from hwtui.probes.distributed.replication_defaults import (
    DEFAULT_CHUNK_MB,
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
    MAX_CHUNK_MB,
    MAX_TIMEOUT_S,
    MAX_WINDOW,
)

MB = 1 << 20
WINDOW_ENV, CHUNK_ENV = "HOTWEIGHTS_IPC_INFLIGHT_BUCKETS", "HOTWEIGHTS_BCAST_CHUNK_MB"


def _settings(env: dict[str, str] | None = None, **kw) -> ReplicationSettings:
    return resolve_settings(ReplicationOptions(plan="p", env=env or {}, **kw))


# ---------------------------------------------------------------------- the type


def test_a_flag_beats_its_environment_variable_which_beats_the_default():
    assert (_settings().window, _settings().chunk_bytes) == (DEFAULT_WINDOW, int(DEFAULT_CHUNK_MB * MB))
    env = {WINDOW_ENV: "9", CHUNK_ENV: "3"}
    assert (_settings(env).window, _settings(env).chunk_bytes) == (9, 3 * MB)
    flagged = _settings(env, window=5, chunk_mb=2)
    assert (flagged.window, flagged.chunk_bytes) == (5, 2 * MB)
    # An empty variable is unset; a flag set beside a bad variable never reads it.
    assert _settings({WINDOW_ENV: " "}).window == DEFAULT_WINDOW
    assert _settings({WINDOW_ENV: "lots"}, window=3).window == 3
    with pytest.raises(HwtuiError, match=f"{WINDOW_ENV}='lots' is not a number"):
        _settings({WINDOW_ENV: "lots"})


def test_the_settings_are_frozen_and_refuse_nonsense_whoever_builds_them():
    s = _settings(adaptive=True, target_bucket_ms=80, max_inflight_mb=8, verify=False, device="cpu")
    assert s == ReplicationSettings(window=DEFAULT_WINDOW, chunk_bytes=int(DEFAULT_CHUNK_MB * MB), max_inflight_bytes=8 * MB,
                                    adaptive=True, target_bucket_s=0.08, verify=False, device="cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.window = 5  # type: ignore[misc]
    for bad in ({"window": 0}, {"window": True}, {"window": 2.5}, {"chunk_bytes": 0}, {"max_inflight_bytes": -1},
                {"verify": "yes"}, {"device": 3}, {"target_bucket_s": "fast"}):
        with pytest.raises(HwtuiError):
            ReplicationSettings(**bad)


def test_the_rank_gets_the_launchers_settings_as_typed_json():
    s = _settings({WINDOW_ENV: "6"}, chunk_mb=2, max_inflight_mb=4)
    cfg = WorkerConfig(plan="/p", transport=choose_transport("cpu"), world_size=2, rank=1, settings=s)
    raw = json.loads(cfg.to_json())
    assert raw["settings"] == {"window": 6, "chunk_bytes": 2 * MB, "max_inflight_bytes": 4 * MB, "adaptive": False,
                               "target_bucket_s": 0.05, "verify": True, "device": "cpu"}
    back = WorkerConfig.from_json(cfg.to_json())
    assert back == cfg and isinstance(back.settings, ReplicationSettings)
    # A rank refuses settings out of bounds or half understood, in one line, like any bad config.
    for change in ({"window": MAX_WINDOW + 1}, {"surprise": 1}, {"window": None}):
        bad = json.loads(cfg.to_json())
        bad["settings"].update(change)
        with pytest.raises(HwtuiError, match="window|surprise"):
            WorkerConfig.from_json(json.dumps(bad))
    del raw["settings"]["verify"]
    with pytest.raises(HwtuiError, match="missing field"):
        WorkerConfig.from_json(json.dumps(raw))


# ---------------------------------------------------------------------- one default, one maximum


def _push_args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    push_cmd.add_arguments(p)
    return p.parse_args(["--plan", "p", "--agents", "a,b", *extra])


def _replicate_args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    replicate_cmd.add_arguments(p)
    return p.parse_args(["--plan", "p", *extra])


def test_every_entry_point_starts_from_the_same_defaults():
    pushed = _push_args()
    repl, timeouts = push_settings({})
    replicated = _settings(timeout=_replicate_args().timeout)
    assert pushed.inflight == repl.window == replicated.window == engine_defaults([])["window"] == DEFAULT_WINDOW
    assert pushed.chunk_mb == DEFAULT_CHUNK_MB and repl.chunk_bytes == replicated.chunk_bytes == int(DEFAULT_CHUNK_MB * MB)
    assert knob_values({})["window"] == DEFAULT_WINDOW
    assert pushed.timeout == timeouts.bucket == _replicate_args().timeout == DEFAULT_TIMEOUT_S
    assert pushed.init_timeout == timeouts.init == _replicate_args().init_timeout == DEFAULT_INIT_TIMEOUT_S


@pytest.fixture
def bad_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("HWTUI_AGENT_TOKEN", "t" * 32)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "nope"}))
    return str(plan)


def _cli_error(capsys, argv: list[str]) -> str:
    """Run the CLI on input that is bad somewhere: exit 2 and one line; return that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_one_maximum_window_for_replicate_push_the_resident_receiver_and_the_env_check(capsys, bad_plan):
    # At the maximum every entry point takes it (and fails later, on the plan); one more, all refuse it.
    assert "--inflight" not in _cli_error(capsys, ["replicate", "--plan", bad_plan, "--inflight", str(MAX_WINDOW)])
    assert "--inflight" not in _cli_error(capsys, ["push", "--plan", bad_plan, "--agents", "a:1,b:1",
                                                   "--inflight", str(MAX_WINDOW)])
    assert push_settings({"inflight": MAX_WINDOW})[0].window == MAX_WINDOW
    assert _settings({WINDOW_ENV: str(MAX_WINDOW)}).window == MAX_WINDOW
    assert knob_values({WINDOW_ENV: str(MAX_WINDOW)})["problems"] == {}

    over = str(MAX_WINDOW + 1)
    assert f"--inflight {over}: at most {MAX_WINDOW}" in _cli_error(capsys, ["replicate", "--plan", bad_plan,
                                                                           "--inflight", over])
    assert f"--inflight is 1 to {MAX_WINDOW}" in _cli_error(capsys, ["push", "--plan", bad_plan, "--agents", "a:1,b:1",
                                                                     "--inflight", over])
    with pytest.raises(PushRefused, match=f"settings.inflight must be a number from 1 to {MAX_WINDOW}") as refused:
        push_settings({"inflight": MAX_WINDOW + 1})
    assert refused.value.status == 400
    with pytest.raises(HwtuiError, match=f"{WINDOW_ENV}={over}: at most {MAX_WINDOW}"):
        _settings({WINDOW_ENV: over})
    assert WINDOW_ENV in knob_values({WINDOW_ENV: over})["problems"]


def test_one_maximum_chunk_and_timeout_for_replicate_push_and_the_resident_receiver(capsys, bad_plan):
    top, over = f"{MAX_CHUNK_MB:g}", f"{MAX_CHUNK_MB + 1:g}"
    assert _settings(chunk_mb=MAX_CHUNK_MB).chunk_bytes == int(MAX_CHUNK_MB * MB)
    assert push_settings({"chunk_mb": MAX_CHUNK_MB})[0].chunk_bytes == int(MAX_CHUNK_MB * MB)
    assert "--chunk-mb" not in _cli_error(capsys, ["push", "--plan", bad_plan, "--agents", "a:1,b:1", "--chunk-mb", top])
    assert "--chunk-mb" in _cli_error(capsys, ["replicate", "--plan", bad_plan, "--chunk-mb", over])
    assert "--chunk-mb 1 to" in _cli_error(capsys, ["push", "--plan", bad_plan, "--agents", "a:1,b:1", "--chunk-mb", over])
    with pytest.raises(PushRefused, match="settings.chunk_mb"):
        push_settings({"chunk_mb": MAX_CHUNK_MB + 1})

    assert push_settings({"timeout": MAX_TIMEOUT_S})[1].bucket == MAX_TIMEOUT_S
    _settings(timeout=MAX_TIMEOUT_S, init_timeout=MAX_TIMEOUT_S)
    over_s = f"{MAX_TIMEOUT_S + 1:g}"
    assert "timeouts are at most" in _cli_error(capsys, ["replicate", "--plan", bad_plan, "--timeout", over_s])
    assert "--timeout" in _cli_error(capsys, ["push", "--plan", bad_plan, "--agents", "a:1,b:1", "--timeout", over_s])
    with pytest.raises(PushRefused, match="settings.init_timeout"):
        push_settings({"init_timeout": MAX_TIMEOUT_S + 1})
