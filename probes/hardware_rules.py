"""Rules over the PCI, device-node, module and host facts.

Finding ids follow ``<area>.<check>`` with the subject in brackets when a check repeats per device
(``pci.link[0000:01:00.0]``), so CI can filter on the prefix and JUnit gets unique test names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hwtui.core.finding import Finding, Status, fail, passed, skip, warn
from hwtui.probes.devices import build_devices
from hwtui.probes.framework import Facts

GIB = 1024**3

_DRIVER_REMEDY = {
    "NVIDIA": "sudo apt install nvidia-driver-570 (or your distribution's nvidia driver package), then reboot",
    "AMD": "sudo modprobe amdgpu (install ROCm's amdgpu-dkms if the module is missing)",
    "Intel": "sudo modprobe xe (kernel 6.8+) or sudo modprobe i915",
    "Habana": "sudo modprobe habanalabs (install the Intel Gaudi software stack if missing)",
    "Google": "use a TPU VM image: the host must expose the TPU to the guest",
}


def _fmt_gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.0f} GiB"


def pci_rules(facts: Facts) -> Iterator[Finding]:
    pci = facts["pci"]
    devices = build_devices(pci)
    usable = [d for d in devices if d.usable]
    if not devices:
        yield passed("pci.inventory", "No accelerator on the PCI bus: the CPU engine (gloo) will be used")
    else:
        listing = "; ".join(f"{d.pci} {d.vendor} {d.name} ({d.driver or 'no driver'})" for d in devices)
        yield passed("pci.inventory", f"{len(usable)} usable accelerator(s) of {len(devices)} found", listing,
                     count=len(devices), usable=len(usable))
    raw_by_addr = {r["address"]: r for r in pci.get("devices", [])}
    for dev in devices:
        subject = f"[{dev.pci}]"
        if dev.usable:
            yield passed(f"pci.driver{subject}", f"{dev.vendor} {dev.name} bound to {dev.driver}")
        elif dev.driver == "vfio-pci":
            yield Finding(f"pci.driver{subject}", Status.WARN, f"{dev.vendor} {dev.name} is passed through (vfio-pci)",
                          "Reported but not counted: a VM owns it, this host cannot compute on it.",
                          f"To use it here: echo {dev.pci} | sudo tee /sys/bus/pci/drivers/vfio-pci/unbind && "
                          f"echo {dev.pci} | sudo tee /sys/bus/pci/drivers_probe")
        elif dev.driver == "nouveau":
            yield fail(f"pci.driver{subject}", f"{dev.name} is driven by nouveau, CUDA needs the nvidia driver",
                       "nouveau cannot run CUDA; torch.cuda.is_available() will be False.",
                       "echo 'blacklist nouveau' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf && "
                       "sudo update-initramfs -u && " + _DRIVER_REMEDY["NVIDIA"])
        else:
            yield fail(f"pci.driver{subject}", f"{dev.vendor} {dev.name}: {dev.reason}", "",
                       _DRIVER_REMEDY.get(dev.vendor, ""))
        yield from _link_findings(subject, dev.name, dev.driver, raw_by_addr[dev.pci].get("link", {}))


def _link_findings(subject: str, name: str, driver: str | None, link: dict[str, Any]) -> Iterator[Finding]:
    cur_gen, max_gen = link.get("cur_gen"), link.get("max_gen")
    cur_w, max_w = link.get("cur_width"), link.get("max_width")
    slot_gen, slot_w = link.get("slot_max_gen"), link.get("slot_max_width")
    fid = f"pci.link{subject}"
    if cur_gen is None or max_gen is None:
        yield skip(fid, f"{name}: PCIe link state not reported")
        return
    now = f"Gen{cur_gen} x{cur_w}"
    best = f"Gen{max_gen} x{max_w}"
    if cur_w and max_w and cur_w < max_w:
        yield warn(fid, f"{name} runs at x{cur_w}, below its x{max_w} link", f"link {now}, capable of {best}",
                   "Reseat the card in a full-width slot (check the board manual for lane sharing with M.2 slots)",
                   cur_gen=cur_gen, max_gen=max_gen, cur_width=cur_w, max_width=max_w)
    elif slot_gen and slot_gen < max_gen:
        yield warn(fid, f"{name} is limited by its slot to Gen{slot_gen}", f"card capable of {best}, slot max Gen{slot_gen}",
                   "Move the card to a CPU-attached slot of its own generation, or set the slot to Auto/Gen"
                   f"{max_gen} in the BIOS", cur_gen=cur_gen, max_gen=max_gen)
    elif slot_w and max_w and slot_w < max_w:
        yield warn(fid, f"{name} is limited by its slot to x{slot_w}", f"card capable of {best}",
                   "Move the card to a full-width slot", cur_width=cur_w, max_width=max_w)
    elif cur_gen < max_gen and driver in ("nvidia", "amdgpu", "i915", "xe"):
        yield passed(fid, f"{name} PCIe {now} (capable of {best})",
                     "GPUs lower their link speed when idle; this is normal unless it stays low under load.")
    elif cur_gen < max_gen:
        yield warn(fid, f"{name} runs at Gen{cur_gen}, below its Gen{max_gen} link", f"link {now}, capable of {best}",
                   "Check the slot's BIOS setting (PCIe speed: Auto) and reseat the card")
    else:
        yield passed(fid, f"{name} PCIe {now}")


def _nodes_matching(nodes: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [n for n in nodes if n["path"].startswith(prefix)]


def device_node_rules(facts: Facts) -> Iterator[Finding]:
    devices = [d for d in build_devices(facts["pci"]) if d.usable]
    nodes = facts["devnodes"]["nodes"]
    vendors = {d.vendor for d in devices}
    user = facts.host.user().name if facts.host else "$USER"
    checks: list[tuple[str, str, list[str]]] = []
    if "NVIDIA" in vendors:
        checks.append(("NVIDIA", "nvidia", ["/dev/nvidiactl", "/dev/nvidia-uvm"] +
                       [f"/dev/nvidia{d.index}" for d in devices if d.vendor == "NVIDIA"]))
    if "AMD" in vendors:
        checks.append(("AMD", "kfd", ["/dev/kfd"]))
    if vendors & {"AMD", "Intel"}:
        checks.append(("AMD/Intel", "render", [n["path"] for n in _nodes_matching(nodes, "/dev/dri/renderD")] or ["/dev/dri/renderD128"]))
    if "Habana" in vendors:
        checks.append(("Habana", "accel", [n["path"] for n in _nodes_matching(nodes, "/dev/accel/")] or ["/dev/accel/accel0"]))
    by_path = {n["path"]: n for n in nodes}
    for vendor, key, paths in checks:
        fid = f"devnodes.{key}"
        missing = [p for p in paths if p not in by_path]
        denied = [by_path[p] for p in paths if p in by_path and not by_path[p]["access"]]
        if missing:
            remedy = {"nvidia": "sudo nvidia-modprobe -u -c=0 (creates /dev/nvidia-uvm and /dev/nvidia0..N)",
                      "kfd": "sudo modprobe amdgpu; in a container add --device=/dev/kfd --device=/dev/dri",
                      "render": "in a container add --device=/dev/dri",
                      "accel": "sudo modprobe habanalabs; in a container add --device=/dev/accel"}[key]
            yield fail(fid, f"{vendor} device node(s) missing: {', '.join(missing)}", "", remedy, missing=missing)
        elif denied:
            groups = sorted({n["group"] for n in denied if n.get("group")}) or ["video", "render"]
            yield fail(fid, f"no access to {', '.join(n['path'] for n in denied)}",
                       f"owned by group(s) {', '.join(groups)}; user {user} is not a member",
                       f"sudo usermod -aG {','.join(groups)} {user} && log out and back in", groups=groups)
        else:
            yield passed(fid, f"{vendor} device nodes present and accessible", ", ".join(paths))


def module_rules(facts: Facts) -> Iterator[Finding]:
    modules = facts["modules"]["modules"]
    for name, info in modules.items():
        state = info.get("state")
        if state in ("live", "builtin"):
            continue
        yield warn(f"kernel.module[{name}]", f"kernel module {name} is {state}", "A module stuck loading or unloading "
                   "usually means its driver failed to initialise (dmesg says why).", f"sudo dmesg | grep -i {name}")
    if "nvidia" in modules and "nouveau" in modules:
        yield warn("kernel.nouveau_conflict", "both nouveau and nvidia modules are loaded", "",
                   "echo 'blacklist nouveau' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf && sudo update-initramfs -u && sudo reboot")
    loaded = ", ".join(f"{n} ({i.get('version') or i.get('state')})" for n, i in modules.items())
    yield passed("kernel.modules", "GPU kernel modules: " + (loaded or "none loaded"))


def host_rules(facts: Facts) -> Iterator[Finding]:
    info = facts["host"]
    py = info.get("python")
    if py:
        major, minor = (int(x) for x in py.split(".")[:2])
        if (major, minor) < (3, 10):
            yield fail("host.python", f"Python {py} is too old", "Current torch wheels need Python 3.10 or newer.",
                       "Create the environment with python3.11 -m venv .venv")
        else:
            yield passed("host.python", f"Python {py}", info.get("python_executable", ""))
    mem = info.get("mem_total")
    cpu = info.get("cpu_model") or "unknown CPU"
    yield passed("host.system", f"{info.get('cpu_logical') or '?'} CPUs ({cpu}), {_fmt_gib(mem)} RAM",
                 f"{info.get('os') or 'unknown OS'}, kernel {info.get('kernel') or '?'}"
                 + (f", container: {info['container']}" if info.get("container") else ""))
    shm = info.get("shm_total")
    if shm is None:
        yield skip("host.shm", "/dev/shm size not known")
    elif shm < 1 * GIB:
        yield warn("host.shm", f"/dev/shm is only {shm / 2**20:.0f} MiB",
                   "NCCL, gloo and DataLoader workers pass tensors through shared memory; 64 MiB (Docker's "
                   "default) makes multi-process jobs fail with bus errors.",
                   "docker run --shm-size=16g ... (or: sudo mount -o remount,size=16G /dev/shm)", shm_total=shm)
    else:
        yield passed("host.shm", f"/dev/shm is {_fmt_gib(shm)}")
