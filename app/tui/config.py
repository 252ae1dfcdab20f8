"""Choices the wizard remembers between runs: ``$XDG_CONFIG_HOME/hwtui/config.json``.

Written atomically (a crash never leaves half a file); an unreadable or foreign file is ignored
with a note instead of stopping the app, since it only holds defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.core.atomic import atomic_write_text

SCHEMA = "hwtui.tui-config/1"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hwtui" / "config.json"


@dataclass
class TuiConfig:
    mode: str = "replicate"  # replicate | train | cluster
    source: str = "plan"  # plan | weights
    plan: str = ""
    weights: str = ""
    device: str = ""  # replicate: cpu / cuda / xpu ...; "" = from the detected hardware
    nproc: int = 0  # 0 = from the detected hardware
    gpu_ids: str = ""  # train: "cpu:0,cpu:1"; "" = from the detected hardware
    bucket_mb: int = 0
    window: int = 0
    chunk_mb: int = 0
    steps: int = 50
    train_model: str = ""  # train: `hwtui train --model` ("" = the built-in char model)
    train_data: str = ""  # train: `hwtui train --data` ("" = the Python standard library's source)
    interval: float = 1.0  # dashboard sampling period, seconds
    export_path: str = "hwtui.env"
    # cluster: what `hwtui cluster init` is given (see engine/cluster/spec.py for the rules)
    cluster_nodes: str = ""  # "a,b" or "a=10.0.0.1,b=10.0.0.2"
    cluster_devices: int = 0  # devices per node; 0 = from the detected hardware
    cluster_interface: str = ""  # "" = the first up, non-loopback interface detected
    cluster_launcher: str = "torchrun"  # torchrun | slurm | mpirun
    cluster_out: str = "hwtui-cluster"
    cluster_max_bytes: str = ""  # largest message of the smoke test's sweep; "" = the CLI's default
    step: str = "detect"  # the wizard step to open on
    note: str = ""  # why the file was not loaded, shown once

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("note")
        return {"schema": SCHEMA, **out}

    @classmethod
    def load(cls, path: Path | None = None) -> TuiConfig:
        path = path or config_path()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            return cls(note=f"ignored {path}: {exc}")
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
            return cls(note=f"ignored {path}: not a {SCHEMA} file")
        cfg = cls()
        for f in dataclasses.fields(cls):
            if f.name in raw and f.name != "note":
                value = raw[f.name]
                default = getattr(cfg, f.name)
                try:
                    setattr(cfg, f.name, type(default)(value))
                except (TypeError, ValueError):
                    continue  # one bad value keeps its default; the rest still load
        return cfg

    def save(self, path: Path | None = None) -> None:
        path = path or config_path()
        # Other parts of hwtui keep their own keys here (`hwtui setup`: "environments"); keep them.
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        kept = {k: v for k, v in raw.items() if k not in self.to_dict()} if isinstance(raw, dict) else {}
        atomic_write_text(path, json.dumps({**kept, **self.to_dict()}, indent=2) + "\n")
