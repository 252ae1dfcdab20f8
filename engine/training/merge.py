"""Merging worker copies: weights averaged in proportion to the samples each worker trained on,
then (``--merge outer-nesterov``, the default) an outer optimizer step on the averaged deltas.

Why weighted: with dynamic balancing a fast device takes, say, 30 steps of a round while a slow
one takes 10. A plain mean would give the slow copy -- which saw a quarter of the data -- half of
the say. The merged value of every tensor is ``sum_i(n_i * x_i) / sum_i(n_i)`` with ``n_i`` the
samples worker ``i`` trained this round; a worker that trained nothing has weight 0 and simply
receives the merged model.

Why through host memory over gloo: no collective library spans vendors (NCCL cannot talk to
oneCCL or HCCL), so each worker copies its tensors to the CPU and a gloo all-reduce sums them.

Dtypes: floating tensors are summed in fp32 (bf16/fp16 sums lose digits) and cast back; integer
and bool buffers are summed in fp64 (exact below 2**53), rounded half-to-even and cast back, so
an integer buffer stays an integer tensor and is identical on every rank.

Optimizer state policy (``--optimizer-state``):

* ``average`` (default): AdamW's moments and step count are merged with the same sample weights.
  After a merge the weights are identical everywhere; keeping per-worker moments would push the
  copies apart again at once, and resetting them throws away the second-moment estimate and
  restarts Adam's bias correction, which shows up as a loss spike after every round.
* ``reset``: the optimizer state is dropped after each merge (classic local SGD).
* ``keep``: each worker keeps its own state (cheapest, no optimizer traffic).

Two-phase: :func:`weighted_allreduce` only computes the merged tensors; the caller applies them
when the coordinator says every participant succeeded, so a worker dying in the middle of the
collective can never leave some ranks merged and others not.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def weighted_allreduce(tensors: Mapping[str, torch.Tensor], samples: int) -> tuple[dict[str, torch.Tensor], int]:
    """Sample-weighted mean of ``tensors`` across the default gloo group. Returns (merged, total samples).

    Every rank must pass the same names with the same shapes and dtypes. Two all-reduces, each on
    one flat buffer: floats (fp32) and integers plus the sample count (fp64).
    """
    names = sorted(tensors)
    floats = [n for n in names if _is_float(tensors[n])]
    ints = [n for n in names if not _is_float(tensors[n])]
    w = float(samples)
    flat_f = torch.cat([tensors[n].detach().to("cpu", torch.float32).reshape(-1) for n in floats]) if floats else torch.zeros(0)
    flat_f.mul_(w)
    flat_i = torch.cat([tensors[n].detach().to("cpu", torch.float64).reshape(-1) for n in ints] + [torch.ones(1, dtype=torch.float64)])
    flat_i.mul_(w)
    if dist.get_world_size() > 1:  # alone, the sum is the tensor itself: no collective to wait on
        if flat_f.numel():
            dist.all_reduce(flat_f)
        dist.all_reduce(flat_i)
    total = flat_i[-1].item()
    if total <= 0:  # nobody trained: keep the tensors as they are
        return {n: tensors[n].detach().to("cpu").clone() for n in names}, 0
    flat_f.div_(total)
    flat_i.div_(total)
    merged: dict[str, torch.Tensor] = {}
    offset = 0
    for n in floats:
        t = tensors[n]
        merged[n] = flat_f[offset: offset + t.numel()].view(t.shape).to(t.dtype).clone()
        offset += t.numel()
    offset = 0
    for n in ints:
        t = tensors[n]
        merged[n] = torch.round(flat_i[offset: offset + t.numel()]).view(t.shape).to(t.dtype).clone()
        offset += t.numel()
    return merged, int(round(total))


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.state_dict())


def optimizer_tensors(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Optimizer state keyed by parameter *name* (stable across ranks), e.g. ``head.weight/exp_avg``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    out[f"{names[id(p)]}/{key}"] = value
                else:
                    out[f"{names[id(p)]}/{key}"] = torch.tensor(float(value))
    return out


def _step_device(group: Mapping[str, object], p: torch.Tensor) -> torch.device:
    """Where AdamW keeps a parameter's step count: beside the parameter for the fused and
    capturable implementations (their kernels read it there), on the CPU otherwise."""
    return p.device if group.get("fused") or group.get("capturable") else torch.device("cpu")


def ensure_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Materialise AdamW's state (zeros) so every rank merges the same names even before its first step."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, device=_step_device(group, p))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    for key, value in tensors.items():
        name, _, field = key.rpartition("/")
        p = params[name]
        state = optimizer.state[p]
        target = state.get(field)
        if isinstance(target, torch.Tensor):
            target.copy_(value.to(target.device, target.dtype))
        else:
            group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
            state[field] = value.to(p.device) if field != "step" else value.to(_step_device(group, p), torch.float32)


def load_model_tensors(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, target in model.state_dict().items():
            target.copy_(tensors[name].to(target.device, target.dtype))


def join_group(store: dist.Store, generation: int, rank: int, world_size: int, timeout_s: float) -> None:
    """(Re)form the gloo group for one generation of the live worker set.

    After a peer dies, a gloo group is broken for good and must be destroyed; the survivors form a
    new group under a fresh key prefix on the same TCPStore (owned by the coordinator, so it
    outlives any worker), with ranks renumbered 0..n-1.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore(f"hwtui-train/gen{generation}", store),
                            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))


