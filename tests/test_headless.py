"""probes/ and engine/ never import textual (the headless core), checked in a clean subprocess."""

import json
import pkgutil
import subprocess
import sys

import hwtui.engine
import hwtui.probes

SCRIPT = r"""
import importlib, json, sys
offenders, failed = [], {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception as exc:  # a module that needs an optional extra
        failed[name] = repr(exc)
        continue
    if "textual" in sys.modules:
        offenders.append(name)
        break
print(json.dumps({"offenders": offenders, "failed": failed}))
"""


def _modules(pkg):
    return [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]


def test_core_modules_do_not_import_textual():
    names = [hwtui.probes.__name__, hwtui.engine.__name__, *_modules(hwtui.probes), *_modules(hwtui.engine)]
    assert len(names) > 10
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(names)], capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["offenders"] == [], f"imports textual: {result['offenders']}"
    assert result["failed"] == {}, result["failed"]


def test_detection_does_not_import_torch():
    code = ("import sys; from hwtui.probes.host import FsHost; from hwtui.probes.pci import collect_pci; "
            "from hwtui.probes.devices import build_devices; build_devices(collect_pci(FsHost('/'))); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
