"""Optimizers for BERT: NVLAMB for pre-training, BertAdam (AdamW) for fine-tuning, and the weight-decay groups.

NVLAMB is LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning") as NVIDIA's recipe uses it: one
global gradient-norm clip over every parameter group, Adam moments with bias correction, decoupled weight decay
and a per-tensor trust ratio. One step t (t counts only the steps this parameter actually took):

    1. G = ||all gradients of all groups||_2;  if G > max_grad_norm every g is divided by G / max_grad_norm
    2. m = b1*m + (1-b1)*g                     v = b2*v + (1-b2)*g^2
    3. m_hat = m / (1-b1^t)                    v_hat = v / (1-b2^t)
    4. u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
    5. r = ||p|| / ||u||  if (use_nvlamb or weight_decay != 0) and both norms > 0, else 1   (p before the update)
    6. p = p - lr * r * u

Clipping happens in place: after step() each p.grad holds the clipped gradient (what
`torch.nn.utils.clip_grad_norm_` leaves behind, without its +1e-6 in the divisor). The caller passes real
(unscaled) gradients: with fp16 the GradScaler's `unscale_` (or `scaler.step`, which unscales) runs first, and the
scaler itself skips steps whose gradients overflowed, so NVLAMB needs no loss-scale argument. In fp32/bf16 there
is no such guard: a non-finite G is not special-cased and propagates NaN into the weights, as it would with
`clip_grad_norm_` (a diverged run should be stopped, not silently stepped over).

Speed: per (group, device, dtype) bucket, a handful of multi-tensor ops, all in place on the optimizer state and on
one persistent scratch buffer per parameter (1x the parameter memory, never checkpointed). The Adam part (moments,
bias correction, m_hat / (sqrt(v_hat) + eps)) is one pass of PyTorch's own fused multi-tensor Adam kernel
(`torch._fused_adam_`/`_fused_adamw_`, behind `torch.optim.AdamW(fused=True)`, on CPU and CUDA) run with lr=1 on
the scratch buffer, which receives -u with the weight decay folded in (see `_neg_update_fused`); the two norms and
the trust-ratio update are `torch._foreach_*` ops. `fused=False` (or a device without the kernel) computes the
Adam part with `_foreach_*` ops instead. On a CPU host a fresh 100 MB temporary costs more than the arithmetic on
it (page faults), so nothing is allocated per step. The global norm and the trust ratios stay on the device (no
host synchronisation).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = [
    "NVLAMB",
    "BertAdam",
    "load_state_keeping_hyperparameters",
    "make_lamb",
    "make_optimizer",
    "param_groups_for_bert",
]


# --------------------------------------------------------------------------------------------------------------
# Parameter groups.


def _no_decay(name: str) -> bool:
    """Biases and LayerNorm parameters get no weight decay (BERT's original rule, Hugging Face names)."""
    return name.endswith("bias") or "LayerNorm" in name


def param_groups_for_bert(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups: `weight_decay` for weight matrices, 0.0 for biases and LayerNorm weights/biases.

    Names come from `model.named_parameters()`, which lists a tied parameter (e.g. the word embeddings shared with
    the MLM decoder) once, under its first name. Frozen parameters (requires_grad=False) are left out; an empty
    group is dropped.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if _no_decay(name) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


# --------------------------------------------------------------------------------------------------------------
# The shared multi-tensor update.


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms of fp16/bf16 tensors are accumulated in fp32; fp32/fp64 keep their own precision."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _stacked_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-tensor L2 norms as one 1-D tensor [len(tensors)] in the accumulation dtype."""
    acc = _acc_dtype(tensors[0].dtype)
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=acc))


