"""Grammars of the environment variables and files the distributed checks read.

Every parser takes any string and returns a result with a ``problems`` list; none raises. The
rules decide how serious a problem is (a typo in NCCL_DEBUG is a warning, a RANK that is not a
number is a failure). The grammars follow what the consuming library really does, not what its
manual says it should: NCCL's interface lists are prefix matches unless ``=``, CUDA stops reading
CUDA_VISIBLE_DEVICES at the first entry it cannot parse, and torch calls ``int()`` on RANK.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

_INT = re.compile(r"[+-]?[0-9]+")
# More digits than any setting needs, far fewer than Python's int() limit (4300): a 5,000-digit
# MASTER_PORT is a clean "out of range", never a ValueError from int().
MAX_INT_DIGITS = 40


# -- integers -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class IntValue:
    raw: str
    value: int | None
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.value is not None and not self.problems


def parse_int(raw: str, name: str = "value", lo: int | None = None, hi: int | None = None) -> IntValue:
    """A decimal integer within [lo, hi]. ASCII digits only: bash arithmetic and SLURM agree on those."""
    text = raw.strip()
    if not text:
        return IntValue(raw, None, (f"{name} is empty",))
    if not _INT.fullmatch(text):
        return IntValue(raw, None, (f"{name}={_show(raw)} is not an integer",))
    if len(text.lstrip("+-").lstrip("0")) > MAX_INT_DIGITS:
        return IntValue(raw, None, (f"{name}={_show(raw)} has more than {MAX_INT_DIGITS} digits: out of range",))
    value = int(text)
    problems: list[str] = []
    if text != raw:
        problems.append(f"{name}={_show(raw)} has surrounding whitespace")
    if lo is not None and value < lo:
        problems.append(f"{name}={value} is below {lo}")
    if hi is not None and value > hi:
        problems.append(f"{name}={value} is above {hi}")
    return IntValue(raw, value, tuple(problems))


def parse_port(raw: str, name: str = "MASTER_PORT") -> IntValue:
    return parse_int(raw, name, 1, 65535)


def parse_switch(raw: str, name: str) -> IntValue:
    """NCCL's integer switches (NCCL_IB_DISABLE=1): read with strtoll, anything else is ignored."""
    return parse_int(raw, name)


def parse_positive_mb(raw: str, name: str, hi: int = 1 << 20) -> IntValue:
    return parse_int(raw, name, 1, hi)


@dataclass(frozen=True)
class NumberValue:
    raw: str
    value: float | None
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.value is not None and not self.problems


def parse_positive_number(raw: str, name: str, hi: float = float(1 << 20)) -> NumberValue:
    """A positive decimal (HOTWEIGHTS_BCAST_CHUNK_MB=0.5): what the engine's float() accepts, finite."""
    text = raw.strip()
    if not re.fullmatch(r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
        return NumberValue(raw, None, (f"{name}={_show(raw)} is not a number",))
    value = float(text)
    if not value > 0:
        return NumberValue(raw, None, (f"{name}={_show(raw)} must be positive",))
    if value > hi:
        return NumberValue(raw, None, (f"{name}={_show(raw)} is above {hi:g}",))
    return NumberValue(raw, value)


MAX_PROBLEMS = 20


def _capped(problems: list[str]) -> tuple[str, ...]:
    """At most MAX_PROBLEMS messages: a 100 KB list with 50,000 bad entries is one finding, not a book."""
    if len(problems) <= MAX_PROBLEMS:
        return tuple(problems)
    return (*problems[:MAX_PROBLEMS], f"... and {len(problems) - MAX_PROBLEMS} more problems")


def _show(raw: str, limit: int = 40) -> str:
    """A value quoted for a message: repr keeps control characters visible, length is capped."""
    text = repr(raw[:limit])  # repr of the head only: the value may be a megabyte
    return text if len(text) <= limit else text[: limit - 4] + "...'"


# -- MASTER_ADDR ----------------------------------------------------------------------------------

_HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


@dataclass(frozen=True)
class HostValue:
    raw: str
    host: str | None  # what to resolve (brackets stripped), None when unusable
    kind: str  # "ipv4", "ipv6", "name" or "invalid"
    problems: tuple[str, ...] = ()
    suggestion: str | None = None  # a corrected value when the mistake is a common one

    @property
    def is_loopback(self) -> bool:
        if self.kind in ("ipv4", "ipv6") and self.host:
            return ipaddress.ip_address(self.host).is_loopback
        return (self.host or "").lower() in ("localhost", "localhost.localdomain", "ip6-localhost")


def parse_host(raw: str, name: str = "MASTER_ADDR") -> HostValue:
    """A host name or address as torch's env:// rendezvous takes it (no scheme, no port)."""
    text = raw.strip()
    if not text:
        return HostValue(raw, None, "invalid", (f"{name} is empty",))
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://(.*)$", text)
    if m:
        rest = m.group(1).rstrip("/")
        inner = parse_host(re.sub(r":\d+$", "", rest) if not rest.startswith("[") else rest.split("]")[0] + "]", name)
        return HostValue(raw, None, "invalid", (f"{name}={_show(raw)} is a URL; torch expects a bare host name or address",),
                         inner.host)
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text)
        problems = (f"{name}={_show(raw)} has surrounding whitespace",) if raw != raw.strip() else ()
        return HostValue(raw, str(addr), "ipv4" if addr.version == 4 else "ipv6", problems)
    except ValueError:
        pass
    m = re.fullmatch(r"(.+):(\d{1,5})", text)
    if m and ":" not in m.group(1):
        inner = parse_host(m.group(1), name)
        return HostValue(raw, None, "invalid",
                         (f"{name}={_show(raw)} includes a port; the port goes in MASTER_PORT",), inner.host)
    if _HOSTNAME.fullmatch(text):
        problems = (f"{name}={_show(raw)} has surrounding whitespace",) if raw != raw.strip() else ()
        return HostValue(raw, text.rstrip("."), "name", problems)
    return HostValue(raw, None, "invalid", (f"{name}={_show(raw)} is neither a host name nor an IP address",))


