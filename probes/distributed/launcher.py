"""Launcher variables: torchrun, SLURM and MPI ranks, each an integer in range and all agreeing.

torch's ``env://`` rendezvous reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; LOCAL_RANK
picks the device. A job started with ``srun python train.py`` has SLURM_PROCID but no RANK, and a
job whose launcher and scheduler disagree hangs at init with every rank waiting for a peer that
believes it is someone else. Those are the mistakes checked here, before anything starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from hwtui.core.finding import Finding, fail, passed, skip, warn
from hwtui.probes.distributed.parsers import parse_int
from hwtui.probes.framework import Facts, Rule

# The integers torchrun, the hardware guide's launch script and SLURM/MPI set, with their minimum.
INT_VARS: dict[str, int] = {
    "WORLD_SIZE": 1, "RANK": 0, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "NODE_RANK": 0, "GROUP_RANK": 0,
    "GROUP_WORLD_SIZE": 1, "NPROC_PER_NODE": 1, "NNODES": 1,
    "SLURM_PROCID": 0, "SLURM_NTASKS": 1, "SLURM_LOCALID": 0, "SLURM_NNODES": 1, "SLURM_NODEID": 0,
    "OMPI_COMM_WORLD_RANK": 0, "OMPI_COMM_WORLD_SIZE": 1, "OMPI_COMM_WORLD_LOCAL_RANK": 0,
    "OMPI_COMM_WORLD_LOCAL_SIZE": 1, "PMI_RANK": 0, "PMI_SIZE": 1,
    "TORCHELASTIC_RESTART_COUNT": 0, "TORCHELASTIC_MAX_RESTARTS": 0,
}
# Variables whose grammar is not a plain integer (SLURM's "4(x2)", torchrun's "1:4").
OTHER_VARS = ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "PET_NNODES", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """The variable's value when it is a valid integer within its minimum; else None."""
    raw = env.get(name)
    if raw is None:
        return None
    iv = parse_int(raw, name, INT_VARS.get(name))
    return iv.value if iv.ok else None


def _slurm_per_node(raw: str | None) -> int | None:
    """SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE: "4", "4(x2)" or "4(x2),3" (uneven)."""
    if not raw:
        return None
    m = re.fullmatch(r"\s*(\d+)(\(x\d+\))?\s*", raw)
    return int(m.group(1)) if m else None


def _max_of_range(raw: str | None) -> int | None:
    """torchrun's --nnodes / PET_NNODES: "2" or an elastic "1:4" (the upper bound)."""
    if not raw:
        return None
    m = re.fullmatch(r"\s*(\d+)(?::(\d+))?\s*", raw)
    if not m:
        return None
    return int(m.group(2) or m.group(1))


@dataclass(frozen=True)
class JobShape:
    launcher: str | None  # "torchrun", "slurm", "mpi" or None
    world_size: int | None
    rank: int | None
    local_rank: int | None
    local_world_size: int | None
    node_rank: int | None
    nnodes: int | None
    multi_node: bool | None  # None: nothing says

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0 or (self.rank is None and (self.node_rank or 0) == 0)

    @property
    def multi_process(self) -> bool:
        return (self.world_size or 1) > 1


def detect_launcher(env: Mapping[str, str]) -> str | None:
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "SLURM_PROCID" in env or "SLURM_JOB_ID" in env:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env or "PMIX_RANK" in env:
        return "mpi"
    return None


def job_shape(env: Mapping[str, str]) -> JobShape:
    """What the environment says about the job, from whichever launcher set it. Never raises."""
    def first(*names: str) -> int | None:
        for n in names:
            v = env_int(env, n)
            if v is not None:
                return v
        return None

    world = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
    rank = first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
    local_rank = first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
    local_world = (first("LOCAL_WORLD_SIZE", "NPROC_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE")
                   or _slurm_per_node(env.get("SLURM_NTASKS_PER_NODE")))
    node_rank = first("GROUP_RANK", "NODE_RANK", "SLURM_NODEID")
    nnodes = first("GROUP_WORLD_SIZE", "NNODES", "SLURM_NNODES") or _max_of_range(env.get("PET_NNODES"))
    if nnodes is None and world and local_world and world % local_world == 0:
        nnodes = world // local_world
    multi: bool | None = None
    if nnodes is not None:
        multi = nnodes > 1
    if node_rank:
        multi = True
    return JobShape(detect_launcher(env), world, rank, local_rank, local_world, node_rank, nnodes, multi)


# -- rules ----------------------------------------------------------------------------------------

def _parse_findings(env: Mapping[str, str]) -> Iterator[Finding]:
    for name, lo in INT_VARS.items():
        raw = env.get(name)
        if raw is None:
            continue
        iv = parse_int(raw, name, lo)
        if not iv.ok:
            yield fail(f"launcher.{name.lower()}", "; ".join(iv.problems),
                       f"torch and the launchers call int() on {name}; a bad value fails at init or misplaces the rank.",
                       f"export {name}=<integer >= {lo}> (or let torchrun/srun set it)", variable=name)


