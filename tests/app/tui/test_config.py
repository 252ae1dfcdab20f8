"""Remembered choices: round trip, atomic write, and a broken file never stops the app."""

from __future__ import annotations

import json

from hwtui.app.tui.config import SCHEMA, TuiConfig, config_path


def test_round_trip_under_xdg_config_home(config_home):
    cfg = TuiConfig(mode="train", gpu_ids="cpu:0,cpu:1", steps=7, interval=0.5, export_path="x.env")
    cfg.save()
    path = config_path()
    assert path == config_home / "hwtui" / "config.json"
    assert json.loads(path.read_text())["schema"] == SCHEMA
    back = TuiConfig.load()
    assert (back.mode, back.gpu_ids, back.steps, back.interval, back.export_path) == ("train", "cpu:0,cpu:1", 7, 0.5, "x.env")
    assert [p.name for p in path.parent.iterdir()] == ["config.json"], "no temporary file left behind"


def test_missing_file_gives_defaults(config_home):
    cfg = TuiConfig.load()
    assert cfg == TuiConfig() and not cfg.note


def test_corrupt_file_is_ignored_with_a_note(config_home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    cfg = TuiConfig.load()
    assert cfg.mode == "replicate" and "ignored" in cfg.note and str(path) in cfg.note


def test_foreign_schema_and_bad_values(config_home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": "other/1", "mode": "train"}))
    assert TuiConfig.load().mode == "replicate"
    path.write_text(json.dumps({"schema": SCHEMA, "mode": "train", "steps": "many", "window": 3}))
    cfg = TuiConfig.load()
    assert (cfg.mode, cfg.steps, cfg.window) == ("train", 50, 3), "one bad value keeps its default only"