# -- NCCL interface and HCA lists -----------------------------------------------------------------

@dataclass(frozen=True)
class ListEntry:
    name: str
    port: int | None = None  # None: any port


@dataclass(frozen=True)
class NcclList:
    """NCCL_SOCKET_IFNAME / NCCL_IB_HCA: ``[^][=]name[:port],...``.

    ``^`` inverts the whole list (these are exclusions), ``=`` makes every name exact, otherwise a
    name is a prefix: ``eth`` matches ``eth0`` and ``mlx5_1`` also matches ``mlx5_10``.
    """

    raw: str
    entries: tuple[ListEntry, ...]
    exclude: bool = False
    exact: bool = False
    problems: tuple[str, ...] = ()

    def matches(self, name: str, port: int | None = None) -> bool:
        hit = any(self._entry_matches(e, name, port) for e in self.entries)
        return not hit if self.exclude else hit

    def _entry_matches(self, entry: ListEntry, name: str, port: int | None) -> bool:
        named = entry.name == name if self.exact else name.startswith(entry.name)
        return named and (entry.port is None or port is None or entry.port == port)

    def entry_hits(self, entry: ListEntry, names: list[str]) -> list[str]:
        return [n for n in names if (n == entry.name if self.exact else n.startswith(entry.name))]


def parse_nccl_list(raw: str, name: str, with_ports: bool = True) -> NcclList:
    text = raw.strip()
    problems: list[str] = []
    if text != raw:
        problems.append(f"{name} has surrounding whitespace; NCCL does not strip it")
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    entries: list[ListEntry] = []
    for part in text.split(","):
        if not part:
            continue
        if part.startswith(("^", "=")):
            problems.append(f"{name}: {part[0]!r} only counts at the start of the list, not before {_show(part)}")
        if any(c.isspace() for c in part):
            problems.append(f"{name}: entry {_show(part)} contains whitespace")
        port: int | None = None
        if ":" in part:
            base, _, port_text = part.partition(":")
            p = parse_int(port_text, f"{name} port")
            if not with_ports:
                problems.append(f"{name}: {_show(part)} has a ':port' suffix, which this variable does not use")
            elif p.value is None or p.value < 1:
                problems.append(f"{name}: port in {_show(part)} is not a positive integer")
            else:
                port = p.value
            part = base
        if not part:
            problems.append(f"{name}: an entry has no name")
            continue
        entries.append(ListEntry(part, port))
    if not entries:
        problems.append(f"{name}={_show(raw)} names nothing")
    return NcclList(raw, tuple(entries), exclude, exact, _capped(problems))


# -- NCCL_DEBUG and NCCL_DEBUG_SUBSYS -------------------------------------------------------------

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
NCCL_SUBSYSTEMS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL", "PROXY", "NVLS",
                   "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL")


@dataclass(frozen=True)
class Choice:
    raw: str
    value: str | None  # canonical spelling, None when not one of the choices
    problems: tuple[str, ...] = ()