def _pairs_check(fid: str, env: Mapping[str, str], pairs: list[tuple[str, str]], who: str) -> Iterator[Finding]:
    """Each (launcher var, torch var) pair must agree when both are valid."""
    compared, disagree = [], []
    for theirs, ours in pairs:
        a, b = env_int(env, theirs), env_int(env, ours)
        if a is None or b is None:
            continue
        compared.append(f"{theirs}={a} {ours}={b}")
        if a != b:
            disagree.append((theirs, a, ours, b))
    if disagree:
        text = "; ".join(f"{t}={a} but {o}={b}" for t, a, o, b in disagree)
        yield fail(fid, f"{who} and torch disagree: {text}",
                   "Ranks that disagree about who they are wait forever for a peer at init.",
                   "Derive the torch variables from the launcher's: " +
                   "; ".join(f"export {o}=${t}" for t, _a, o, _b in disagree), mismatches=len(disagree))
    elif compared:
        yield passed(fid, f"{who} and torch variables agree", ", ".join(compared))


def launcher_rules(facts: Facts) -> Iterator[Finding]:
    env = facts.host.env if facts.host else {}
    yield from _parse_findings(env)
    shape = job_shape(env)
    launcher = shape.launcher
    torch_set = [n for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if n in env]

    if launcher is None and not torch_set:
        yield skip("launcher.detected", "not inside torchrun, SLURM or MPI: single-process run",
                   "Multi-process checks run when RANK/WORLD_SIZE or a launcher's variables are set.")
        return
    yield passed("launcher.detected", f"launched by {launcher or 'hand-set environment'}",
                 f"world size {shape.world_size or '?'}, rank {shape.rank if shape.rank is not None else '?'}, "
                 f"local rank {shape.local_rank if shape.local_rank is not None else '?'}, "
                 f"nodes {shape.nnodes or '?'}", launcher=launcher or "manual")

    yield from _rank_findings(env)
    yield from _layout_findings(env, shape)
    yield from _slurm_findings(env, shape)
    yield from _mpi_findings(env, torch_set)
    yield from _torchelastic_findings(env)


def _rank_findings(env: Mapping[str, str]) -> Iterator[Finding]:
    """RANK and LOCAL_RANK each set with its size, and below it."""
    world, rank = env_int(env, "WORLD_SIZE"), env_int(env, "RANK")
    local_rank, local_world = env_int(env, "LOCAL_RANK"), env_int(env, "LOCAL_WORLD_SIZE")
    # torch's env:// needs RANK and WORLD_SIZE together.
    if ("RANK" in env) != ("WORLD_SIZE" in env):
        have, missing = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        yield fail("launcher.incomplete", f"{have} is set but {missing} is not",
                   "init_process_group(init_method='env://') raises ValueError without both.",
                   f"export {missing}=<value> (torchrun sets both: torchrun --nproc-per-node=N train.py)")

    if rank is not None and world is not None:
        if rank >= world:
            yield fail("launcher.rank", f"RANK={rank} is not below WORLD_SIZE={world}",
                       "Ranks run from 0 to WORLD_SIZE-1; this rank never joins and the others wait at init.",
                       f"export RANK=<0..{world - 1}>")
        else:
            yield passed("launcher.rank", f"RANK {rank} of WORLD_SIZE {world}")
    if local_rank is not None and local_world is not None:
        if local_rank >= local_world:
            yield fail("launcher.local_rank", f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}",
                       "", f"export LOCAL_RANK=<0..{local_world - 1}>")
        else:
            yield passed("launcher.local_rank", f"LOCAL_RANK {local_rank} of LOCAL_WORLD_SIZE {local_world}")


def _layout_findings(env: Mapping[str, str], shape: JobShape) -> Iterator[Finding]:
    """The per-node sizes against the world, the node rank against the node count, the rank layout."""
    world, rank = env_int(env, "WORLD_SIZE"), env_int(env, "RANK")
    local_rank, local_world = env_int(env, "LOCAL_RANK"), env_int(env, "LOCAL_WORLD_SIZE")
    nproc = env_int(env, "NPROC_PER_NODE")
    if local_world is not None and world is not None:
        if local_world > world:
            yield fail("launcher.local_world_size", f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}",
                       "", f"export LOCAL_WORLD_SIZE=<1..{world}>")
        elif world % local_world:
            yield warn("launcher.local_world_size", f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}",
                       "Nodes run different process counts; fine if intended, a typo otherwise.",
                       "torchrun --nnodes=N --nproc-per-node=M sets WORLD_SIZE=N*M")
    if nproc is not None and local_world is not None and nproc != local_world:
        yield warn("launcher.nproc_per_node", f"NPROC_PER_NODE={nproc} but LOCAL_WORLD_SIZE={local_world}",
                   "The launch script and the launcher disagree about processes per node.",
                   f"export NPROC_PER_NODE={local_world}")
    if shape.node_rank is not None and shape.nnodes is not None and shape.node_rank >= shape.nnodes:
        yield fail("launcher.node_rank", f"node rank {shape.node_rank} is not below the node count {shape.nnodes}",
                   "", f"export NODE_RANK=<0..{shape.nnodes - 1}>")
    group = env_int(env, "GROUP_RANK")
    if group is not None and rank is not None and local_rank is not None and local_world is not None \
            and world is not None and rank != group * local_world + local_rank and world % local_world == 0:
        yield warn("launcher.rank_layout", f"RANK={rank} is not GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK="
                   f"{group * local_world + local_rank}",
                   "torchrun assigns ranks node by node; a different layout means hand-edited variables.",
                   "Let torchrun set RANK (do not export it in the job script)")


