"""Step 1, Detect: every accelerator on the machine, of every vendor, as ``list-gpus`` shows it."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.widgets import Static

from hwtui.app.tui.messages import DevicesDetected
from hwtui.app.tui.screens._step import WizardStep
from hwtui.widgets.device_table import DeviceTable

# Two paragraphs, each one line of source text: the panel wraps them at its own width (a line break
# written mid-sentence left "in /dev or" alone on a line of a 100-column terminal).
NONE_FOUND = (
    "No accelerator found: no NVIDIA, AMD, Intel, Gaudi or TPU device answered on the PCI bus, in /dev or "
    "through its driver. That is a normal answer: replication and training run on CPU ranks over gloo.\n"
    "Expected one? The Drivers step says whether a driver or runtime is missing; `hwtui list-gpus --all` "
    "also lists devices passed through to a VM (vfio-pci), which this machine cannot use.")


class DetectScreen(WizardStep):
    STEP = "detect"
    DEFAULT_CSS = """
    DetectScreen #none-found { display: none; height: auto; }
    DetectScreen.-none #none-found { display: block; }
    DetectScreen.-none #devices { display: none; }
    """

    def compose_body(self) -> ComposeResult:
        yield Static("", id="status", classes="summary")
        yield DeviceTable(id="devices", classes="panel")
        # A table of headers alone said nothing on a CPU-only host: what no accelerator means, and
        # where to look if one was expected.
        yield Static(NONE_FOUND, id="none-found", classes="panel")
        yield Static("Devices marked unusable are listed with the reason; the Drivers step says how to fix it.\n"
                     "n: next step   r: detect again   ?: help", classes="hint")

    def on_mount(self) -> None:
        self.query_one(DeviceTable).border_title = "accelerators"
        self.query_one("#none-found").border_title = "accelerators"

    def action_rerun(self) -> None:
        self.set_status(f"detecting devices on {self.hw.host.description}...")
        self._detect()

    @work(thread=True, exclusive=True, group="detect", exit_on_error=False)
    def _detect(self) -> None:
        from hwtui.probes.inventory import detect_devices

        try:
            devices, _facts = detect_devices(self.hw.host)
            self.post_message(DevicesDetected(devices))
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            self.post_message(DevicesDetected([], f"{type(exc).__name__}: {exc}"))

    def on_devices_detected(self, msg: DevicesDetected) -> None:
        app = self.hw
        app.devices, app.devices_error = msg.devices, msg.error
        if msg.error:
            self.set_status(f"detection failed: {msg.error}")
        usable = [d for d in msg.devices if d.usable]
        vendors = sorted({d.vendor for d in msg.devices})
        if not msg.error:
            self.set_status(f"{len(msg.devices)} accelerator(s) on {app.host.description}: {len(usable)} usable"
                            + (f" ({', '.join(vendors)})" if vendors else " - the engine will run on CPU ranks"))
        self.query_one(DeviceTable).show(msg.devices)
        self.set_class(not msg.devices and not msg.error, "-none")