def _bucket_by_device_dtype(params: list[torch.Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    """Indices of `params` grouped by (device, dtype): one foreach call handles one bucket."""
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, p in enumerate(params):
        buckets.setdefault((p.device, p.dtype), []).append(i)
    return buckets


def _global_grad_norm(
    grads: list[torch.Tensor], max_grad_norm: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """G = the L2 norm of all `grads` together (0-d, on the first grad's device) and the clip divisor.

    The divisor is max(G, max_grad_norm) / max_grad_norm: dividing by it is dividing by G / max_grad_norm when
    G > max_grad_norm and leaves the gradients alone otherwise. None when clipping is off. No host sync.
    """
    device = grads[0].device
    norms = [_stacked_norms([grads[i] for i in idx]) for idx in _bucket_by_device_dtype(grads).values()]
    dtype = torch.float64 if any(n.dtype == torch.float64 for n in norms) else torch.float32
    total = torch.linalg.vector_norm(torch.cat([n.to(device=device, dtype=dtype) for n in norms]))
    if max_grad_norm is None:
        return total, None
    return total, total.clamp_min(max_grad_norm) / max_grad_norm


def _fused_kernel_available(device: torch.device) -> bool:
    return device.type in ("cpu", "cuda") and hasattr(torch, "_fused_adam_") and hasattr(torch, "_fused_adamw_")


def _neg_update_fused(
    d: list[torch.Tensor],
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    grad_divisor: torch.Tensor | None,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """d = -u = -(m_hat / (sqrt(v_hat) + eps) + weight_decay * p); m, v updated; grads divided by grad_divisor.

    One pass of torch's fused Adam kernel, used with lr=1 on d as its "parameter": with d = 0 and no decay it
    leaves exactly -(Adam direction) in d. With decay, d starts as a copy of p and the decoupled (AdamW) kernel
    scales it by 1 - lr * (1 + weight_decay) = -weight_decay before subtracting the direction: d = -u in the same
    pass. The kernel's grad_scale divides the gradients in place (it is GradScaler's unscale): that is the clip.
    """
    device = d[0].device
    if device.type != "cpu":  # the CUDA kernel reads the step counts on the device
        steps = list(torch.stack(steps).to(device).unbind(0))
    scale = None if grad_divisor is None else grad_divisor.to(device)
    if scale is not None and d[0].dtype == torch.float64:
        torch._foreach_div_(grads, scale)  # the kernel's grad_scale is float32: keep a float64 clip exact
        scale = None
    elif scale is not None:
        scale = scale.float()
    kwargs = dict(
        amsgrad=False, lr=1.0, beta1=beta1, beta2=beta2, eps=eps, maximize=False, grad_scale=scale, found_inf=None
    )
    if weight_decay != 0:
        torch._foreach_copy_(d, params)
        torch._fused_adamw_(d, grads, exp_avgs, exp_avg_sqs, [], steps, weight_decay=1.0 + weight_decay, **kwargs)
    else:
        torch._foreach_zero_(d)
        torch._fused_adam_(d, grads, exp_avgs, exp_avg_sqs, [], steps, weight_decay=0.0, **kwargs)


def _neg_update_foreach(
    d: list[torch.Tensor],
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    grad_divisor: torch.Tensor | None,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
) -> None:
    """The same as `_neg_update_fused` with `_foreach_*` ops (and optionally without bias correction)."""
    if grad_divisor is not None:
        torch._foreach_div_(grads, grad_divisor.to(grads[0].device))
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    # m_hat/(sqrt(v_hat)+eps) = m/(sqrt(v) + eps*sqrt(bc2)) * sqrt(bc2)/bc1 with per-parameter t; foreach has no
    # out= form, so d is filled by a copy and then transformed in place.
    torch._foreach_copy_(d, exp_avg_sqs)
    torch._foreach_sqrt_(d)
    if bias_correction:
        t = torch.stack(steps).to(torch.float64)
        bc2_sqrt = (1.0 - beta2**t).sqrt()
        torch._foreach_add_(d, (eps * bc2_sqrt).tolist())
        scale = (-bc2_sqrt / (1.0 - beta1**t)).tolist()
    else:
        torch._foreach_add_(d, eps)
        scale = -1.0
    # m / d as 1 / (d / m): no in-place "divide into" op exists. This order never overflows where m / d does not
    # (m = 0 gives d / 0 = inf and 1 / inf = 0), unlike 1 / d, which overflows fp16 where v underflows.
    torch._foreach_div_(d, exp_avgs)
    torch._foreach_reciprocal_(d)
    torch._foreach_mul_(d, scale)
    if weight_decay != 0:
        torch._foreach_add_(d, params, alpha=-weight_decay)


def _adam_lamb_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    scratch: list[torch.Tensor],
    *,
    grad_divisor: torch.Tensor | None,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    trust_ratio: bool,
    fused: bool,
) -> None:
    """One Adam/LAMB step for a bucket of same-device, same-dtype tensors, all in place.

    params/grads/exp_avgs/exp_avg_sqs/scratch: matching lists of tensors of each parameter's shape;
    steps: 0-d float32 CPU tensors (per-parameter step counts); grad_divisor: 0-d tensor or None (no clip).
    With trust_ratio=False this is AdamW (decoupled decay: p -= lr * (adam_direction + weight_decay * p)).
    """
    torch._foreach_add_(steps, 1.0)
    neg_u = scratch
    if fused and bias_correction:
        _neg_update_fused(
            neg_u, params, grads, exp_avgs, exp_avg_sqs, steps, grad_divisor, beta1, beta2, eps, weight_decay
        )
    else:
        _neg_update_foreach(
            neg_u,
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            steps,
            grad_divisor,
            beta1,
            beta2,
            eps,
            weight_decay,
            bias_correction,
        )

    if not trust_ratio:
        torch._foreach_add_(params, neg_u, alpha=lr)
        return
    # Trust ratio per tensor from the norms before the update, then p += lr * r * (-u).
    p_norm, u_norm = _stacked_norms(params), _stacked_norms(neg_u)
    ratio = torch.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, torch.ones_like(p_norm))
    torch._foreach_addcmul_(params, neg_u, list(ratio.unbind(0)), value=lr)


def _dynamo_off_when_imported(method):
    """torch.optim.Optimizer's `method` as torch has it (wrapped in torch._disable_dynamo, which imports
    torch._dynamo and sympy at its first call: 1.3 s at every training process's start here, 2.5 s on a busy
    machine, in eager runs too), except that while torch._dynamo has not been imported it calls the method
    itself: nothing can be compiling then, so there is nothing to disable. Once Dynamo is imported (a compiled
    run), every call goes through torch's wrapper."""
    import functools
    import sys

    plain = getattr(method, "__wrapped__", method)

    @functools.wraps(plain)
    def call(*args, **kwargs):
        return (method if "torch._dynamo" in sys.modules else plain)(*args, **kwargs)

    return call


class _AdamFamily(torch.optim.Optimizer):
    """State handling shared by NVLAMB and BertAdam; subclasses set `_trust_ratio(group)`."""

    # torch's Dynamo-disabled methods that an eager run calls (add_param_group from __init__): see
    # _dynamo_off_when_imported
    add_param_group = _dynamo_off_when_imported(torch.optim.Optimizer.add_param_group)
    zero_grad = _dynamo_off_when_imported(torch.optim.Optimizer.zero_grad)
    state_dict = _dynamo_off_when_imported(torch.optim.Optimizer.state_dict)
    load_state_dict = _dynamo_off_when_imported(torch.optim.Optimizer.load_state_dict)

    def __init__(self, params, defaults: dict[str, Any], max_grad_norm: float | None, fused: bool | None):
        lr, (beta1, beta2), eps, wd = defaults["lr"], defaults["betas"], defaults["eps"], defaults["weight_decay"]
        if not lr >= 0.0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {defaults['betas']}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not wd >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {wd}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 (or None for no clipping), got {max_grad_norm}")
        super().__init__(params, defaults)
        # One threshold for all groups together, so it is not a per-group setting.
        self.max_grad_norm = max_grad_norm
        self.fused = fused  # None: torch's fused Adam kernel where the device has it; False: foreach ops only
        self.last_grad_norm: torch.Tensor | None = None  # G of the last step (before clipping), for logging

    def _trust_ratio(self, group: dict[str, Any]) -> bool:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles/deep-copies only defaults, state and param_groups.
        return {
            **super().__getstate__(),
            "max_grad_norm": self.max_grad_norm,
            "fused": self.fused,
            "last_grad_norm": None,
        }

    def _scratch_for(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """A persistent buffer per parameter (never in state_dict): reused every step, so no fresh allocations."""
        store = self.__dict__.setdefault("_scratch", {})
        out = []
        for p in params:
            buf = store.get(p)
            if buf is None or buf.shape != p.shape or buf.device != p.device or buf.dtype != p.dtype:
                buf = store[p] = torch.empty_like(p, memory_format=torch.preserve_format)
            out.append(buf)
        return out

    def _collect(self, group: dict[str, Any]) -> list[torch.Tensor]:
        """Parameters of `group` that have a gradient; their state is created on first use."""
        params = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            state = self.state[p]
            if not state:
                # Step count as a CPU float tensor (like torch.optim), loadable with torch.load(weights_only=True).
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
        return params

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        groups = [(group, self._collect(group)) for group in self.param_groups]
        all_grads = [p.grad for _, params in groups for p in params]
        if not all_grads:
            return loss
        self.last_grad_norm, grad_divisor = _global_grad_norm(all_grads, self.max_grad_norm)

        for group, params in groups:
            beta1, beta2 = group["betas"]
            for (device, _), idx in _bucket_by_device_dtype(params).items():
                ps = [params[i] for i in idx]
                fused = self.fused is not False and _fused_kernel_available(device)
                states = [self.state[p] for p in ps]
                _adam_lamb_update(
                    ps,
                    [p.grad for p in ps],
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [s["step"] for s in states],
                    self._scratch_for(ps),
                    grad_divisor=grad_divisor,
                    lr=float(group["lr"]),
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    bias_correction=group.get("bias_correction", True),
                    trust_ratio=self._trust_ratio(group),
                    fused=fused,
                )
        return loss


class NVLAMB(_AdamFamily):
    """LAMB with NVIDIA's conventions (steps 1-6 in this module's docstring), for BERT pre-training.

    Args:
        params: parameters or groups (see `param_groups_for_bert`); lr/betas/eps/weight_decay/use_nvlamb may be
            set per group.
        lr: learning rate (a float; the schedulers in schedulers.py set it every step).
        betas: (b1, b2) for the moment averages.
        eps: added to sqrt(v_hat).
        weight_decay: decoupled decay, added to the update direction u (so it enters the trust ratio).
        max_grad_norm: threshold for the global gradient-norm clip over all groups together; None turns it off.
        use_nvlamb: apply the trust ratio also to groups with weight_decay == 0 (NVIDIA's "NVLAMB" switch). With
            the default False, the bias/LayerNorm group takes plain Adam-direction steps (r = 1).
        fused: None (default) uses torch's fused Adam kernel for the Adam part on CPU and CUDA; False uses
            `_foreach_*` ops only. Same maths either way (equal to float rounding).

    State per parameter: `step` (0-d float32 CPU tensor, counts the steps it took; a parameter whose grad is None
    on a step is skipped and its count does not move), `exp_avg`, `exp_avg_sq` (in the parameter's dtype: keep
    fp32 master weights under fp16 autocast, as the recipe does; fp16 state lets v = (1-b2)*g^2 underflow).
    `last_grad_norm` holds the unclipped global norm G of the last step (a 0-d tensor on the device) for logging.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float | None = 1.0,
        use_nvlamb: bool = False,
        fused: bool | None = None,
    ):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, use_nvlamb=use_nvlamb)
        super().__init__(params, defaults, max_grad_norm, fused)

    def _trust_ratio(self, group: dict[str, Any]) -> bool:
        return bool(group["use_nvlamb"]) or group["weight_decay"] != 0


class BertAdam(_AdamFamily):
    """AdamW for fine-tuning, with the global gradient clip of the original BertAdam.

    p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), i.e. torch.optim.AdamW's maths (decoupled decay),
    after the same global clip as NVLAMB (applied in place to p.grad, as clip_grad_norm_ does). `fused` as in
    NVLAMB (bias_correction=False always takes the foreach path).

    Differences from the original BertAdam (pytorch-pretrained-bert / NVIDIA), on purpose:
    - bias_correction=True by default (correct AdamW). The original had none; pass bias_correction=False to get
      its update m / (sqrt(v) + eps) exactly.
    - the original clipped each tensor to max_grad_norm separately; here the clip is over all gradients together
      (what `torch.nn.utils.clip_grad_norm_` and every modern recipe do). max_grad_norm=None turns it off.
    - no built-in warm-up schedule: use a scheduler from schedulers.py (e.g. LinearWarmUpScheduler).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 5e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float | None = 1.0,
        bias_correction: bool = True,
        fused: bool | None = None,
    ):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults, max_grad_norm, fused)

    def _trust_ratio(self, group: dict[str, Any]) -> bool:
        return False


