"""One Python environment per GPU vendor: planned from the hardware, recorded in the config, checked.

A torch build drives one vendor (a CUDA wheel cannot touch an AMD or Intel card), so a box with an
RTX 4090, an RX 7800 XT and an Arc A750 needs three interpreters. ``hwtui setup`` creates them
(one virtualenv per vendor with the wheel that matches its driver) and records them under
``"environments"`` in ``$XDG_CONFIG_HOME/hwtui/config.json``; ``hwtui train`` starts each backend's
workers with its interpreter (``HWTUI_PYTHON_<BACKEND>`` still wins, for one-off overrides); the
check says, per device, which configured interpreter can drive it, or that none can.

The config file is shared with the TUI's remembered choices (app/tui/config.py), so it is read and
rewritten whole, keeping every key this module does not own. Reading goes through the host seam,
so ``--sysroot`` / ``--replay`` reproduce the verdicts.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwtui.core.finding import Finding, fail, passed, warn
from hwtui.core.redact import redact_text
from hwtui.probes.devices import Device, build_devices
from hwtui.probes.framework import Collector, Facts, Rule
from hwtui.probes.host import Host
from hwtui.probes.pci import pci_fact
from hwtui.probes.torchwheel import (
    INDEX_URL,
    ROCM_TAG,
    TORCH_RELEASE,
    TORCH_RELEASE_FOR_TAG,
    TorchBuild,
    describe_build,
    nvidia_capabilities,
    nvidia_driver_version,
    parse_version_py,
    pick_nvidia_tag,
)

CONFIG_SCHEMA = "hwtui.tui-config/1"  # the TUI's schema: one config file for the whole app
# Vendors a pip wheel exists for -> (backend the engine uses, torch build variant that drives it).
VENDORS = {"NVIDIA": ("cuda", "cuda"), "AMD": ("hip", "rocm"), "Intel": ("xpu", "xpu")}
# What the engine imports besides torch (pyproject's engine extra, minus torch itself).
ENGINE_DEPS = ("numpy>=1.26", "safetensors>=0.4", "xxhash>=3.4")


# -- the config file --------------------------------------------------------------------------------

def config_path(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CONFIG_HOME") or posixpath.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return posixpath.join(base, "hwtui", "config.json")


def envs_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_DATA_HOME") or posixpath.join(env.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return posixpath.join(base, "hwtui", "envs")


def parse_environments(text: str | None) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The ``environments`` table of a config file's text, and a problem if it cannot be used."""
    if text is None:
        return {}, None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return {}, f"not valid JSON: {exc}"
    if not isinstance(raw, dict):
        return {}, "not a JSON object"
    table = raw.get("environments") or {}
    if not isinstance(table, dict):
        return {}, "'environments' is not an object"
    out = {str(k): dict(v) for k, v in table.items() if isinstance(v, dict) and isinstance(v.get("python"), str)}
    return out, None


