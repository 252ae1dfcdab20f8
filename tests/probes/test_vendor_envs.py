"""Per-vendor environments: the plan, `hwtui setup`, the config record, and the per-device verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from hwtui.app.cli import main
from hwtui.core.finding import Status
from hwtui.probes import vendor_envs as ve
from hwtui.probes.catalog import catalog
from hwtui.probes.framework import collect, run_checks
from tests import cli_proc
from tests.probes import recorded
from tests.probes.recorded import PYTHON, version_py_text

CONFIG = "/home/alice/.config/hwtui/config.json"
ENV = {"HOME": "/home/alice"}


def check(fs, env=None):
    collectors, rules = catalog()
    wanted = ("pci", "host", "nvml", "torch_build", "vendor_envs")
    result = run_checks(fs.host({**ENV, **(env or {})}), [c for c in collectors if c.name in wanted],
                        [r for r in rules if r.name == "vendor_envs"])
    return {f.id: f for f in result.findings}


def venv_with_torch(fs, prefix, version, **consts):
    python = f"{prefix}/bin/python"
    fs.file(python, "")
    fs.file(f"{prefix}/lib/python3.12/site-packages/torch/version.py",
            version_py_text({"__version__": version, **consts}))
    return python


def test_mixed_host_with_cuda_torch_is_no_longer_a_silent_pass(tmp_path):
    got = check(recorded.mixed3(tmp_path))
    assert got["torch.interpreter[cuda:0]"].status == Status.PASS and PYTHON in got["torch.interpreter[cuda:0]"].title
    for dev, vendor, backend in (("hip:0", "AMD", "HIP"), ("xpu:0", "Intel", "XPU")):
        f = got[f"torch.interpreter[{dev}]"]
        assert f.status == Status.WARN, f
        assert f.remedy.startswith(f"hwtui setup --vendor {vendor}") and f"HWTUI_PYTHON_{backend}=" in f.remedy


def test_configured_environments_drive_the_other_vendors(tmp_path):
    fs = recorded.mixed3(tmp_path)
    hip = venv_with_torch(fs, "/home/alice/.local/share/hwtui/envs/hip", "2.8.0+rocm6.4", hip="6.4.1", rocm="6.4.1")
    fs.file(CONFIG, json.dumps({"schema": "hwtui.tui-config/1", "steps": 9,
                                "environments": {"hip": {"python": hip, "tag": "rocm6.4"},
                                                 "xpu": {"python": "/gone/bin/python", "tag": "xpu"}}}))
    xpu = venv_with_torch(fs, "/opt/xpu", "2.8.0+xpu", xpu="20250101")
    got = check(fs)
    assert got["torch.interpreter[hip:0]"].status == Status.PASS and hip in got["torch.interpreter[hip:0]"].title
    assert got["torch.environments[xpu]"].status == Status.FAIL
    assert got["torch.interpreter[xpu:0]"].status == Status.WARN
    got = check(fs, {"HWTUI_PYTHON_XPU": xpu})
    assert got["torch.interpreter[xpu:0]"].status == Status.PASS and "HWTUI_PYTHON_XPU" in got["torch.interpreter[xpu:0]"].title


def test_broken_config_file_is_named(tmp_path):
    fs = recorded.mixed3(tmp_path)
    fs.file(CONFIG, "{not json")
    f = check(fs)["torch.environments"]
    assert f.status == Status.FAIL and CONFIG in f.title


def test_plan_picks_each_vendors_wheel(tmp_path):
    fs = recorded.mixed3(tmp_path)
    collectors, _ = catalog()
    facts, _ = collect(fs.host(ENV), [c for c in collectors if c.name in ("pci", "nvml", "host")])
    plans = ve.plan_environments(facts, "/envs")
    assert [(p.vendor, p.backend, p.tag, p.python) for p in plans] == [
        ("NVIDIA", "cuda", "cu126", "/envs/cuda/bin/python"), ("AMD", "hip", "rocm6.4", "/envs/hip/bin/python"),
        ("Intel", "xpu", "xpu", "/envs/xpu/bin/python")]
    assert [p.vendor for p in ve.plan_environments(facts, "/envs", {"Intel"})] == ["Intel"]
    uv = ve.commands_for(plans[1], "/usr/bin/python3", "uv", "/src")
    assert uv[1].argv == ["uv", "pip", "install", "--python", "/envs/hip/bin/python", "torch==2.9.1+rocm6.4",
                          "--index-url", "https://download.pytorch.org/whl/rocm6.4"]
    assert [s.isolated for s in uv] == [False, True, False], "only the vendor index can supply torch"


def test_setup_dry_run_prints_exact_commands_and_writes_nothing(tmp_path, capsys, monkeypatch):
    recorded.mixed3(tmp_path / "tree")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    code = main(["setup", "--dry-run", "--sysroot", str(tmp_path / "tree"), "--tool", "pip", "--dir", "/e d",
                 "--python", "/usr/bin/python3"])
    out = capsys.readouterr()
    assert code == 0
    lines = [line for line in out.out.splitlines() if not line.startswith("#")]
    assert lines[:2] == ["/usr/bin/python3 -m venv --without-pip '/e d/cuda'",
                         "env PIP_CONFIG_FILE=/dev/null UV_NO_CONFIG=1 /usr/bin/python3 -m pip --python '/e d/cuda/bin/python' "
                         "install torch==2.9.1+cu126 --index-url https://download.pytorch.org/whl/cu126"]
    assert "torch==2.9.1+rocm6.4 --index-url https://download.pytorch.org/whl/rocm6.4" in out.out
    assert "torch==2.9.1+xpu --index-url https://download.pytorch.org/whl/xpu" in out.out
    assert "dry run" in out.err and not (tmp_path / "cfg").exists()
    assert not any(line.startswith("setup ") for line in out.out.splitlines()), "a dry run runs no step: no progress"


def test_record_keeps_the_tuis_choices_and_interpreter_precedence(tmp_path):
    from hwtui.app.tui.config import TuiConfig

    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = tmp_path / "hwtui" / "config.json"
    TuiConfig(steps=77).save(path)
    python = tmp_path / "py"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    ve.record_environments({"hip": {"python": str(python), "tag": "rocm6.4"}}, env)
    assert TuiConfig.load(path).steps == 77
    TuiConfig(steps=78).save(path)  # the wizard saving its choices keeps the environments
    assert ve.load_environments(env)["hip"]["tag"] == "rocm6.4"
    assert ve.interpreter_for("hip", env, default="/default") == str(python)
    assert ve.interpreter_for("hip", {**env, "HWTUI_PYTHON_HIP": "/override"}, default="/d") == "/override"
    assert ve.interpreter_for("xpu", env, default="/default") == "/default"
    python.chmod(0o644)  # a vanished or broken environment falls back instead of failing every worker
    assert ve.interpreter_for("hip", env, default="/default") == "/default"
    path.write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        ve.record_environments({"hip": {"python": "x"}}, env)


# -- a real install, against a fake local index (no network) --------------------------------------

def wheel(folder, name, version, files):
    """A pure wheel in ``folder/name/``, listed with every other wheel there in its index.html."""
    dist = f"{name}-{version}"
    path = folder / name / f"{dist}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(path.parent.glob("*.whl")))
    (folder / name / "index.html").write_text(f"<html><body>{links}</body></html>")


def torch_wheel(folder, version, origin):
    consts = {"__version__": version, "xpu": "20250101"} if version.endswith("+xpu") else {"__version__": version}
    wheel(folder, "torch", version, {"torch/__init__.py": "", "torch/version.py": version_py_text(consts),
                                     "torch/origin.py": f"ORIGIN = {origin!r}\n"})


def fake_indexes(tmp_path):
    """The vendor's xpu index (the one genuine build) and a deps index; returns the setup arguments."""
    torch_wheel(tmp_path / "whl" / "xpu", "2.99.0+xpu", "vendor")
    for name in ("numpy", "safetensors", "xxhash"):
        wheel(tmp_path / "pypi", name, "99.0", {f"{name}/__init__.py": ""})
    tree = tmp_path / "tree"
    recorded.arc_a770(tree)
    return ["setup", "--sysroot", str(tree), "--tool", "pip", "--dir", str(tmp_path / "envs"), "--torch-version", "2.99.0",
            "--deps-index-url", (tmp_path / "pypi").as_uri()]