# MPI's variables and the torch variables they stand for.
_MPI_PAIRS = [("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"),
              ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"),
              ("PMI_RANK", "RANK"), ("PMI_SIZE", "WORLD_SIZE")]


def _mpi_findings(env: Mapping[str, str], torch_set: Sequence[str]) -> Iterator[Finding]:
    if "OMPI_COMM_WORLD_RANK" not in env and "PMI_RANK" not in env:
        return
    if not torch_set:
        yield warn("launcher.mpi_agree", "MPI task without RANK/WORLD_SIZE",
                   "torch.distributed does not read MPI's variables for env:// (the Gaudi bridge does).",
                   "export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "
                   "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK")
    else:
        yield from _pairs_check("launcher.mpi_agree", env, _MPI_PAIRS, "MPI")


def _slurm_findings(env: Mapping[str, str], shape: JobShape) -> Iterator[Finding]:
    if "SLURM_PROCID" not in env:
        return
    if "TORCHELASTIC_RUN_ID" in env:
        # `srun torchrun ...`: one SLURM task per node, torchrun spawns the ranks. SLURM's task id
        # is then the node rank, not the global rank.
        pairs = [("SLURM_PROCID", "GROUP_RANK"), ("SLURM_NTASKS", "GROUP_WORLD_SIZE")]
        yield from _pairs_check("launcher.slurm_agree", env, pairs, "SLURM (one torchrun per node)")
        tasks_per_node = _slurm_per_node(env.get("SLURM_NTASKS_PER_NODE"))
        if tasks_per_node and tasks_per_node > 1:
            yield warn("launcher.slurm_tasks", f"{tasks_per_node} SLURM tasks per node each run torchrun",
                       "Every task starts its own torchrun agent and they compete for the same devices and port.",
                       "#SBATCH --ntasks-per-node=1 (torchrun --nproc-per-node spawns the ranks)")
        return
    if "RANK" not in env or "WORLD_SIZE" not in env:
        yield warn("launcher.slurm_agree", "SLURM task without RANK/WORLD_SIZE",
                   "`srun python train.py` sets only SLURM_*; torch's env:// rendezvous needs RANK and WORLD_SIZE.",
                   "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
                   "LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE")
        return
    pairs = [("SLURM_PROCID", "RANK"), ("SLURM_NTASKS", "WORLD_SIZE"), ("SLURM_LOCALID", "LOCAL_RANK")]
    yield from _pairs_check("launcher.slurm_agree", env, pairs, "SLURM")


def _torchelastic_findings(env: Mapping[str, str]) -> Iterator[Finding]:
    if not any(k.startswith("TORCHELASTIC_") for k in env):
        return
    restarts, max_restarts = env_int(env, "TORCHELASTIC_RESTART_COUNT"), env_int(env, "TORCHELASTIC_MAX_RESTARTS")
    store = env.get("TORCHELASTIC_USE_AGENT_STORE")
    if store is not None and store not in ("True", "False"):
        yield warn("launcher.torchelastic", f"TORCHELASTIC_USE_AGENT_STORE={store!r} is not True or False",
                   "torch compares the string with 'True'; anything else means the worker hosts its own store.",
                   "Let torchrun set TORCHELASTIC_* (do not export them by hand)")
    elif restarts is not None and max_restarts is not None and restarts > max_restarts:
        yield fail("launcher.torchelastic", f"restart {restarts} exceeds TORCHELASTIC_MAX_RESTARTS={max_restarts}", "",
                   "Let torchrun set TORCHELASTIC_* (do not export them by hand)")
    elif restarts:
        yield warn("launcher.torchelastic", f"this worker group was restarted {restarts} time(s)",
                   "An earlier attempt failed; its error is in the torchrun log (or TORCHELASTIC_ERROR_FILE).",
                   "Read the first failure in the torchrun output before it is retried again")
    else:
        yield passed("launcher.torchelastic", "torchrun worker, first attempt",
                     f"run id {env.get('TORCHELASTIC_RUN_ID', '?')}")


RULES = [Rule("launcher", launcher_rules, "env")]
