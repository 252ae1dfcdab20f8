"""Step 4, Engine: replication or training, and its knobs, pre-filled from the detected hardware.

Blank fields mean "the default shown as placeholder", which follows the hardware when the user
re-detects; only what the user typed is remembered in the config file.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from hwtui.app.tui.screens._step import WizardStep
from hwtui.widgets.choice_toggle import ChoiceToggle
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal
from textual.widgets import Input, Label, Static

# field id -> (label, config attribute, kind, defaults key)
FIELDS: list[tuple[str, str, str, str, str | None]] = [
    ("plan", "Plan file", "plan", "text", None),
    ("weights", "Weights", "weights", "text", None),
    ("device", "Device", "device", "text", "device"),
    ("nproc", "Processes", "nproc", "integer", "nproc"),
    ("bucket_mb", "Bucket MB", "bucket_mb", "integer", "bucket_mb"),
    ("window", "Window", "window", "integer", "window"),
    ("chunk_mb", "Chunk MB", "chunk_mb", "integer", "chunk_mb"),
    ("gpu_ids", "Train devices", "gpu_ids", "text", "gpu_ids"),
    ("steps", "Train steps", "steps", "integer", None),
    ("interval", "Sample every", "interval", "number", None),
]
REPLICATE_ONLY = {"plan", "weights", "device", "nproc", "bucket_mb", "window", "chunk_mb"}
TRAIN_ONLY = {"gpu_ids", "steps"}


class EngineScreen(WizardStep):
    STEP = "engine"
    # Inputs take letters, so this step's own keys are control keys.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "back", "Back", show=False),
        Binding("n", "next", "Next", show=False),
        Binding("r", "rerun", "Re-run", show=False),
        Binding("escape", "back", "Back"),
        Binding("ctrl+s", "start", "Start run", priority=True),
        Binding("ctrl+d", "reset_defaults", "Defaults", priority=True),
    ]
    DEFAULT_CSS = """
    EngineScreen #choices { height: 1; margin: 1 0 0 0; }
    EngineScreen #choices > Label { width: 14; }
    EngineScreen #form { grid-size: 4; grid-columns: 14 1fr 14 1fr; grid-rows: 1; grid-gutter: 0 1; height: auto; margin: 1 0; }
    EngineScreen #form Input { height: 1; border: none; padding: 0; }
    EngineScreen #form Label.-off, EngineScreen #form Input.-off { opacity: 40%; }
    EngineScreen #form Input.-invalid { text-style: reverse; }
    EngineScreen #problems { height: auto; color: $error; }
    """

    def compose_body(self) -> ComposeResult:
        cfg = self.app.config  # type: ignore[attr-defined]
        with Horizontal(id="choices"):
            yield Label("Engine")
            yield ChoiceToggle([("replicate", "replicate"), ("train", "train")], cfg.mode, id="mode")
            yield Label(" Source")
            yield ChoiceToggle([("plan", "plan"), ("weights", "weights")], cfg.source, id="source")
        with Grid(id="form"):
            for fid, label, attr, kind, _dkey in FIELDS:
                value = getattr(cfg, attr)
                text = "" if value in ("", 0) or (fid == "steps" and value == 0) else str(value)
                yield Label(label, id=f"label-{fid}")
                yield Input(text, id=f"in-{fid}", type=kind)  # type: ignore[arg-type]
        yield Static("", id="status", classes="summary")
        yield Static("", id="problems")
        yield Static("ctrl+s starts the run (plans first when you chose weights). Blank = the default shown.",
                     classes="hint")

    def on_screen_resume(self) -> None:
        # Defaults follow the latest detection, so refresh them every time the step is shown.
        self.started = True
        self.action_rerun()

    def action_rerun(self) -> None:
        defaults = self.app.defaults  # type: ignore[attr-defined]
        for fid, _label, _attr, _kind, dkey in FIELDS:
            if dkey:
                self.query_one(f"#in-{fid}", Input).placeholder = f"{defaults[dkey]} (detected)"
        self.query_one("#in-plan", Input).placeholder = "plan.json from `hwtui plan`"
        self.query_one("#in-weights", Input).placeholder = "model.safetensors or a directory"
        self.query_one("#in-interval", Input).placeholder = "1.0 s"
        self.query_one("#in-steps", Input).placeholder = "50"
        devices = self.app.devices  # type: ignore[attr-defined]
        usable = sum(1 for d in devices if d.usable)
        self.set_status(f"defaults from {usable} usable device(s): device {defaults['device']}, "
                        f"{defaults['nproc']} processes, bucket {defaults['bucket_mb']} MB, window {defaults['window']}")
        self._grey_out()

    def on_choice_toggle_changed(self, _event: ChoiceToggle.Changed) -> None:
        if self.is_mounted:
            self._grey_out()

    def _mode(self) -> tuple[str, str]:
        return self.query_one("#mode", ChoiceToggle).value, self.query_one("#source", ChoiceToggle).value

    def _grey_out(self) -> None:
        """Dim the fields the chosen engine ignores (still editable: they are remembered)."""
        mode, source = self._mode()
        for fid, *_ in FIELDS:
            off = (mode == "train" and fid in REPLICATE_ONLY) or (mode == "replicate" and fid in TRAIN_ONLY)
            off = off or (mode == "replicate" and ((source == "plan" and fid in ("weights", "bucket_mb"))
                                                   or (source == "weights" and fid == "plan")))
            self.query_one(f"#in-{fid}", Input).set_class(off, "-off")
            self.query_one(f"#label-{fid}", Label).set_class(off, "-off")

    def action_reset_defaults(self) -> None:
        for fid, *_ in FIELDS:
            if fid not in ("plan", "weights"):
                self.query_one(f"#in-{fid}", Input).value = ""

    def collect(self) -> tuple[dict[str, Any], list[str]]:
        """The form as config values, and what is wrong with it (empty when it can run)."""
        mode, source = self._mode()
        values: dict[str, Any] = {"mode": mode, "source": source}
        problems: list[str] = []
        for fid, label, attr, kind, _dkey in FIELDS:
            widget = self.query_one(f"#in-{fid}", Input)
            raw = widget.value.strip()
            widget.remove_class("-invalid")
            if kind == "text":
                values[attr] = raw
                continue
            try:
                number = (int(raw) if kind == "integer" else float(raw)) if raw else 0
            except ValueError:
                problems.append(f"{label}: {raw!r} is not a number")
                widget.add_class("-invalid")
                continue
            if number < 0 or (fid == "interval" and raw and number < 0.1):
                problems.append(f"{label}: must be {'at least 0.1' if fid == 'interval' else 'positive'}")
                widget.add_class("-invalid")
                continue
            values[attr] = number
        if not values.get("steps"):
            values["steps"] = 50
        if not values.get("interval"):
            values["interval"] = 1.0
        if mode == "replicate":
            if source == "plan":
                if not values["plan"]:
                    problems.append("Plan file: give the plan.json to replicate (or choose weights)")
                elif not os.path.isfile(values["plan"]):
                    problems.append(f"Plan file: {values['plan']} does not exist")
            else:
                if not values["weights"]:
                    problems.append("Weights: give a .safetensors file or directory (or choose plan)")
                elif not os.path.exists(values["weights"]):
                    problems.append(f"Weights: {values['weights']} does not exist")
        return values, problems

    def action_start(self) -> None:
        values, problems = self.collect()
        self.query_one("#problems", Static).update("\n".join(problems))
        if problems:
            self.notify(problems[0], severity="error")
            return
        cfg = self.app.config  # type: ignore[attr-defined]
        for key, value in values.items():
            setattr(cfg, key, value)
        self.app.save_config()  # type: ignore[attr-defined]
        # The Run screen may not be composed yet (first visit): it starts the run when shown.
        self.app.get_screen("run").pending_run = True
        self.app.goto("run")  # type: ignore[attr-defined]

    def action_next(self) -> None:
        self.action_start()