def installed_torch(python):
    """What `train` will start for xpu workers (launcher.py asks interpreter_for): it imports this
    hwtui tree through the .pth, and which torch build, from where."""
    probe = subprocess.run([python, "-c", "import hwtui.probes.vendor_envs, torch.version as v, torch.origin as o; "
                                          "print(v.__version__, o.ORIGIN)"],
                           env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60)
    return probe.stdout.strip() or probe.stderr[-800:]


def test_setup_installs_the_exact_vendor_build_whatever_the_users_pip_configuration(tmp_path):
    """Issue 26: a find-links +cpu wheel replaced the vendor build. Here every source a user's pip
    configuration can add offers a competing torch (newer CPU builds, an impostor of the very
    version): setup still installs the vendor index's build, pinned, and records it."""
    args = fake_indexes(tmp_path)
    links, extra, conf_extra = tmp_path / "links", tmp_path / "extra", tmp_path / "conf-extra"
    torch_wheel(links, "3.0.0+cpu", "find-links")
    torch_wheel(links, "2.99.0+xpu", "impostor in find-links")
    torch_wheel(extra, "3.1.0+cpu", "extra index")
    torch_wheel(conf_extra, "3.2.0", "pip.conf extra index")
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text(f"[global]\nextra-index-url = {conf_extra.as_uri()}\nfind-links = {links / 'torch'}\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_CONFIG_FILE": str(pip_conf), "PIP_FIND_LINKS": str(links / "torch"),
           "PIP_EXTRA_INDEX_URL": extra.as_uri(), "UV_FIND_LINKS": str(links / "torch"), "UV_EXTRA_INDEX_URL": extra.as_uri()}
    proc = cli_proc.run([sys.executable, "-m", "hwtui", *args, "--index-url", (tmp_path / "whl").as_uri()],
                        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    python = str(tmp_path / "envs" / "xpu" / "bin" / "python")
    recorded_envs = ve.load_environments({"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert recorded_envs["xpu"]["python"] == python and recorded_envs["xpu"]["tag"] == "xpu"
    assert recorded_envs["xpu"]["torch"] == "2.99.0+xpu"
    assert ve.interpreter_for("xpu", {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == python
    assert installed_torch(python) == "2.99.0+xpu vendor"


def test_isolated_env_sets_every_source_adding_variable_aside():
    env = {"PATH": "/bin", "PIP_FIND_LINKS": "/opt/wheels", "PIP_EXTRA_INDEX_URL": "file:///x", "PIP_INDEX_URL": "file:///y",
           "PIP_CONFIG_FILE": "/home/a/pip.conf", "PIP_CONSTRAINT": "/c.txt", "PIP_CERT": "/ca.pem", "UV_INDEX": "x=file:///z",
           "UV_FIND_LINKS": "/w", "UV_CACHE_DIR": "/cache", "HTTPS_PROXY": "http://proxy:3128"}
    assert ve.isolated_env(env) == {"PATH": "/bin", "PIP_CERT": "/ca.pem", "UV_CACHE_DIR": "/cache",
                                    "HTTPS_PROXY": "http://proxy:3128", "PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1"}


# -- credentials in an index URL (issue 22 F7) --------------------------------------------------------

SECRET = "s3cretPW"


@pytest.fixture
def auth_index(tmp_path):
    """The fake indexes over HTTP on loopback, answering only with user:s3cretPW (basic auth)."""
    import base64
    import functools
    import http.server
    import threading

    fake_indexes(tmp_path)
    want = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization") or "")
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="idx"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://user:{SECRET}@127.0.0.1:{server.server_address[1]}/whl", seen, want
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_index_url_credentials_reach_pip_but_no_output_or_record(tmp_path, auth_index):
    url, seen, want = auth_index
    args = fake_indexes(tmp_path)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1"}
    dry = cli_proc.run([sys.executable, "-m", "hwtui", *args, "--index-url", url, "--dry-run"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "***REDACTED***@127.0.0.1" in dry.stdout, dry.stderr[-800:]
    proc = cli_proc.run([sys.executable, "-m", "hwtui", *args, "--index-url", url], env=env, capture_output=True,
                        text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert want in seen, "pip was given the real URL, credentials included"
    config = (tmp_path / "cfg" / "hwtui" / "config.json").read_text()
    for text in (dry.stdout, dry.stderr, proc.stdout, proc.stderr, config):
        assert SECRET not in text
    assert "***REDACTED***@127.0.0.1" in proc.stdout
    assert installed_torch(str(tmp_path / "envs" / "xpu" / "bin" / "python")) == "2.99.0+xpu vendor"


def test_a_failed_step_names_no_credentials(tmp_path, auth_index):
    url, _, _ = auth_index
    args = fake_indexes(tmp_path)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PIP_NO_INPUT": "1"}
    proc = cli_proc.run([sys.executable, "-m", "hwtui", *args, "--index-url", url.replace(SECRET, "wrong" + SECRET)],
                        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1 and "nothing was recorded" in proc.stderr.strip().splitlines()[-1]
    assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize("bad", ["https://idx/simple\nnext", "https://idx/\rsimple", "https://idx/\x1b]0;x\x07",
                                 "https://idx/ simple", "https://idx/\tsimple", "https://idx/\x00", "https://idx/\u2028",
                                 "https://user:s3cretPW@idx/\nsimple", "https://user:s3cr etPW@idx/", "https://user:s3cr\netPW@idx/",
                                 "ftp://idx/simple", "idx/simple", "https://"])
@pytest.mark.parametrize("option", ["--index-url", "--deps-index-url"])
def test_an_index_url_with_control_characters_or_no_scheme_is_refused(tmp_path, capsys, monkeypatch, bad, option):
    recorded.arc_a770(tmp_path / "tree")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    code = main(["setup", "--dry-run", "--sysroot", str(tmp_path / "tree"), option, bad])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hwtui: error: {option}"), out.err
    assert SECRET not in out.err and "s3cr" not in out.err and "etPW" not in out.err, out.err
    assert not (tmp_path / "cfg").exists()


@pytest.mark.parametrize("value", ["2.9", "2.9.1+cpu", "latest", "2.9.1\n", "", "1" * 5000],
                         ids=["release", "local-label", "word", "newline", "empty", "5000-digits"])
def test_torch_version_takes_a_release_only(tmp_path, capsys, value):
    recorded.arc_a770(tmp_path / "tree")
    code = main(["setup", "--dry-run", "--sysroot", str(tmp_path / "tree"), "--torch-version", value])
    out = capsys.readouterr()
    if value == "2.9":
        assert code == 0 and "torch==2.9+xpu" in out.out
    else:
        assert code == 2 and len(out.err.strip().splitlines()) == 1 and len(out.err) < 300


def test_a_failed_install_step_is_one_line_exit_1_and_records_nothing(tmp_path):
    (tmp_path / "whl" / "xpu").mkdir(parents=True)  # an index without torch
    tree = tmp_path / "tree"
    recorded.arc_a770(tree)
    cfg = tmp_path / "cfg"
    proc = cli_proc.run([sys.executable, "-m", "hwtui", "setup", "--sysroot", str(tree), "--tool", "pip",
                         "--dir", str(tmp_path / "envs"), "--index-url", (tmp_path / "whl").as_uri()],
                        env={**os.environ, "XDG_CONFIG_HOME": str(cfg)}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hwtui: error: `") and "exited with status" in last and "nothing was recorded" in last
    assert not cfg.exists() and not (tmp_path / "envs" / "xpu").exists()


# -- progress (issue 26): % of the steps run, the step named, no ETA ---------------------------------

def planned_steps(tmp_path):
    """The steps `hwtui setup` runs for fake_indexes' machine, as commands_for lists them, then the check."""
    fs = recorded.arc_a770(tmp_path / "plan-tree")
    collectors, _ = catalog()
    facts, _ = collect(fs.host(ENV), [c for c in collectors if c.name in ("pci", "nvml", "host")])
    [plan] = ve.plan_environments(facts, str(tmp_path / "envs"))
    torch = ve.torch_requirement(plan.tag, "2.99.0")
    steps = ve.commands_for(plan, sys.executable, "pip", "/src", torch_version="2.99.0")
    return plan, [f"{plan.vendor}: {s.what}" for s in steps] + [f"{plan.vendor}: check {torch}, link hwtui and record"]


def run_setup(tmp_path, *extra):
    args = fake_indexes(tmp_path)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    env.pop("NO_COLOR", None)
    return cli_proc.run([sys.executable, "-m", "hwtui", *args, "--index-url", (tmp_path / "whl").as_uri(), *extra],
                        env=env, capture_output=True, text=True, timeout=240)


def test_setup_progress_counts_the_steps_it_runs_in_plain_lines(tmp_path):
    plan, whats = planned_steps(tmp_path)
    proc = run_setup(tmp_path)  # stdout is a pipe: plain lines, one as each step starts
    assert proc.returncode == 0, proc.stderr[-2000:]
    n = len(whats)
    assert n == 4  # create, torch, the engine's packages, the check
    shown = [line for line in proc.stdout.splitlines() if line.startswith("setup ")]
    assert shown == [f"setup {100 * i // n:3d}%  step {i + 1}/{n}  {what}" for i, what in enumerate(whats)] + \
                    [f"setup 100%  {n}/{n} steps  done"], proc.stdout
    assert "ETA" not in proc.stdout and "\r" not in proc.stdout and "\x1b" not in proc.stdout
    out = proc.stdout.splitlines()  # the installer's output still comes through, under the step that printed it
    assert out.index(f"setup  25%  step 2/{n}  {whats[1]}") < out.index("Successfully installed torch-2.99.0+xpu") \
        < out.index(f"setup  50%  step 3/{n}  {whats[2]}")
    assert f"hwtui setup: Intel environment ready: {plan.python}" in proc.stderr


def test_setup_quiet_prints_only_the_result(tmp_path):
    plan, _ = planned_steps(tmp_path)
    proc = run_setup(tmp_path, "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ""  # no commands, no progress, no installer output
    assert proc.stderr == f"hwtui setup: Intel environment ready: {plan.python}\n"
    assert installed_torch(plan.python) == "2.99.0+xpu vendor"


def test_setup_quiet_failure_shows_the_failed_steps_output_then_the_error(tmp_path):
    planned_steps(tmp_path)
    proc = run_setup(tmp_path, "--torch-version", "2.98.0", "-q")  # the index has only 2.99.0
    assert proc.returncode == 1
    assert not any(line.startswith(("setup ", "#")) for line in proc.stdout.splitlines()), proc.stdout
    err = proc.stderr.strip().splitlines()
    assert any("No matching distribution found for torch==2.98.0+xpu" in line for line in err[:-1]), proc.stderr
    assert err[-1].startswith("hwtui: error: `") and "the output above says why" in err[-1]
    assert not (tmp_path / "envs" / "xpu").exists()


def test_setup_live_bar_gives_way_to_each_line_on_either_stream():
    """On a terminal both streams share the screen: a line to stderr erases the bar (on stdout) first."""
    import io

    from hwtui.app.commands.setup import SetupPrinter
    from hwtui.app.output.progress import LIVE

    screen: list[tuple[str, str]] = []

    class Stream(io.StringIO):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def write(self, s):
            screen.append((self.name, s))
            return len(s)

        def isatty(self):
            return True

    out, err = Stream("out"), Stream("err")
    printer = SetupPrinter(out, err, total=2, mode=LIVE)
    printer.start("Intel: create the environment")
    printer.relay("warning from pip\n", to_err=True)
    printer.start(f"Intel: install torch from https://user:{SECRET}@idx/")  # a label is redacted all the same
    printer.finish()
    bar0 = "setup [........................]   0%  step 1/2  Intel: create the environment"
    assert screen[:4] == [("out", "\r\x1b[K" + bar0), ("out", "\r\x1b[K"), ("err", "warning from pip\n"), ("out", bar0)]
    text = "".join(s for _, s in screen)
    assert SECRET not in text and "ETA" not in text
    assert text.endswith("\r\x1b[Ksetup [########################] 100%  2/2 steps  done\n")