def load_environments(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Configured environments on this machine, by backend; {} when none or unreadable."""
    try:
        text = Path(config_path(os.environ if env is None else env)).read_text(encoding="utf-8")
    except OSError:
        return {}
    return parse_environments(text)[0]


def record_environments(entries: Mapping[str, Mapping[str, Any]], env: Mapping[str, str] | None = None) -> str:
    """Merge ``entries`` (by backend) into the config file atomically, keeping every other key."""
    from hwtui.core.atomic import atomic_write_text

    path = config_path(os.environ if env is None else env)
    try:
        current = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        current = {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be updated ({exc}); move it aside and run again") from None
    if not isinstance(current, dict):
        raise ValueError(f"{path} is not a JSON object; move it aside and run again")
    current.setdefault("schema", CONFIG_SCHEMA)
    table = dict(current.get("environments") or {})
    table.update({k: dict(v) for k, v in entries.items()})
    current["environments"] = table
    atomic_write_text(path, json.dumps(current, indent=2) + "\n")
    return path


def interpreter_for(backend: str, env: Mapping[str, str] | None = None, default: str | None = None) -> str:
    """The Python that runs ``backend``'s engine workers: HWTUI_PYTHON_<BACKEND>, the configured env, or ours."""
    import sys

    env = os.environ if env is None else env
    override = env.get(f"HWTUI_PYTHON_{backend.upper()}")
    if override:
        return override
    configured = load_environments(env).get(backend)
    if configured and os.access(configured["python"], os.X_OK):
        return str(configured["python"])
    return default or sys.executable


# -- planning `hwtui setup` -------------------------------------------------------------------------

@dataclass(frozen=True)
class EnvPlan:
    vendor: str
    backend: str
    tag: str
    path: str
    devices: tuple[str, ...]
    note: str = ""

    @property
    def python(self) -> str:
        return posixpath.join(self.path, "bin", "python")


def plan_environments(facts: Facts, base_dir: str, vendors: set[str] | None = None) -> list[EnvPlan]:
    """One environment per vendor with usable GPUs here, with the wheel tag its driver takes."""
    usable = [d for d in build_devices(pci_fact(facts)) if d.usable]
    plans = []
    for vendor, (backend, _variant) in VENDORS.items():
        devs = [d for d in usable if d.vendor == vendor]
        if not devs or (vendors and vendor not in vendors):
            continue
        note = ""
        if vendor == "NVIDIA":
            caps = [c for pci, c in nvidia_capabilities(facts).items() if any(d.pci == pci for d in devs)]
            driver = nvidia_driver_version(facts)
            tag, ok = pick_nvidia_tag(caps, driver)
            if not ok:
                note = f"driver {driver} is older than the {tag} wheel needs: upgrade the driver first"
        elif vendor == "AMD":
            tag = ROCM_TAG
        else:
            tag = "xpu"
        plans.append(EnvPlan(vendor, backend, tag, posixpath.join(base_dir, backend),
                             tuple(f"{d.device} {d.name}" for d in devs), note))
    return plans


def torch_requirement(tag: str, version: str | None = None) -> str:
    """The exact build: ``torch==2.9.1+rocm6.4``. A bare ``torch`` (or ``torch==2.9.1``, which PEP 440
    lets match any local label) takes whatever build any configured source offers: a find-links
    ``+cpu`` wheel had replaced the ROCm one."""
    return f"torch=={version or TORCH_RELEASE_FOR_TAG.get(tag, TORCH_RELEASE)}+{tag}"


@dataclass(frozen=True)
class Step:
    """One install step: its argv, whether it runs with the user's installer configuration set aside,
    and what it does in a few words (``hwtui setup``'s progress line names the step running)."""

    argv: list[str]
    isolated: bool = False
    what: str = ""


def commands_for(plan: EnvPlan, base_python: str, tool: str, hwtui_root: str, index_url: str = INDEX_URL,
                 deps_index_url: str | None = None, torch_version: str | None = None) -> list[Step]:
    """The exact steps that build ``plan``'s environment (uv when available, else venv + pip).

    torch comes first, pinned to the vendor's build and from the vendor's index only (the step is
    isolated: see ``isolated_env``), so neither a find-links wheel nor an extra index can supply
    another build and the engine's other packages never pull a default (CUDA) torch from PyPI;
    hwtui itself is linked in with a ``.pth`` file (the step is written by the caller) so the
    environment runs this very hwtui tree. The other packages keep the user's configuration (a
    mirror, a proxy): none of them depends on torch.
    """
    url = f"{index_url.rstrip('/')}/{plan.tag}"
    torch = torch_requirement(plan.tag, torch_version)
    deps_idx = ["--index-url", deps_index_url] if deps_index_url else []
    # No URL in these: a progress line is no place for an index's credentials.
    create, install_torch = "create the environment", f"install {torch} from the {plan.tag} index"
    install_deps = f"install {', '.join(ENGINE_DEPS)}"
    if tool == "uv":
        return [Step(["uv", "venv", "--python", base_python, plan.path], what=create),
                Step(["uv", "pip", "install", "--python", plan.python, torch, "--index-url", url], isolated=True,
                     what=install_torch),
                Step(["uv", "pip", "install", "--python", plan.python, *deps_idx, *ENGINE_DEPS], what=install_deps)]
    # The base interpreter's pip installs into the environment (pip >= 22.3 --python): no pip copy
    # per environment, and creating one takes 0.3 s instead of ensurepip's 10.
    return [Step([base_python, "-m", "venv", "--without-pip", plan.path], what=create),
            Step([base_python, "-m", "pip", "--python", plan.python, "install", torch, "--index-url", url], isolated=True,
                 what=install_torch),
            Step([base_python, "-m", "pip", "--python", plan.python, "install", *deps_idx, *ENGINE_DEPS], what=install_deps)]


# Installer variables that never add a package source: kept for the isolated torch step (a proxy's
# certificate, timeouts). Every other PIP_* / UV_* variable is set aside there, the source-adding
# ones (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL, UV_INDEX, ...) above all.
_KEPT_INSTALLER_VARS = frozenset({
    "PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT", "PIP_TIMEOUT", "PIP_RETRIES",
    "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_COLOR", "PIP_PROGRESS_BAR", "PIP_NO_INPUT", "PIP_CACHE_DIR", "PIP_NO_CACHE_DIR",
    "UV_CACHE_DIR", "UV_NO_CACHE", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS", "UV_NO_PROGRESS",
})


def isolated_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for the torch step: no pip or uv configuration file, no source-adding variable.

    ``PIP_CONFIG_FILE=os.devnull`` makes pip skip every configuration file (global, user, site);
    ``UV_NO_CONFIG=1`` does the same for uv.toml / pyproject settings. With the variables gone too,
    the ``--index-url`` on the command line is the only place torch can come from.
    """
    out = {k: v for k, v in env.items() if not k.startswith(("PIP_", "UV_")) or k in _KEPT_INSTALLER_VARS}
    out.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1")
    return out


def shell_line(step: Step | list[str]) -> str:
    """The step as a shell line, credentials in URLs masked (the real argv keeps them)."""
    argv = step.argv if isinstance(step, Step) else step
    line = shlex.join(argv)
    if isinstance(step, Step) and step.isolated:
        line = f"env PIP_CONFIG_FILE={shlex.quote(os.devnull)} UV_NO_CONFIG=1 {line}"
    return redact_text(line)


def check_index_url(option: str, url: str) -> str:
    """``url`` if it can be an index URL; ValueError (one line, credentials masked) if not.

    A control character or whitespace in a URL is never a real index: a newline would end the
    shown command early and smuggle a second line into every log that records it.
    """
    from urllib.parse import urlsplit

    at = next((i for i, c in enumerate(url) if not c.isprintable() or c.isspace()), None)
    if at is not None:
        # The URL itself is not echoed: a space or newline inside a password would split it where
        # the redactor looks for one credential, and show part of it.
        raise ValueError(f"{option}: the URL holds the control or space character {url[at]!r} at position {at + 1}; "
                         "give the URL without it")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"{option}: {redact_text(url)[:200]} is not a URL ({exc})") from None
    if parts.scheme not in ("https", "http", "file") or not (parts.netloc or parts.scheme == "file"):
        raise ValueError(f"{option}: {redact_text(url)[:200]} is not an http(s):// or file:// URL")
    return url


def record_entry(plan: EnvPlan, tool: str, torch: str | None = None, index_url: str | None = None) -> dict[str, Any]:
    entry = {"python": plan.python, "vendor": plan.vendor, "tag": plan.tag, "tool": tool,
             "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if torch:
        entry["torch"] = torch
    if index_url:
        entry["index_url"] = redact_text(index_url)  # the config file is no place for a password
    return entry


# -- the check: can some configured interpreter drive each device? --------------------------------

def _torch_build_under(host: Host, python: str) -> TorchBuild | None:
    """The torch build installed in the environment that ``python`` belongs to (its version.py)."""
    prefix = posixpath.dirname(posixpath.dirname(python))
    for libdir in ("lib", "lib64"):
        for pyver in host.listdir(posixpath.join(prefix, libdir)):
            if not pyver.startswith("python"):
                continue
            text = host.read_text(posixpath.join(prefix, libdir, pyver, "site-packages", "torch", "version.py"))
            if text is not None:
                return describe_build(parse_version_py(text))
    return None


def collect_vendor_envs(host: Host) -> dict[str, Any]:
    path = config_path(host.env)
    table, problem = parse_environments(host.read_text(path))
    configured = []
    for backend, entry in sorted(table.items()):
        python = entry["python"]
        configured.append({"backend": backend, "python": python, "source": path, "exists": host.exists(python),
                           "build": _torch_build_under(host, python), "tag": entry.get("tag")})
    for key, value in sorted(host.env.items()):
        if key.startswith("HWTUI_PYTHON_") and value:
            configured.append({"backend": key[len("HWTUI_PYTHON_"):].lower(), "python": value, "source": key,
                               "exists": host.exists(value), "build": _torch_build_under(host, value), "tag": None})
    return {"config": path, "problem": problem, "configured": configured}


def _drives(build: Mapping[str, Any] | None, vendor: str) -> bool:
    return bool(build and build.get("installed") and build.get("variant") == VENDORS[vendor][1])


def interpreter_findings(devices: list[Device], default_build: Mapping[str, Any] | None, default_python: str,
                         envs: Mapping[str, Any]) -> Iterator[Finding]:
    if envs.get("problem"):
        yield fail("torch.environments", f"{envs['config']}: {envs['problem']}", "hwtui ignores its environments.",
                   f"fix {envs['config']} or move it aside, then run: hwtui setup")
    for entry in envs.get("configured", []):
        if not entry["exists"]:
            yield fail(f"torch.environments[{entry['backend']}]", f"configured interpreter {entry['python']} does not exist",
                       f"from {entry['source']}", "hwtui setup  (recreates the environment)")
    gpus = [d for d in devices if d.usable and d.vendor in VENDORS]
    if len({d.vendor for d in gpus}) < 2 and not envs.get("configured"):
        return  # one vendor: torch.wheel.variant already says whether this interpreter drives it
    for dev in gpus:
        drivers = []
        if _drives(default_build, dev.vendor):
            drivers.append(f"{default_python} (this interpreter)")
        drivers += [f"{e['python']} ({e['source']})" for e in envs.get("configured", [])
                    if e["exists"] and _drives(e.get("build"), dev.vendor)]
        fid = f"torch.interpreter[{dev.device}]"
        if drivers:
            yield passed(fid, f"{dev.device} {dev.name}: driven by {drivers[0]}", "; ".join(drivers[1:]))
        else:
            backend, variant = VENDORS[dev.vendor]
            yield warn(fid, f"{dev.device} {dev.name}: no configured interpreter has a {variant.upper()} torch",
                       f"`hwtui train` cannot use it. This interpreter's torch is "
                       f"{(default_build or {}).get('version') or 'not installed'}; one torch build drives one vendor.",
                       f"hwtui setup --vendor {dev.vendor}  (or export HWTUI_PYTHON_{backend.upper()}=<python with a "
                       f"{variant} torch>)")


def vendor_env_rules(facts: Facts) -> Iterator[Finding]:
    host = facts.get("host") or {}
    devices = build_devices(pci_fact(facts))
    build = facts.get("torch_build")
    if build and build.get("not_recorded"):
        build = None
    yield from interpreter_findings(devices, build, host.get("python_executable") or "python3", facts["vendor_envs"])


COLLECTORS = [Collector("vendor_envs", collect_vendor_envs, "gpu", timeout=5.0)]
RULES = [Rule("vendor_envs", vendor_env_rules, "gpu", needs=("vendor_envs", "pci"))]