# --------------------------------------------------------------------------------------------------------------
# Optional apex FusedLAMB.


def _all_cuda(params: list) -> bool:
    tensors = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
    return bool(tensors) and all(t.is_cuda for t in tensors)


def make_lamb(
    params: Iterable,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    max_grad_norm: float | None = 1.0,
    use_nvlamb: bool = False,
    prefer_fused: bool = True,
) -> torch.optim.Optimizer:
    """NVLAMB, or apex's FusedLAMB (same maths, one fused kernel) when asked for, importable and all params CUDA.

    apex is optional and never required. Its state_dict layout differs (a per-group step), so keep one choice for
    the life of a run: a checkpoint of one does not load into the other.
    """
    params = list(params)
    if prefer_fused and max_grad_norm is not None and _all_cuda(params):
        try:
            from apex.optimizers import FusedLAMB  # NVIDIA apex, not the unrelated PyPI package "apex"
        except ImportError:
            FusedLAMB = None
        if FusedLAMB is not None:
            return FusedLAMB(
                params,
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                bias_correction=True,
                adam_w_mode=True,
                grad_averaging=True,
                max_grad_norm=max_grad_norm,
                use_nvlamb=use_nvlamb,
            )
    return NVLAMB(
        params,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        use_nvlamb=use_nvlamb,
    )