def parse_choice(raw: str, name: str, choices: tuple[str, ...], case_sensitive: bool = False) -> Choice:
    text = raw.strip()
    for c in choices:
        if text == c or (not case_sensitive and text.upper() == c.upper()):
            problems = (f"{name}={_show(raw)} has surrounding whitespace",) if text != raw else ()
            return Choice(raw, c, problems)
    return Choice(raw, None, (f"{name}={_show(raw)} is not one of {', '.join(choices)}",))


def parse_nccl_debug(raw: str) -> Choice:
    return parse_choice(raw, "NCCL_DEBUG", NCCL_DEBUG_LEVELS)


@dataclass(frozen=True)
class SubsysValue:
    raw: str
    names: tuple[str, ...]
    exclude: bool
    unknown: tuple[str, ...]
    problems: tuple[str, ...] = ()


def parse_nccl_debug_subsys(raw: str) -> SubsysValue:
    text = raw.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    names: list[str] = []
    unknown: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        (names if part.upper() in NCCL_SUBSYSTEMS else unknown).append(part.upper() if part.upper() in NCCL_SUBSYSTEMS else part)
    problems = [f"NCCL_DEBUG_SUBSYS: unknown subsystem(s) {', '.join(_show(u) for u in unknown)}"] if unknown else []
    if not names and not unknown:
        problems.append("NCCL_DEBUG_SUBSYS names no subsystem")
    return SubsysValue(raw, tuple(names), exclude, tuple(unknown), _capped(problems))


# -- device visibility masks ----------------------------------------------------------------------

@dataclass(frozen=True)
class VisibleEntry:
    index: int | None = None  # device ordinal
    uuid: str | None = None  # GPU-..., MIG-..., or a ROCr UUID
    sub: int | None = None  # ZE_AFFINITY_MASK sub-device (tile)


@dataclass(frozen=True)
class VisibleList:
    raw: str
    entries: tuple[VisibleEntry, ...]
    ignored: str | None = None  # the tail the runtime stops reading at
    problems: tuple[str, ...] = ()

    @property
    def hides_all(self) -> bool:
        return not self.entries


_UUID_ENTRY = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]+(/\d+/\d+)?")


def parse_visible_devices(raw: str, name: str) -> VisibleList:
    """CUDA/HIP/ROCR_VISIBLE_DEVICES: ordinals or UUIDs, comma separated.

    The runtimes read entries up to the first one they cannot parse (or a negative ordinal) and
    silently drop the rest, so ``0,1,x,2`` exposes two devices and ``-1`` exposes none.
    """
    text = raw.strip()
    entries: list[VisibleEntry] = []
    problems: list[str] = []
    ignored: str | None = None
    if not text:
        return VisibleList(raw, (), None, (f"{name} is set but empty: no device is visible",))
    parts = text.split(",")
    seen: set[int] = set()  # a set, not a scan of entries: a 100 KB list stays linear
    for i, part in enumerate(parts):
        token = part.strip()
        iv = parse_int(token, name) if token else IntValue(token, None, ("empty",))
        if iv.value is not None and not iv.problems and iv.value >= 0:
            if iv.value in seen:
                problems.append(f"{name} lists device {iv.value} twice")
            seen.add(iv.value)
            entries.append(VisibleEntry(index=iv.value))
            continue
        if _UUID_ENTRY.fullmatch(token):
            entries.append(VisibleEntry(uuid=token))
            continue
        ignored = ",".join(parts[i:])
        if iv.value is not None and iv.value < 0:
            why = f"{name}: {token} is negative, so it and everything after it hides devices"
            if i > 0 or iv.value != -1:
                problems.append(why)
        else:
            problems.append(f"{name}: entry {_show(token)} is not a device ordinal or UUID; it and everything after it "
                            "are ignored")
        break
    return VisibleList(raw, tuple(entries), ignored, _capped(problems))


