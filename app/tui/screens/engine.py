"""Step 4, Engine: replication, training or a cluster smoke test, pre-filled from the hardware.

Blank fields mean "the default shown as placeholder", which follows the hardware when the user
re-detects; only what the user typed is remembered in the config file.

The cluster choice swaps the knobs for a cluster description. It is checked by the same
``ClusterSpec.validate`` the CLI uses, and the launch files are written by ``hwtui cluster init``
itself in a subprocess, so the wizard and a script typed by hand can never disagree.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, ClassVar

from rich.markup import escape
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Input, Label, Static

from hwtui.app.tui import engine_process
from hwtui.app.tui.messages import ClusterFilesWritten, InterfacesDetected, RunRequested
from hwtui.app.tui.screens._step import WizardStep
from hwtui.core.supervisor import run_capture
from hwtui.widgets.choice_toggle import ChoiceToggle
from hwtui.widgets.launch_commands import LaunchCommands

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
    ("model", "Model", "train_model", "text", None),
    ("data", "Text data", "train_data", "text", None),
    ("interval", "Sample every", "interval", "number", None),
]
REPLICATE_ONLY = {"plan", "weights", "device", "nproc", "bucket_mb", "window", "chunk_mb"}
TRAIN_ONLY = {"gpu_ids", "steps", "model", "data"}
LAUNCHERS = [("torchrun", "torchrun c10d"), ("slurm", "slurm"), ("mpirun", "mpirun")]
INIT_TIMEOUT_S = 60


def default_interface(interfaces: list[dict[str, Any]]) -> str | None:
    """The first up, non-loopback interface; a real NIC before a container bridge or veth."""
    up = [i for i in interfaces if i.get("up") and not i.get("loopback")]
    real = [i for i in up if not i.get("virtual")]
    return (real or up or [{}])[0].get("name")


def _field_of(message: str) -> str:
    """Which input a ``SpecError`` is about, to mark it (the message itself is shown as is)."""
    if "interface" in message:
        return "c-interface"
    if "devices per node" in message:
        return "c-devices"
    return "c-nodes"


def _train_input_problems(model: str, data: str) -> list[tuple[str, str]]:
    """(field, problem) for what `hwtui train` would refuse in --model / --data before any worker
    starts, said here first (the model's own checks, engine.training.modelspec: no torch, nothing
    downloaded). What only loading can tell (an architecture, a tokenizer) is the run's one-line error."""
    from hwtui.engine.training import modelspec

    problems = []
    if model:
        try:
            spec = modelspec.parse(model)
            if spec.kind == "hf":
                modelspec.read_config(spec)
        except modelspec.ModelSpecError as exc:
            problems.append(("model", f"Model: {str(exc).removeprefix(f'--model {model}: ')}"))
    if data and not os.path.exists(os.path.expanduser(data)):
        problems.append(("data", f"Text data: {data} does not exist"))
    return problems


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
        Binding("ctrl+o", "write_cluster", "Write files", priority=True),
        Binding("ctrl+y", "copy_command", "Copy command", priority=True),
    ]
    DEFAULT_CSS = """
    EngineScreen #engine-box { height: auto; }
    EngineScreen #choices, EngineScreen #source-row { height: 1; margin: 0; }
    EngineScreen .group-title { width: 8; text-style: bold; }
    EngineScreen #form { grid-size: 4; grid-columns: 14 1fr 14 1fr; grid-rows: 1; grid-gutter: 0 1; height: auto; margin: 1 0 0 0; }
    EngineScreen #form Input { height: 1; border: none; padding: 0; }
    EngineScreen #form Label.-off, EngineScreen #form Input.-off { opacity: 40%; }
    EngineScreen #form Input.-invalid { text-style: reverse; }
    EngineScreen #problems { height: auto; color: $error; }
    EngineScreen #cluster-form { grid-size: 4; grid-columns: 14 1fr 11 1fr; grid-rows: 1; grid-gutter: 0 1;
                                 height: auto; margin: 1 0 0 0; }
    EngineScreen #cluster-form Input { height: 1; border: none; padding: 0; }
    EngineScreen #cluster-form Input.-invalid { text-style: reverse; }
    EngineScreen #cluster-form .-wide { column-span: 3; }
    EngineScreen #cluster-files { height: auto; }
    EngineScreen.-cluster #form, EngineScreen.-cluster #source-row { display: none; }
    EngineScreen #cluster-form, EngineScreen #cluster-files, EngineScreen #launch { display: none; }
    EngineScreen.-cluster #cluster-form, EngineScreen.-cluster #cluster-files { display: block; }
    EngineScreen.-cluster #launch { display: block; }
    EngineScreen.-cluster #launch.-empty { display: none; }
    /* Focus and placeholders at WCAG AA in the default theme (tests/app/tui/test_wizard_contrast.py):
       the borderless fields' focus was one grey step (235 vs 234), placeholders 3.5:1. A bar in the
       accent colour marks the focused field or choice (its cell is kept blank otherwise, so nothing
       moves; after the rules above, which clear the fields' borders), and placeholders are the foreground at 65 %. */
    EngineScreen #form Input, EngineScreen #cluster-form Input { border-left: blank; }
    EngineScreen #form Input:focus, EngineScreen #cluster-form Input:focus { border-left: wide $accent; }
    EngineScreen Input > .input--placeholder { color: $foreground 65%; }
    EngineScreen ChoiceToggle { border-left: blank; }
    EngineScreen ChoiceToggle:focus { border-left: wide $accent; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.interfaces: list[dict[str, Any]] = []
        self._overwrite_ok = ""  # the output directory whose cluster.json the user agreed to replace

    def compose_body(self) -> ComposeResult:
        cfg = self.hw.config
        with Vertical(id="engine-box", classes="panel"):
            # One titled row per group: side by side they ran together ("cluster Source (•) plan").
            with Horizontal(id="choices"):
                yield Label("Engine", classes="group-title")
                yield ChoiceToggle([("replicate", "replicate"), ("train", "train"), ("cluster", "cluster")], cfg.mode, id="mode")
            with Horizontal(id="source-row"):
                yield Label("Source", id="source-label", classes="group-title")
                yield ChoiceToggle([("plan", "plan"), ("weights", "weights")], cfg.source, id="source")
            with Grid(id="form"):
                for fid, label, attr, kind, _dkey in FIELDS:
                    value = getattr(cfg, attr)
                    text = "" if value in ("", 0) or (fid == "steps" and value == 0) else str(value)
                    yield Label(label, id=f"label-{fid}")
                    yield Input(text, id=f"in-{fid}", type=kind)  # type: ignore[arg-type]
            with Grid(id="cluster-form"):
                yield Label("Nodes")
                yield Input(cfg.cluster_nodes, id="in-c-nodes", classes="-wide",
                            placeholder="a,b or a=10.0.0.1,b=10.0.0.2 (blank: this box only)")
                yield Label("Devices/node")
                yield Input(str(cfg.cluster_devices or ""), id="in-c-devices", type="integer")
                yield Label("Interface")
                yield Input(cfg.cluster_interface, id="in-c-interface")
                yield Label("Launcher")
                yield ChoiceToggle(LAUNCHERS, cfg.cluster_launcher, id="c-launcher", classes="-wide")
                yield Label("Output dir")
                yield Input(cfg.cluster_out, id="in-c-out", placeholder="hwtui-cluster")
                yield Label("Sweep max")
                yield Input(cfg.cluster_max_bytes, id="in-c-max_bytes", placeholder="64M")
        yield Static("", id="status", classes="summary")
        yield Static("", id="problems")
        yield LaunchCommands(id="launch", classes="panel")
        yield Static("", id="cluster-files", classes="hint")
        yield Static("", id="hint", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#engine-box").border_title = "engine settings"
        self.query_one(LaunchCommands).border_title = "launch commands"
        if self.started:  # shown before its form was there (below): the defaults now
            self.action_rerun()

    def on_screen_resume(self) -> None:
        # Defaults follow the latest detection, so refresh them every time the step is shown.
        self.started = True
        self.action_rerun()

    def action_rerun(self) -> None:
        if not self.query("#in-device"):
            # Shown before its form was mounted: seen under load when the wizard was paged through
            # at once (n, n, n), where this raised NoMatches and the app died with a traceback.
            return
        defaults = self.hw.defaults
        for fid, _label, _attr, _kind, dkey in FIELDS:
            if dkey:
                self.query_one(f"#in-{fid}", Input).placeholder = f"{defaults[dkey]} (detected)"
        self.query_one("#in-plan", Input).placeholder = "plan.json from `hwtui plan`"
        self.query_one("#in-weights", Input).placeholder = "model.safetensors or a directory"
        self.query_one("#in-interval", Input).placeholder = "1.0 s"
        self.query_one("#in-steps", Input).placeholder = "50"
        # Short, to fit 80 columns: the help (?) says every form --model and --data take.
        self.query_one("#in-model", Input).placeholder = "char (built in)"
        self.query_one("#in-data", Input).placeholder = "stdlib source"
        devices = self.hw.devices
        usable = sum(1 for d in devices if d.usable)
        self.query_one("#in-c-devices", Input).placeholder = f"{defaults['devices_per_node']} (detected)"
        self._status_text = (f"defaults from {usable} usable device(s): device {defaults['device']}, "
                             f"{defaults['nproc']} processes, bucket {defaults['bucket_mb']} MB, window {defaults['window']}")
        self._detect_interfaces()
        self._grey_out()
        # Say it before a run, not after one failed: a base install has no engine.
        self.query_one("#problems", Static).update(Text(engine_process.engine_extra_problem()))

    @work(thread=True, exclusive=True, group="netif", exit_on_error=False)
    def _detect_interfaces(self) -> None:
        # Off the UI thread: on a live host this reads sysfs and asks psutil for addresses.
        from hwtui.probes.distributed.netif import collect_interfaces

        try:
            found = collect_interfaces(self.hw.host)
            self.post_message(InterfacesDetected(list(found.get("interfaces") or [])))
        except Exception as exc:  # noqa: BLE001 - the form still works, the user types the name
            self.post_message(InterfacesDetected([], f"{type(exc).__name__}: {exc}"))

    def on_interfaces_detected(self, msg: InterfacesDetected) -> None:
        self.interfaces = msg.interfaces
        default = default_interface(msg.interfaces)
        field = self.query_one("#in-c-interface", Input)
        if default:
            field.placeholder = f"{default} (detected)"
        else:
            field.placeholder = "none detected: name it (e.g. eth0)" + (f" ({msg.error})" if msg.error else "")
        self._grey_out()

    def on_choice_toggle_changed(self, _event: ChoiceToggle.Changed) -> None:
        if self.is_mounted:
            self._grey_out()
            self.refresh_bindings()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "in-c-devices" and self.is_mounted:
            self._grey_out()  # the status line says how the smoke test will run

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The cluster keys only mean something on the cluster form: hidden from the footer elsewhere.
        if action in ("write_cluster", "copy_command") and self.is_mounted:
            return self._mode()[0] == "cluster"
        return True

    def _mode(self) -> tuple[str, str]:
        return self.query_one("#mode", ChoiceToggle).value, self.query_one("#source", ChoiceToggle).value

    def _grey_out(self) -> None:
        """Dim the fields the chosen engine ignores and take them out of the tab order (their values
        are kept and remembered; choosing that engine again brings them back)."""
        mode, source = self._mode()
        self.query_one("#source", ChoiceToggle).can_focus = mode == "replicate"
        cluster = mode == "cluster"
        self.set_class(cluster, "-cluster")
        if cluster:
            per_node = self._cluster_devices()
            runs = (f"torchrun --standalone with {per_node} ranks" if per_node > 1
                    else "a one-rank local check")
            self.set_status(f"ctrl+o writes the launch files; ctrl+s runs {runs} here.")
            self.query_one("#hint", Static).update(
                "Results on the Run step. ctrl+y copies the highlighted command. Blank = the default shown.")
        else:
            self.set_status(getattr(self, "_status_text", ""))
            self.query_one("#hint", Static).update(
                "ctrl+s starts the run (plans first when you chose weights). Blank = the default shown.")
        for fid, *_ in FIELDS:
            off = (mode == "train" and fid in REPLICATE_ONLY) or (mode == "replicate" and fid in TRAIN_ONLY)
            off = off or (mode == "replicate" and ((source == "plan" and fid in ("weights", "bucket_mb"))
                                                   or (source == "weights" and fid == "plan")))
            field = self.query_one(f"#in-{fid}", Input)
            field.set_class(off, "-off")
            # Out of the tab order too: training's fields were 11 tabs away, behind 7 of replication's.
            field.can_focus = not off
            self.query_one(f"#label-{fid}", Label).set_class(off, "-off")

    def action_reset_defaults(self) -> None:
        for fid, *_ in FIELDS:
            if fid not in ("plan", "weights"):
                self.query_one(f"#in-{fid}", Input).value = ""
        for fid in ("c-devices", "c-interface", "c-max_bytes"):
            self.query_one(f"#in-{fid}", Input).value = ""

    # -- cluster ------------------------------------------------------------------------------
    def _cluster_devices(self) -> int:
        raw = self.query_one("#in-c-devices", Input).value.strip()
        try:
            return int(raw) if raw else int(self.hw.defaults["devices_per_node"])
        except ValueError:
            return 1

    def collect_cluster(self, need_nodes: bool = True) -> tuple[dict[str, Any], Any, list[str]]:
        """The cluster form as config values, the validated ``ClusterSpec`` (None when invalid), problems.

        ``need_nodes=False`` (the local smoke test) accepts an empty node list: one box needs none.
        Parsing and validation are `hwtui cluster init`'s own (``parse_nodes``, ``ClusterSpec.validate``),
        so the message here is the one-line error the CLI would print for the same input.
        """
        from hwtui.engine.cluster.bandwidth import parse_size
        from hwtui.engine.cluster.spec import ClusterSpec, SpecError, parse_nodes

        get = {fid: self.query_one(f"#in-{fid}", Input) for fid in ("c-nodes", "c-devices", "c-interface", "c-max_bytes", "c-out")}
        for widget in get.values():
            widget.remove_class("-invalid")
        raw = {fid: w.value.strip() for fid, w in get.items()}
        values: dict[str, Any] = {
            "mode": "cluster", "cluster_nodes": raw["c-nodes"], "cluster_interface": raw["c-interface"],
            "cluster_launcher": self.query_one("#c-launcher", ChoiceToggle).value,
            "cluster_out": raw["c-out"] or "hwtui-cluster", "cluster_max_bytes": raw["c-max_bytes"], "cluster_devices": 0,
        }
        problems: list[str] = []

        def bad(fid: str, text: str) -> None:
            problems.append(text)
            get[fid].add_class("-invalid")

        if raw["c-devices"]:
            try:
                values["cluster_devices"] = int(raw["c-devices"])
            except ValueError:
                bad("c-devices", f"Devices/node: {raw['c-devices']!r} is not a number")
        if raw["c-max_bytes"]:
            try:
                parse_size(raw["c-max_bytes"])
            except ValueError as exc:
                bad("c-max_bytes", f"Sweep max: {exc}")
        spec = None
        if not problems and (need_nodes or raw["c-nodes"]):
            per_node = values["cluster_devices"] or int(self.hw.defaults["devices_per_node"])
            interface = raw["c-interface"] or default_interface(self.interfaces)
            try:
                spec = ClusterSpec(nodes=parse_nodes(raw["c-nodes"]), devices_per_node=per_node,
                                   launcher=values["cluster_launcher"], interface=interface).validate()
            except SpecError as exc:
                bad(_field_of(str(exc)), str(exc))
        return values, spec, problems

    def _show_problems(self, problems: list[str]) -> bool:
        self.query_one("#problems", Static).update(Text("\n".join(problems)))  # plain: paths may hold [brackets]
        if problems:
            self.notify(escape(problems[0]), severity="error")
        return not problems

    def _remember(self, values: dict[str, Any]) -> None:
        cfg = self.hw.config
        for key, value in values.items():
            setattr(cfg, key, value)
        self.hw.save_config()

    def action_write_cluster(self) -> None:
        if self._mode()[0] != "cluster":
            return
        values, spec, problems = self.collect_cluster()
        if not self._show_problems(problems):
            return
        self._remember(values)
        out = values["cluster_out"]
        force = self._overwrite_ok == os.path.abspath(out)
        argv = [sys.executable, "-m", "hwtui.app", "cluster", "init", "--nodes", values["cluster_nodes"],
                "--devices-per-node", str(spec.devices_per_node), "--launcher", spec.launcher, "-o", out, "--json"]
        if spec.interface:
            argv += ["--interface", spec.interface]
        if force:
            argv.append("--force")
        self.query_one("#cluster-files", Static).update(f"writing {out}/ ...")
        self._write_cluster(argv, out)

    @work(thread=True, exclusive=True, group="cluster-init", exit_on_error=False)
    def _write_cluster(self, argv: list[str], out: str) -> None:
        try:
            done = run_capture(argv, timeout=INIT_TIMEOUT_S)
        except OSError as exc:
            self.post_message(ClusterFilesWritten(False, out, error=str(exc)))
            return
        if done.timed_out:
            self.post_message(ClusterFilesWritten(False, out, error=f"hwtui cluster init did not finish within {INIT_TIMEOUT_S} s"))
            return
        if done.code != 0:
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()] or [f"exit status {done.code}"]
            last = lines[-1].removeprefix("hwtui: ")
            self.post_message(ClusterFilesWritten(False, out, error=last, exists="already exists" in last))
            return
        try:
            answer = json.loads(done.stdout)
            self.post_message(ClusterFilesWritten(True, answer["out"], list(answer["files"]), dict(answer["commands"])))
        except (ValueError, KeyError, TypeError) as exc:
            self.post_message(ClusterFilesWritten(False, out, error=f"unexpected answer from hwtui cluster init: {exc}"))

    def on_cluster_files_written(self, msg: ClusterFilesWritten) -> None:
        files = self.query_one("#cluster-files", Static)
        if not msg.ok:
            if msg.exists:
                self._overwrite_ok = os.path.abspath(msg.out)
                text = f"{msg.error.split(':')[0]} already exists: ctrl+o again overwrites it"
            else:
                text = f"FAILED: {msg.error}"
            files.update(text)
            self.notify(text, severity="error" if not msg.exists else "warning")
            return
        self._overwrite_ok = ""
        self.query_one(LaunchCommands).show(msg.commands)
        files.update(f"wrote {msg.out}/: {', '.join(msg.files)}")
        self.notify(f"wrote {len(msg.files)} files in {msg.out}")

    def action_copy_command(self) -> None:
        row = self.query_one(LaunchCommands).current()
        if row is None:
            self.notify("no launch command yet: ctrl+o writes the files first")
            return
        self.app.copy_to_clipboard(row[1])
        self.notify(f"copied: {row[1]}", title=f"launch command ({row[0]})")

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
        if mode == "train":
            for fid, problem in _train_input_problems(values["train_model"], values["train_data"]):
                problems.append(problem)
                self.query_one(f"#in-{fid}", Input).add_class("-invalid")
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
        extra = engine_process.engine_extra_problem()
        if extra:
            self._show_problems([extra])
            return
        if self._mode()[0] == "cluster":
            values, _spec, problems = self.collect_cluster(need_nodes=False)
            if not self._show_problems(problems):
                return
            self._remember(values)
            self.post_message(RunRequested())
            return
        values, problems = self.collect()
        self.query_one("#problems", Static).update(Text("\n".join(problems)))  # plain: paths may hold [brackets]
        if problems:
            self.notify(escape(problems[0]), severity="error")
            return
        cfg = self.hw.config
        for key, value in values.items():
            setattr(cfg, key, value)
        self.hw.save_config()
        self.post_message(RunRequested())  # the app owns "a run is wanted"; the Run screen takes it when shown
