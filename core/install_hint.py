"""The one command that adds a missing extra, in the words of the installer hwtui came with.

In core (pure: reads only where this interpreter lives) so the CLI, the TUI and the engine's own
errors (torch missing on a rank's node) say the same.

A ``pip install "hwtui[engine]"`` printed to someone who ran ``uv tool install hwtui`` or ``pipx
install hwtui`` installs into the wrong Python (or fails: uv's tool environments have no pip).
Which installer made this environment is read from where the interpreter lives: uv keeps tools
under ``$UV_TOOL_DIR`` (default ``~/.local/share/uv/tools/<name>``), pipx under
``$PIPX_HOME/venvs/<name>`` (default ``~/.local/share/pipx/venvs`` or ``~/.local/pipx/venvs``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# What each extra brings, for `pipx inject` (which takes packages, not an extra of the injected app).
# Read from the installed metadata when there is one; this copy answers in a clone without it.
_EXTRA_FALLBACK = {
    "engine": ["torch>=2.4", "safetensors>=0.4", "xxhash>=3.4", "numpy>=1.26"],
    "agent": ["httpx>=0.27", "sniffio>=1.3"],
}


def _under(path: str, root: str | None) -> bool:
    if not root:
        return False
    root = os.path.abspath(os.path.expanduser(root)).rstrip("/") + "/"
    return (os.path.abspath(path).rstrip("/") + "/").startswith(root)


def installer(prefix: str | None = None, executable: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """"uv-tool", "pipx" or "pip" for the environment at ``prefix`` (default: this interpreter's)."""
    env = os.environ if env is None else env
    paths = [p for p in (prefix if prefix is not None else sys.prefix,
                         executable if executable is not None else sys.executable) if p]
    for p in paths:
        norm = p.replace(os.sep, "/")
        if "/uv/tools/" in norm or _under(p, env.get("UV_TOOL_DIR")):
            return "uv-tool"
        if "/pipx/venvs/" in norm or _under(p, os.path.join(env["PIPX_HOME"], "venvs") if env.get("PIPX_HOME") else None):
            return "pipx"
    return "pip"


def _extra_requirements(extra: str) -> list[str]:
    try:
        from importlib.metadata import PackageNotFoundError, requires

        reqs = requires("hwtui") or []
    except (ImportError, PackageNotFoundError):
        reqs = []
    out = []
    for r in reqs:
        req, _, marker = r.partition(";")
        if marker and f'extra == "{extra}"' in marker.replace("'", '"'):
            out.append(req.strip().replace(" ", ""))
    return out or list(_EXTRA_FALLBACK.get(extra, []))


def install_command(extra: str, prefix: str | None = None, executable: str | None = None,
                    env: Mapping[str, str] | None = None) -> str:
    """The exact command that adds ``extra`` to this hwtui, quoted for a POSIX shell."""
    kind = installer(prefix, executable, env)
    if kind == "uv-tool":
        # uv re-resolves the tool's environment when its requirement changes (an extra added).
        return f'uv tool install "hwtui[{extra}]"'
    if kind == "pipx":
        reqs = _extra_requirements(extra)
        if reqs:
            return "pipx inject hwtui " + " ".join(f'"{r}"' for r in reqs)
        return f'pipx install --force "hwtui[{extra}]"'
    return f'pip install "hwtui[{extra}]"'


__all__ = ["installer", "install_command"]