class OuterNesterov:
    """DiLoCo's outer step (Douillard et al. 2023): SGD with Nesterov momentum on the averaged deltas.

    Every worker starts a round from the same *anchor* (the model the last merge produced) and
    trains on its own. The sample-weighted average of the copies is ``anchor - delta`` where
    ``delta`` is the sample-weighted average of the workers' pseudo-gradients ``anchor - copy_i``.
    Plain averaging (``--merge average``) takes exactly that step; the outer optimizer instead does

        m      <- momentum * m + delta
        anchor <- anchor - lr * (delta + momentum * m)          (Nesterov)

    which lets the merged model move further along directions every round agrees on (a steady
    delta is taken ``lr / (1 - momentum)`` times). DiLoCo's lr 0.7 / momentum 0.9 (a 7x step) is
    tuned for hundreds of inner steps per round; at tens of inner steps it overshoots, and the
    defaults here are lr 0.7 / momentum 0.5 (1.4x), which beat plain averaging at equal samples on
    every seed measured (docs/training.md). Every worker computes the same step from the same all-reduced average,
    so the state (anchor, m) stays identical everywhere without being sent: only the checkpoint
    writer saves ``m``. Two-phase like the merge: :meth:`propose` computes the candidate,
    :meth:`accept` makes it current once the coordinator commits the round.

    Only floating tensors take the step; integer buffers keep the plain merge.
    """

    def __init__(self, model: torch.nn.Module, lr: float, momentum: float,
                 state: Mapping[str, torch.Tensor] | None = None):
        self.lr, self.momentum = lr, momentum
        self.anchor = {n: t.detach().to("cpu", torch.float32).clone() for n, t in model.state_dict().items() if _is_float(t)}
        self.buf = {n: torch.zeros_like(t) for n, t in self.anchor.items()}
        for name, value in (state or {}).items():
            if name in self.buf and value.shape == self.buf[name].shape:
                self.buf[name].copy_(value.to(torch.float32))
        self._proposal: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None

    def propose(self, merged: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``merged`` with each floating tensor replaced by the outer step's result (nothing applied yet)."""
        out = dict(merged)
        anchor, buf = {}, {}
        for name, old in self.anchor.items():
            delta = old - merged[name].to(torch.float32)
            m = self.buf[name] * self.momentum + delta
            new = old - self.lr * (delta + self.momentum * m)
            anchor[name], buf[name] = new, m
            out[name] = new.to(merged[name].dtype)
        self._proposal = (anchor, buf)
        return out

    def accept(self) -> None:
        if self._proposal is not None:
            self.anchor, self.buf = self._proposal
            self._proposal = None

    def reject(self) -> None:
        self._proposal = None

    def state(self) -> dict[str, torch.Tensor]:
        return dict(self.buf)