def make_optimizer(
    name: str,
    params: Iterable,
    lr: float,
    weight_decay: float = 0.01,
    max_grad_norm: float | None = 1.0,
    use_nvlamb: bool = False,
    prefer_fused: bool = True,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.Optimizer:
    """Pre-training's optimizer by name: "nvlamb" (`make_lamb`) or "adamw" (BertAdam with bias correction: AdamW's
    maths on PyTorch's fused kernel, after the same global gradient clip)."""
    if name == "nvlamb":
        return make_lamb(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm,
            use_nvlamb=use_nvlamb,
            prefer_fused=prefer_fused,
        )
    if name == "adamw":
        return BertAdam(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm,
            bias_correction=True,
        )
    raise ValueError(f"unknown optimizer {name!r}: choose nvlamb or adamw")


# ---------------------------------------------------------------------------------------------------------------
# The peak learning rate at a small global batch: the rule of the CPU preset (scripts/configs/pretrain_config.sh:
# cpu), measured on CPU with bench/pretrain_sweep.py (bench/STUDIES.md, "The learning-rate rule").
# NVIDIA's 6e-3 at 65,536 sequences a step is LAMB's large-batch design point and says nothing about 32-256.

SMALL_BATCH_LR = 1e-2  # NVLAMB's best peak rate at the reference batch (twice it collapsed onto the plateau)
SMALL_BATCH_REFERENCE = 32  # global sequences per optimizer step at which SMALL_BATCH_LR was measured
SMALL_BATCH_EXPONENT = 0.5  # lr_best ~ batch ** exponent: 1e-2 best at 32, 2e-2 better than 1e-2 at 128 (the same page)


def small_batch_learning_rate(global_batch: int) -> float:
    """NVLAMB's peak learning rate for pre-training a small BERT at `global_batch` sequences per optimizer step:
    SMALL_BATCH_LR * (global_batch / SMALL_BATCH_REFERENCE) ** SMALL_BATCH_EXPONENT. Measured on CPU between 32 and
    128 sequences a step, in runs of 40,000 sequences. It does not extrapolate: at 256 (BERT-mini on an H200, runs
    of 8,400-16,900 steps, bench/STUDIES.md) its 2.83e-2 diverged, 1e-2 learned and then fell back onto the unigram
    plateau, and 4e-3 learned; the small_1gpu_bf16 preset uses AdamW 1e-3, the best there."""
    if global_batch < 1:
        raise ValueError(f"global batch {global_batch}: must be at least 1")
    return SMALL_BATCH_LR * (global_batch / SMALL_BATCH_REFERENCE) ** SMALL_BATCH_EXPONENT


def _same(a: Any, b: Any) -> bool:
    """Equal hyper-parameter values, whether numbers, tuples / lists (betas come back either way) or tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def load_state_keeping_hyperparameters(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """Load a saved optimizer's state (moments, step counts) but keep this optimizer's hyper-parameters (betas, eps,
    weight decay...; torch's load_state_dict would take the saved ones). The LR is left to the scheduler. Returns
    {name: (saved value, this one's)} for each that differs, as schedulers' `changes()` does."""
    ours = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    changed = {}
    for group, own in zip(optimizer.param_groups, ours, strict=True):
        changed.update(
            {
                k: (group.get(k), v)
                for k, v in own.items()
                if k not in ("lr", "initial_lr") and not _same(group.get(k), v)
            }
        )
        group.update(own)
    return changed
