"""Will the model fit? A per-device estimate checked before any training starts.

Every worker holds a full copy of the model (this is data parallelism across vendors, not model
sharding), so each device needs: parameters, gradients, optimizer state (AdamW: two fp32 moments
per parameter), the activations of one batch, plus a CPU copy of the weights for merging (host
RAM, not counted against a GPU).

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022): per layer about ``s*b*h*(34 + 5*a*s/h)`` bytes in 16-bit, twice that in fp32,
plus the logits. With activation checkpointing only each layer's input (``2*s*b*h`` bytes in
16-bit) is kept and one layer is recomputed at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwtui.engine.training.model import ModelConfig

PARAM_BYTES = 4  # master weights stay fp32; autocast casts on the fly
OPTIMIZER_BYTES = 8  # AdamW exp_avg + exp_avg_sq in fp32
WORKSPACE = 1.10  # allocator fragmentation and kernels' workspaces
# Headroom for CPU ranks: several workers share host RAM, so each may use only its part.


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return int((self.params + self.grads + self.optimizer + self.activations) * WORKSPACE)

    def to_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "total": self.total}


def activation_bytes(cfg: ModelConfig, batch_size: int, precision: str, checkpointing: bool) -> int:
    s, b, h, a = cfg.context, batch_size, cfg.d_model, cfg.heads
    scale = 1 if precision in ("bf16", "fp16") else 2  # the formula counts 16-bit bytes
    per_layer = s * b * h * (34 + 5 * a * s / h) * scale
    logits = s * b * cfg.vocab * 4 * 3  # fp32 logits, softmax and its gradient
    if checkpointing:
        layers = cfg.layers * 2 * s * b * h * scale + per_layer
    else:
        layers = cfg.layers * per_layer
    return int(layers + logits)


def estimate(cfg: ModelConfig, batch_size: int, precision: str, checkpointing: bool = False) -> MemoryEstimate:
    n = cfg.param_count()
    return MemoryEstimate(params=n * PARAM_BYTES, grads=n * PARAM_BYTES, optimizer=n * OPTIMIZER_BYTES,
                          activations=activation_bytes(cfg, batch_size, precision, checkpointing))


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 / 10 else f"{n / 1024**2:.1f} MiB"


def largest_batch(cfg: ModelConfig, free: int, precision: str, checkpointing: bool) -> int:
    lo, hi = 0, 1
    while estimate(cfg, hi, precision, checkpointing).total <= free and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate(cfg, mid, precision, checkpointing).total <= free:
            lo = mid
        else:
            hi = mid
    return lo


def check_fits(device: str, cfg: ModelConfig, batch_size: int, precision: str, checkpointing: bool,
               free: int) -> str | None:
    """None when it fits in ``free`` bytes; otherwise one line saying what needs what, and what to change."""
    est = estimate(cfg, batch_size, precision, checkpointing)
    if est.total <= free:
        return None
    fixes = []
    best = largest_batch(cfg, free, precision, checkpointing)
    if best >= 1:
        fixes.append(f"--batch-size {best} or lower")
    if precision not in ("bf16", "fp16"):
        fixes.append("--precision bf16 (halves activations)")
    if not checkpointing:
        fixes.append("--activation-checkpointing")
    if not fixes:
        fixes.append("a smaller model or a device with more memory")
    return (f"{device} needs about {_gib(est.total)} (params {_gib(est.params)}, grads {_gib(est.grads)}, "
            f"optimizer {_gib(est.optimizer)}, activations {_gib(est.activations)} at batch {batch_size}, "
            f"{precision}) but has {_gib(free)} free; try " + ", or ".join(fixes))


def check_params_fit(device: str, params: int, free: int) -> str | None:
    """For a model of any architecture (``--model``): its weights, gradients and AdamW state in fp32
    against ``free`` bytes. Activations depend on the architecture and are not estimated here, so
    this refuses only what cannot fit at any batch size."""
    need = int(params * (PARAM_BYTES * 2 + OPTIMIZER_BYTES) * WORKSPACE)
    if need <= free:
        return None
    return (f"{device} needs about {_gib(need)} for {params:,} parameters (weights, gradients and AdamW state "
            f"in fp32, before activations) but has {_gib(free)} free; use a smaller model or a device with more memory")
