"""What the engine preloads before forking ranks (see :mod:`hwtui.core.forking`).

Ranks are ``python -m hwtui.engine.<x>.worker``; each used to import torch itself (0.75-1 s of
CPU). A launcher calls :func:`preload_for_ranks` once, before it starts any thread, and asks its
:class:`~hwtui.core.supervisor.Child` for ``fork=True``.

Only CPU ranks fork. Accelerator ranks keep exec: a CUDA/HIP/XPU runtime must never be initialised
in a process that forks, and although the launcher does not touch one, a rank's start on a device
is dominated by creating its context (hundreds of ms) rather than the import, so the saving is
small against the cost of a driver state shared by accident. :func:`_no_device_runtime` checks it
before every fork anyway.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from hwtui.core import forking, forkserver

# What a rank imports first; the replication worker's heavy modules ride along with torch.
RANK_MODULES = ("torch", "torch.distributed")

# Environment torch (and its BLAS/OpenMP) reads once, at import: a child whose values differ is
# exec'd, since a fork would keep ours. The thread counts are re-applied after the fork instead
# (torch.set_num_threads), so they may differ.
IMPORT_ENV_PREFIXES = ("TORCH_", "PYTORCH_", "KMP_", "MKL_", "GOMP_", "OPENBLAS_", "LD_", "CUDA_", "HIP_", "ROCR_",
                       "HSA_", "ZE_", "SYCL_", "PT_HPU", "HABANA_", "GLOG_")
PER_RANK_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def quiet_numpy() -> None:
    """Import numpy with a one-thread BLAS, if nobody has yet.

    numpy's OpenBLAS starts a thread pool at import (cores - 1 threads), and a process with
    threads is never forked. A launcher imports numpy for its plan and does no linear algebra;
    its forked ranks inherit the one-thread BLAS, which an exec'd rank has too wherever its
    OMP_NUM_THREADS (cores // ranks) is 1, and ranks do their arithmetic in torch anyway.
    """
    if "numpy" in sys.modules or not forking.enabled_by_env():
        return
    set_here = "OPENBLAS_NUM_THREADS" not in os.environ
    if set_here:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    finally:
        if set_here:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)


# A launcher imports this module before its plan module, which imports numpy.
quiet_numpy()


@contextlib.contextmanager
def no_intra_op_pool() -> Iterator[None]:
    """Tensor work in a launcher that will fork, without starting torch's intra-op thread pool.

    torch starts its OpenMP pool at the first op large enough to split (a clone of 33,606 bytes of
    a --data corpus was enough), and the pool's threads make the launcher a process with threads,
    which is never forked: every worker was exec'd and paid its own ``import torch``. One thread
    for the duration, then the count as it was (a pool is only created by the next large op).
    torch is imported here if the work inside has not yet: the guard must hold whatever imports it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _after_fork() -> None:
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
    if torch is not None and threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _no_device_runtime() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for name in ("cuda", "xpu", "hpu"):
        mod = getattr(torch, name, None)
        is_init = getattr(mod, "is_initialized", None)
        if is_init is not None and is_init():
            return f"torch.{name} is initialised in the launcher"
    return None


def preload_for_ranks(device: str = "cpu", env: dict[str, str] | None = None, *, modules: Sequence[str] = RANK_MODULES,
                      more_env_prefixes: Sequence[str] = ()) -> str | None:
    """Import torch here once if ranks will fork; returns why they will be exec'd (None: forked).

    ``modules``: what every rank imports anyway (a launcher's ranks may import more than torch);
    ``more_env_prefixes``: environment those modules read at import, beyond torch's."""
    if device != "cpu":
        return f"--device {device} ranks are exec'd (no device runtime near a fork)"
    if not forking.enabled_by_env(env):
        return f"{forking.ENV_SWITCH}=0"
    return forking.preload(modules, import_env_prefixes=(*IMPORT_ENV_PREFIXES, *more_env_prefixes), import_env_except=PER_RANK_ENV,
                           quiet_env={"OPENBLAS_NUM_THREADS": "1"}, after_fork=_after_fork, fork_ok=_no_device_runtime)


# What a resident rank (engine.resident.resident_child) imports: torch, and the replication worker.
RESIDENT_MODULES = (*RANK_MODULES, "hwtui.engine.resident.resident_child")


def start_fork_server(device: str | None) -> str | None:
    """The node agent, before it starts a thread: preload what its resident ranks import and fork
    its fork server (core.forkserver), so each resident rank is forked instead of exec'd and
    importing torch again; returns why not (None: running). CPU agents only, as for launchers:
    a GPU-resident agent's ranks keep exec."""
    if device not in (None, "cpu", "host"):  # "host": the memfd stand-in of device slots (tests), host memory
        return f"--device {device} resident ranks are exec'd (no device runtime near a fork)"
    if (why := preload_for_ranks("cpu", modules=RESIDENT_MODULES)) is not None:
        return why
    return forkserver.start()
