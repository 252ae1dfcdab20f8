"""``hwtui agent``: the resident per-node process (foreground; packaging/hwtui-agent.service runs it).

Serves this node's devices with live samples, the findings of the local check, processes per
device, the replication state and Prometheus text at /metrics (see hwtui.app.node_api.server), and
hosts the resident replication rank that ``hwtui push`` pushes into.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import re
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ssl is imported only when TLS is asked for
    import ssl

from hwtui.core.errors import EXIT_OK, HwtuiError
from hwtui.probes.distributed.replication_defaults import PERSIST_MODES

HELP = "run the node agent: an HTTP API (JSON + /metrics) and a resident receiver for `hwtui push`"
DEFAULT_PORT = 9477


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", metavar="HOST:PORT", default=f"127.0.0.1:{DEFAULT_PORT}",
                   help=f"address to serve on (default 127.0.0.1:{DEFAULT_PORT}: loopback only; "
                        "0.0.0.0:PORT serves every interface, and then every request needs the token)")
    p.add_argument("--token-file", metavar="FILE", help="bearer token file (created 0600 if missing; "
                   "default $XDG_CONFIG_HOME/hwtui/agent.token)")
    p.add_argument("--cert", metavar="PEM", help="serve HTTPS with this certificate chain (needs --key)")
    p.add_argument("--key", metavar="PEM", help="private key of --cert")
    p.add_argument("--node", metavar="NAME", help="this node's name in views and reports (default: host name)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="device sampling period (default 1 s)")
    p.add_argument("--check-interval", type=float, default=300.0, metavar="S",
                   help="how often the local check re-runs (default 300 s)")
    p.add_argument("--out", metavar="DIR", help="where the resident receiver keeps the versions it serves "
                   "(enables `hwtui push` into this node)")
    p.add_argument("--readers", type=int, metavar="N",
                   help="threads reading weight files when this node is a push's source, and when --device "
                        "loads the served version from disk, 1-64 (default: from the cores)")
    p.add_argument("--direct-io", choices=("auto", "on", "off"), default="auto",
                   help="read weight files with O_DIRECT as a push's source (auto: files larger than the free memory)")
    p.add_argument("--serve-group", metavar="GROUP",
                   help="with --out: the versions this node serves are 0640 (directories 0750) and owned by GROUP, "
                        "so a server running as another user of that group can read them (default: 0600, owner only)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="with --out: cuda keeps the served version in GPU memory too (two slots, switched at each "
                        "commit), exported to local serving processes by CUDA IPC (POST /v1/served/export); default cpu")
    p.add_argument("--persist", choices=PERSIST_MODES, default=None,
                   help="with --device cuda: when a pushed version's disk copy becomes durable. after-commit "
                        "(default): the vote waits for the verified device copy, the disk copy is fsynced and "
                        "switched to right after the push is reported (a power loss in between restarts this node "
                        "on the previous version; `hwtui push --resume` sends it again); before-vote: fsynced "
                        "before this node votes, as a disk-serving node does")
    p.add_argument("--advertise", metavar="ADDR", help="address other nodes reach this one's receiver at "
                   "(default: the --listen host, or the address that routes to the pusher)")
    p.add_argument("--install-unit", nargs="?", const="/etc/systemd/system/hwtui-agent.service", metavar="FILE",
                   help="write a hardened systemd unit that runs this agent (as a dynamic user, with this "
                        "interpreter's absolute path and these options) to FILE (default "
                        "/etc/systemd/system/hwtui-agent.service), then exit")


_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")
MAX_PEM = 1 << 20  # a certificate chain or a key is a few KB


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return True
    except ValueError:
        return len(host) <= 253 and _HOSTNAME.fullmatch(host) is not None


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if (not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 <= int(port) <= 65535
            or not _valid_host(host)):
        raise HwtuiError(f"--listen {value!r}: expected HOST:PORT, HOST an address or a host name "
                         f"(e.g. 127.0.0.1:{DEFAULT_PORT} or [::1]:{DEFAULT_PORT})")
    return host, int(port)


def _pem_fd(option: str, path: str) -> int:
    """An open descriptor of the regular file ``path`` (a FIFO would hang the load, a device never
    end it): checked without blocking (core.bounded_read), and loaded through the descriptor so the
    file checked is the file read."""
    from hwtui.core.bounded_read import open_regular

    try:
        fd, st = open_regular(path)
    except (OSError, ValueError) as exc:
        raise HwtuiError(f"{option} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if st.st_size > MAX_PEM:
        os.close(fd)
        raise HwtuiError(f"{option} {path}: larger than {MAX_PEM >> 10} KiB; not a PEM file")
    return fd


def _tls(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not (cert and key):
        raise HwtuiError("--cert and --key go together")
    import ssl

    def no_prompt() -> bytes:
        # OpenSSL would otherwise ask for the passphrase on the terminal: a service waits forever.
        raise HwtuiError(f"--key {key}: the key is encrypted; give the agent an unencrypted key (mode 0600)")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert_fd = _pem_fd("--cert", cert)
    try:
        key_fd = _pem_fd("--key", key)
        try:
            ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}", password=no_prompt)
        finally:
            os.close(key_fd)
    except (OSError, ssl.SSLError) as exc:
        raise HwtuiError(f"--cert {cert} / --key {key}: cannot load them ({exc})") from None
    finally:
        os.close(cert_fd)
    return ctx


def _install_unit(args: argparse.Namespace) -> int:
    """Write the systemd unit (app/node_api/unit.py) for an agent run by this interpreter; start nothing."""
    from hwtui.app.node_api import unit
    from hwtui.core.atomic import atomic_write_text

    if bool(args.cert) != bool(args.key):
        raise HwtuiError("--cert and --key go together")
    from hwtui.app.node_api.ifname import IfnameError, derive
    from hwtui.engine.cluster.local import interfaces

    try:
        # The unit runs with --out and none of this shell's environment: an agent it would start
        # must find its interface on its own, or it would refuse at every start (Restart= loop).
        derive(args.advertise or parse_listen(args.listen)[0], {}, interfaces())
    except IfnameError as exc:
        raise HwtuiError(str(exc)) from None
    try:
        unit.check_interpreter(sys.executable)
        text = unit.unit_text(sys.executable, args.listen, node=args.node, advertise=args.advertise, cert=args.cert,
                              key=args.key, readers=args.readers, direct_io=args.direct_io)
    except unit.UnitError as exc:
        raise HwtuiError(str(exc)) from None
    try:
        atomic_write_text(args.install_unit, text, perms=0o644)
    except OSError as exc:
        raise HwtuiError(f"--install-unit {args.install_unit}: {exc.strerror or exc} (writing under /etc needs root)") from None
    print(f"hwtui agent: wrote {args.install_unit}; start it with: systemctl daemon-reload && systemctl enable --now "
          f"{os.path.basename(args.install_unit)}")
    return EXIT_OK


def _pin_resident_interface(address: str) -> None:
    """The resident ranks (children, which inherit this environment) bind gloo/NCCL to the
    interface holding the address peers reach this node at (app/node_api/ifname.py), or the agent
    refuses to start with the fix: before, gloo took the host name's address and the first push
    failed with a truncated "connectFullMesh ... Connection refused"."""
    from hwtui.app.node_api.ifname import IfnameError, derive
    from hwtui.engine.cluster.local import interfaces

    try:
        iface = derive(address, os.environ, interfaces())
    except IfnameError as exc:
        raise HwtuiError(str(exc)) from None
    if iface:
        print(f"hwtui agent: resident ranks use interface {iface} (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) for {address}",
              file=sys.stderr)


def device_slots(device: str, out: str | None, env: dict[str, str] | None = None,
                 build: dict[str, str | None] | None = None) -> str | None:
    """What holds the served version's device copy: None (``--device cpu``), "cuda", or the memfd
    stand-in "host" under the test-only ``HWTUI_TEST_IPC=host`` (as the IPC path's tests do).

    ``--device cuda`` where this torch cannot drive a GPU, or none is visible, is one line (exit 2)
    naming the fix: the same torch-build check as ``hwtui replicate --device cuda``, torch not imported."""
    from hwtui.engine.replication.ipc_path import TEST_ENV
    from hwtui.engine.replication.transport import torch_build, validate_device, visible_nvidia_gpus

    if device == "cpu":
        return None
    if not out:
        raise HwtuiError("--device cuda goes with --out (the served version is kept on disk and in GPU memory)")
    env = env if env is not None else dict(os.environ)
    if env.get(TEST_ENV) == "host":
        return "host"
    build = build if build is not None else torch_build()
    validate_device("cuda", build)
    if not build.get("hip") and not visible_nvidia_gpus(env):
        raise HwtuiError("--device cuda: no NVIDIA GPU is visible here (no driver under /proc/driver/nvidia/gpus, "
                         "or CUDA_VISIBLE_DEVICES hides every GPU): install the NVIDIA driver or make a GPU visible, "
                         "or run the agent with --device cpu")
    return "cuda"


def run(args: argparse.Namespace) -> int:
    from hwtui.app.host_args import host_from_args
    from hwtui.app.node_api.server import AgentServer, serve_in_thread
    from hwtui.app.node_api.token import default_token_file, load_or_create
    from hwtui.engine.resident.sources import check_source, facts_source, sampler_source
    from hwtui.engine.resident.state import NodeState

    host_addr, port = parse_listen(args.listen)
    if args.readers is not None:
        from hwtui.engine.replication.reader import check_readers

        check_readers(args.readers)
    if args.serve_group is not None:
        if args.install_unit:
            # The unit's dynamic user keeps its versions in a StateDirectory no other user can enter
            # (/var/lib/private, 0700): a group there could read nothing. Said, not silently dropped.
            raise HwtuiError("--serve-group does not go with --install-unit: the unit's dynamic user keeps what it "
                             "serves private; run the agent as a service user of your own to serve a group")
        from hwtui.engine.replication.served_files import serve_modes

        if not args.out:
            raise HwtuiError("--serve-group goes with --out (it sets who may read the versions this node serves)")
        serve_modes(args.serve_group)  # an unknown group is one line, exit 2, before anything starts
    if args.install_unit and args.device != "cpu":
        raise HwtuiError("--device cuda does not go with --install-unit (the unit does not carry it yet); "
                         "run the agent with --device cuda directly")
    slots = device_slots(args.device, args.out)
    if args.persist is not None and args.device != "cuda":
        raise HwtuiError("--persist goes with --device cuda (a node serving from disk makes its copy durable "
                         "before it votes)")
    if args.install_unit:
        return _install_unit(args)
    if args.out:
        _pin_resident_interface(args.advertise or host_addr)
    for name in ("interval", "check_interval"):
        value = getattr(args, name)
        if not 0.05 <= value <= 86400:
            raise HwtuiError(f"--{name.replace('_', '-')} {value}: expected 0.05 to 86400 seconds")
    tls = _tls(args.cert, args.key)
    token_path = args.token_file or str(default_token_file())
    token, created = load_or_create(token_path)
    host = host_from_args(args)
    node = args.node or socket.gethostname()

    resident = None
    post_routes = {}
    replication = None
    if args.out:
        from hwtui.app.node_api.push_routes import make_routes
        from hwtui.engine.rank_fork import start_fork_server
        from hwtui.engine.resident.resident import ResidentRank

        # Before any thread: the fork server is a single-threaded twin of this process with torch
        # imported, which forks each resident rank (a process with threads must not fork one).
        if (why := start_fork_server(slots)) is not None and getattr(args, "verbosity", 0) > 0:
            print(f"hwtui agent: resident ranks are exec'd, not forked: {why}", file=sys.stderr)

        resident = ResidentRank(node=node, out=args.out, advertise=args.advertise or host_addr,
                                serve_group=args.serve_group, readers=args.readers, direct_io=args.direct_io,
                                device_slots=slots, persist=args.persist or PERSIST_MODES[0])
        post_routes = make_routes(resident)
        replication = resident.state

    state = NodeState(node=node, sample=sampler_source(host), check=check_source(host), facts=facts_source(),
                      replication=replication, sample_period=args.interval, check_period=args.check_interval)
    try:
        server = AgentServer((host_addr, port), state, token, tls=tls, post_routes=post_routes)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise HwtuiError(f"--listen {args.listen}: port {port} is already in use (another agent?)") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise HwtuiError(f"--listen {args.listen}: {host_addr} is not an address of this machine") from None
        raise HwtuiError(f"--listen {args.listen}: {exc.strerror or exc}") from None
    state.start()
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve_in_thread(server)
    scheme = "https" if tls else "http"
    shown = f"[{host_addr}]" if ":" in host_addr else host_addr
    if created:
        print(f"hwtui agent: created the token file {token_path} (mode 0600)", file=sys.stderr)
    # One machine-readable line on stdout: tests and wrappers read the port (--listen HOST:0).
    print(f"hwtui agent: node {node} listening on {scheme}://{shown}:{server.port}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        state.stop()
        if resident is not None:
            resident.close()
    return EXIT_OK