def parse_ze_affinity_mask(raw: str) -> VisibleList:
    """ZE_AFFINITY_MASK: ``device[.subdevice]`` list (Level Zero); invalid entries are dropped."""
    name = "ZE_AFFINITY_MASK"
    entries: list[VisibleEntry] = []
    problems: list[str] = []
    text = raw.strip()
    if not text:
        return VisibleList(raw, (), None, (f"{name} is set but empty",))
    seen: set[VisibleEntry] = set()
    for part in text.split(","):
        token = part.strip()
        # Bounded digit counts: int() of a 5,000-digit ordinal raises.
        m = re.fullmatch(r"(\d{1,9})(?:\.(\d{1,9}))?", token)
        if not m:
            problems.append(f"{name}: entry {_show(token)} is not device[.subdevice]; Level Zero drops it")
            continue
        entry = VisibleEntry(index=int(m.group(1)), sub=int(m.group(2)) if m.group(2) else None)
        if entry in seen:
            problems.append(f"{name} lists {_show(token)} twice")
        seen.add(entry)
        entries.append(entry)
    return VisibleList(raw, tuple(entries), None, _capped(problems))


def parse_module_list(raw: str, name: str = "HABANA_VISIBLE_MODULES") -> VisibleList:
    """HABANA_VISIBLE_MODULES: comma list of module ids (0-7 on an HLS board)."""
    entries: list[VisibleEntry] = []
    seen: set[int] = set()
    problems: list[str] = []
    for part in raw.split(","):
        token = part.strip()
        if not token:
            problems.append(f"{name} has an empty entry")
            continue
        iv = parse_int(token, name, 0)
        if iv.value is None or iv.problems:
            problems.append(f"{name}: {_show(token)} is not a module id")
            continue
        if iv.value in seen:
            problems.append(f"{name} lists module {iv.value} twice")
        seen.add(iv.value)
        entries.append(VisibleEntry(index=iv.value))
    return VisibleList(raw, tuple(entries), None, _capped(problems))


# -- UCX_NET_DEVICES ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceList:
    raw: str
    all: bool
    entries: tuple[ListEntry, ...]
    problems: tuple[str, ...] = ()


def parse_ucx_devices(raw: str, name: str = "HOTWEIGHTS_UCX_NET_DEVICES") -> DeviceList:
    """UCX_NET_DEVICES grammar: ``all`` or exact ``device[:port]`` names (``mlx5_0:1,eth0``)."""
    text = raw.strip()
    if text.lower() == "all":
        return DeviceList(raw, True, ())
    entries: list[ListEntry] = []
    problems: list[str] = []
    for part in text.split(","):
        token = part.strip()
        if not token:
            continue
        base, sep, port_text = token.partition(":")
        port = None
        if sep:
            p = parse_int(port_text, f"{name} port", 1)
            if p.value is None or p.problems:
                problems.append(f"{name}: port in {_show(token)} is not a positive integer")
            else:
                port = p.value
        if not base or any(c.isspace() for c in base):
            problems.append(f"{name}: {_show(token)} is not a device name")
            continue
        entries.append(ListEntry(base, port))
    if not entries:
        problems.append(f"{name}={_show(raw)} names no device")
    return DeviceList(raw, False, tuple(entries), _capped(problems))


# -- files ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfFile:
    settings: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def parse_nccl_conf(text: str, origin: str = "nccl.conf") -> ConfFile:
    """``NAME=VALUE`` lines as NCCL's setEnvFile reads them; ``#`` starts a comment line."""
    settings: dict[str, str] = {}
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            problems.append(f"{origin}:{n}: {_show(line)} is not NAME=VALUE")
            continue
        value = value.strip()
        if key.startswith("export "):
            key = key[7:].strip()
        settings[key] = value
    return ConfFile(settings, _capped(problems))


def parse_ld_so_conf(text: str) -> tuple[list[str], list[str]]:
    """(directories, include globs) from an ld.so.conf file."""
    dirs: list[str] = []
    includes: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include"):
            includes += line.split()[1:]
        elif line.startswith("hwcap"):
            continue
        else:
            dirs += [d for d in re.split(r"[\s:,]+", line) if d.startswith("/")]
    return dirs, includes


@dataclass(frozen=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str
    options: tuple[str, ...]


def _unescape_mount(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mounts(text: str) -> list[Mount]:
    """/proc/mounts lines; spaces in paths appear as ``\\040``."""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mounts.append(Mount(_unescape_mount(parts[0]), _unescape_mount(parts[1]), parts[2], tuple(parts[3].split(","))))
    return mounts


def _pairs(text: str, separator: str) -> dict[str, str]:
    """Lines of ``key <separator> value``, both sides stripped; lines without it are skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(separator)
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_key_values(text: str) -> dict[str, str]:
    """``Key=Value`` lines (``timedatectl show``)."""
    return _pairs(text, "=")


def parse_chrony_tracking(text: str) -> dict[str, str]:
    """``Name : value`` lines of ``chronyc tracking``."""
    return _pairs(text, ":")
