"""The systemd unit for `hwtui agent`, written by `hwtui agent --install-unit`.

Why generated rather than only shipped: the unit's ExecStart must name the interpreter of the
environment hwtui is installed in, by absolute path (``/usr/bin/env hwtui`` depends on whatever
PATH systemd has, and a venv is never on it). The install command knows that path; a static file
cannot.

The agent runs as a transient user (``DynamicUser=yes``), never root: what it needs is its state
directory (``StateDirectory=``: the token and the versions it serves, kept across restarts and
owned by that user), a cache for torch, TCP sockets, netlink (interface addresses), and the GPU
device nodes (so no ``PrivateDevices=``, no ``DeviceAllow=`` list, no ``ProtectClock=``, which
implies one, and ``video``/``render`` as supplementary groups for AMD and Intel render nodes).
Everything else is taken away; ``systemd-analyze security`` rates the result about 2 (OK).

``ProtectHome=yes`` hides /home, /root and /run/user from the service, so an interpreter that
lives there could not even start: the installer refuses it with the fix instead of writing a unit
that fails on boot.
"""

from __future__ import annotations

import os
import re

UNIT_NAME = "hwtui-agent.service"
DEFAULT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
STATE = "/var/lib/hwtui-agent"  # StateDirectory=hwtui-agent
CACHE = "/var/cache/hwtui-agent"  # CacheDirectory=hwtui-agent
TOKEN = f"{STATE}/agent.token"
SERVED = f"{STATE}/served"
# Paths the sandbox hides (ProtectHome=yes, PrivateTmp=yes): an interpreter there cannot run.
HIDDEN = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")

# Hardening, in the order written. Each line is one the agent can live with (see the docstring).
HARDENING = (
    "DynamicUser=yes",
    "SupplementaryGroups=video render",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateMounts=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectHostname=yes",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "RemoveIPC=yes",
    "KeyringMode=private",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged @resources @mount @debug @cpu-emulation @obsolete @raw-io @reboot @swap @module",
    "SystemCallErrorNumber=EPERM",
)

_PLAIN = re.compile(r"[A-Za-z0-9_./:@=,+\[\]-]+")


class UnitError(ValueError):
    """The unit cannot be written as asked; the message says why and what to do."""


def quote(arg: str) -> str:
    """One ExecStart argument: systemd expands ``%`` specifiers and ``$VARS`` and splits on
    whitespace, so anything but plain characters is double-quoted with those escaped."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
        raise UnitError(f"{arg!r}: a control character cannot go into a systemd unit")
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _credential(name: str, path: str) -> str:
    path = os.path.abspath(path)
    quote(path)  # refuses control characters
    return f"LoadCredential={name}:{path.replace('%', '%%')}"


def check_interpreter(python: str) -> None:
    """Refuse an interpreter the sandbox would hide (by its own path or the one it links to)."""
    for path in dict.fromkeys([os.path.abspath(python), os.path.realpath(python)]):
        hidden = next((h for h in HIDDEN if path == h or path.startswith(h + "/")), None)
        if hidden:
            raise UnitError(f"the agent's interpreter {path} is under {hidden}, which the unit hides from the service "
                            "(ProtectHome/PrivateTmp): install hwtui outside it, e.g. python3 -m venv /opt/hwtui && "
                            "/opt/hwtui/bin/pip install 'hwtui[agent]', then run /opt/hwtui/bin/hwtui agent --install-unit")


def unit_text(python: str, listen: str, *, node: str | None = None, advertise: str | None = None,
              cert: str | None = None, key: str | None = None, readers: int | None = None,
              direct_io: str = "auto") -> str:
    """The unit for an agent run by ``python`` (absolute) serving ``listen``; ``readers`` and
    ``direct_io`` are the agent's defaults for the pushes it sources (given: carried into ExecStart)."""
    if not os.path.isabs(python):
        raise UnitError(f"the interpreter {python!r} must be an absolute path")
    argv = [python, "-m", "hwtui", "agent", "--listen", listen, "--token-file", TOKEN, "--out", SERVED]
    creds = []
    if node:
        argv += ["--node", node]
    if advertise:
        argv += ["--advertise", advertise]
    if readers is not None:
        argv += ["--readers", str(int(readers))]
    if direct_io != "auto":
        argv += ["--direct-io", direct_io]
    if cert and key:
        # The dynamic user cannot read the operator's key where it lies: systemd hands a copy to the
        # service in its private credentials directory (%d), readable by it alone.
        creds = [_credential("agent.crt", cert), _credential("agent.key", key)]
        argv += ["--cert", "%d/agent.crt", "--key", "%d/agent.key"]
    exec_start = " ".join(quote(a) if "%d/" not in a else a for a in argv)
    lines = [
        "# hwtui node agent, written by `hwtui agent --install-unit` (regenerate rather than edit).",
        "#   sudo systemctl daemon-reload && sudo systemctl enable --now hwtui-agent",
        f"# The token is created on first start in {TOKEN} (mode 0600; as root read it through",
        "# /var/lib/private/hwtui-agent/agent.token); clients on other hosts need it.",
        "[Unit]",
        "Description=hwtui node agent (GPU view, local check, resident weight receiver)",
        "Documentation=https://github.com/hwtui/hwtui/blob/main/docs/agent.md",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={exec_start}",
        *creds,
        "StateDirectory=hwtui-agent",
        "StateDirectoryMode=0700",
        "CacheDirectory=hwtui-agent",
        "CacheDirectoryMode=0700",
        f"Environment=HOME={STATE} XDG_CACHE_HOME={CACHE}",
        "UMask=0077",
        "Restart=on-failure",
        "RestartSec=2",
        "# SIGTERM stops it cleanly: a push in flight aborts and every rank keeps its served version.",
        "KillMode=mixed",
        "TimeoutStopSec=20",
        *HARDENING,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"
