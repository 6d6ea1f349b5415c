"""Attention beside modeling.py: which kernel computes it, and the calls. Pure PyTorch, no state but two caches.

What it holds, in order: `sdpa`, the padded path's one F.scaled_dot_product_attention call, with the rule that keeps
attention dropout at the rate asked for (`sdpa_backends`); `Kernel`, `KERNELS` and `choose_kernel`, the rule that
picks the variable-length kernel of the unpadded path; `varlen_attention`, the attention call over the real tokens'
packed [T, 3, N, D] projections (bert_padding.Unpadded says where each sequence is).

Padded attention and dropout. Some cuDNN SDPA kernels resolve the dropout probability only in steps of 1/16 (pytorch
#174245): asked for 0.1, they drop 0.0625 or 0.125 of the probabilities. torch's router sends training with dropout
to cuDNN on Hopper (an H200 profile of the padded path ran cudnn_generated_fort_native_sdpa_sm90_flash_fprop/bprop).
So on a GPU, training with a dropout probability that is not a multiple of 1/16 gets the FlashAttention and
memory-efficient kernels only, which apply any rate (unless the caller itself chose kernels without them); the
first such call says so in one log line. A GPU run's
dropout probe (bench/gpu_speed.py dropout_probe) measures each kernel's rate; this rule stays until one shows cuDNN
exact.

Variable-length kernels (checked against torch 2.13): `varlen_attn` (`torch.nn.attention.varlen.varlen_attn`, CUDA,
fp16/bf16, no dropout argument: chosen only when the effective attention dropout is 0, i.e. attention dropout 0 in
the config or eval mode); `flash_varlen`, the FlashAttention-2 kernel under it called directly
(`aten::_flash_attention_forward`, CUDA sm80+, fp16/bf16, applies dropout, differentiable; BERT's pre-training with
attention dropout 0.1 on a GPU takes this one); `flash_attn` (`flash_attn.flash_attn_varlen_qkvpacked_func`, when
the package is importable); else `padded_sdpa`: pad q/k/v back to [B, N, S, D] around one `sdpa` call with the
key-padding mask (every device; the CPU path). The first use of each choice is logged in one line saying which
kernel runs and why. cuDNN's ragged attention is not among them: torch 2.11's backward of it is wrong for this
layout (pytorch PR #186142), and at head size 64 with dropout it was within 10% of FlashAttention-2 on an H200.

Packed rows go through the same variable-length path: every packed sequence is its own entry of cu_seqlens (so the
varlen kernels never attend across sequences), and padded_sdpa gets the block-diagonal [B, 1, S, S] mask.

Notation as in modeling.py: B batch, S sequence length, T real tokens of the batch, N heads, D head size.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bert_padding import Unpadded, pad, unpad

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# Padded attention: one SDPA call, at the dropout rate asked for

DROPOUT_EXACT_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
"""The SDPA kernels that apply any dropout probability (cuDNN's may round it to a multiple of 1/16)."""


def sdpa_backends(device_type: str, dropout_p: float, enabled: frozenset[SDPBackend]) -> tuple[SDPBackend, ...] | None:
    """The SDPA kernels a call may use, or None for torch's choice among the `enabled` ones: on a GPU, with a
    dropout probability that is not a multiple of 1/16 while cuDNN's kernel is enabled, the enabled ones that apply
    it exactly. A caller that enabled no such kernel (a probe of cuDNN alone) keeps its choice."""
    if device_type != "cuda" or dropout_p == 0.0 or float(dropout_p * 16).is_integer():
        return None
    exact = tuple(b for b in DROPOUT_EXACT_BACKENDS if b in enabled)
    if SDPBackend.CUDNN_ATTENTION not in enabled or not exact:
        return None
    return exact


def enabled_backends() -> frozenset[SDPBackend]:
    """The SDPA kernels torch may pick for a CUDA tensor now (torch.backends.cuda's switches, which sdpa_kernel
    sets)."""
    cuda = torch.backends.cuda
    switches = {
        SDPBackend.FLASH_ATTENTION: cuda.flash_sdp_enabled(),
        SDPBackend.EFFICIENT_ATTENTION: cuda.mem_efficient_sdp_enabled(),
        SDPBackend.CUDNN_ATTENTION: cuda.cudnn_sdp_enabled(),
        SDPBackend.MATH: cuda.math_sdp_enabled(),
    }
    return frozenset(backend for backend, on in switches.items() if on)


def _backends_for(device_type: str, dropout_p: float) -> tuple[SDPBackend, ...] | None:
    """sdpa_backends for this call: torch's switches are read on a GPU only (they steer CUDA kernels alone)."""
    return None if device_type != "cuda" else sdpa_backends("cuda", dropout_p, enabled_backends())


@functools.lru_cache(maxsize=None)
def _announce_backends(dropout_p: float) -> None:
    log.info(
        "attention dropout %s is not a multiple of 1/16: padded attention runs on FlashAttention or the "
        "memory-efficient kernel, which apply it exactly (some cuDNN kernels round it)",
        dropout_p,
    )


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p) on a kernel that applies `dropout_p` exactly.
    q, k, v [B, N, S, D], attn_mask [B, 1, 1, S] or [B, 1, S, S] bool (True = attend) or None -> [B, N, S, D]."""
    backends = _backends_for(q.device.type, dropout_p)
    if backends is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    if not torch.compiler.is_compiling():  # a log call would break a compiled graph: eager calls announce it
        _announce_backends(dropout_p)
    with sdpa_kernel(list(backends)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


# ----------------------------------------------------------------------------------------------------------------
# Variable-length attention: which kernel


class Kernel(NamedTuple):
    name: str  # one of KERNELS
    reason: str  # one line: why this kernel and not a faster one


KERNELS = ("varlen_attn", "flash_varlen", "flash_attn", "padded_sdpa")
"""The variable-length attention kernels a run may name (--varlen_kernel, which may also be "auto")."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def _constant_under_compile(fn):
    """torch.compiler.assume_constant_result without its import of torch._dynamo (1.6 s at every process start,
    for every script, compiled or not): that decorator only sets this attribute, which Dynamo reads when it traces a
    call (tests/test_padding.py checks that torch's decorator still sets exactly this; parallelize.py also applies
    torch's own decorator before it compiles)."""
    fn._dynamo_marked_constant = True
    return fn


def _torch_flash_available() -> bool:
    """torch's own FlashAttention-2 varlen entry point (aten::_flash_attention_forward, the kernel varlen_attn and
    nested tensors call), built into this torch and supported by the current GPU (sm80 and newer)."""
    if not hasattr(torch.ops.aten, "_flash_attention_forward") or not torch.cuda.is_available():
        return False
    return torch.backends.cuda.is_flash_attention_available() and torch.cuda.get_device_capability() >= (8, 0)


@_constant_under_compile  # a rule over constants: a compiled graph holds its answer, not its code
def choose_kernel(device_type: str, dtype: torch.dtype, dropout_p: float, preference: str = "auto") -> Kernel:
    """The kernel for attention over [T, N, D] sequences on this device and dtype with this *effective* attention
    dropout (0 in eval mode). A configured dropout is never dropped: dropout_p > 0 never picks varlen_attn.

    preference: "auto" (the rule below) or a name from KERNELS (--varlen_kernel); a named kernel that cannot run
    here gives way to the rule, and the reason says so."""
    return _choose_kernel(device_type, dtype, dropout_p, preference)


@functools.lru_cache(maxsize=None)  # every layer asks at every forward
def _choose_kernel(device_type: str, dtype: torch.dtype, dropout_p: float, preference: str) -> Kernel:
    auto = _auto_kernel(device_type, dtype, dropout_p)
    if preference in ("auto", auto.name):
        return auto
    if preference not in KERNELS:
        raise ValueError(f"varlen_kernel {preference!r} is not one of {('auto',) + KERNELS}")
    cuda_half = device_type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    usable = {
        "padded_sdpa": True,
        "varlen_attn": cuda_half and dropout_p == 0.0 and _importable("torch.nn.attention.varlen"),
        "flash_varlen": cuda_half and _torch_flash_available(),
        "flash_attn": cuda_half and _importable("flash_attn"),
    }[preference]
    if usable:
        return Kernel(preference, "asked for by --varlen_kernel")
    return Kernel(
        auto.name,
        f"--varlen_kernel asks for {preference}, which cannot run here ({device_type} {dtype}, "
        f"attention dropout {dropout_p}); {auto.reason}",
    )


choose_kernel.cache_clear = _choose_kernel.cache_clear  # for tests that change what is importable


def _auto_kernel(device_type: str, dtype: torch.dtype, dropout_p: float) -> Kernel:
    half = dtype in (torch.float16, torch.bfloat16)
    if device_type != "cuda":
        return Kernel(
            "padded_sdpa",
            f"{device_type}: the varlen kernels are CUDA-only, so attention pads around "
            f"one SDPA call and every other op runs on the real tokens",
        )
    if not half:
        return Kernel("padded_sdpa", f"cuda {dtype}: the varlen kernels need fp16/bf16")
    if dropout_p == 0.0 and _importable("torch.nn.attention.varlen"):
        return Kernel(
            "varlen_attn", "cuda, attention dropout 0 (config or eval): torch's varlen_attn, which has no dropout"
        )
    if _torch_flash_available():
        return Kernel(
            "flash_varlen",
            f"cuda, attention dropout {dropout_p}: torch's FlashAttention-2 varlen kernel "
            f"(aten::_flash_attention_forward), which applies it",
        )
    if _importable("flash_attn"):
        return Kernel(
            "flash_attn",
            f"cuda, attention dropout {dropout_p}: flash_attn's varlen kernel applies it "
            f"(torch's varlen_attn has no dropout)",
        )
    return Kernel(
        "padded_sdpa",
        f"cuda, attention dropout {dropout_p}: no FlashAttention varlen kernel with dropout "
        f"here (torch's needs sm80+, flash_attn is not installed), so attention pads "
        f"around SDPA, which applies it",
    )


@functools.lru_cache(maxsize=None)
def _announce(kernel: Kernel) -> None:
    log.info("variable-length attention: %s (%s)", kernel.name, kernel.reason)


# ----------------------------------------------------------------------------------------------------------------
# Variable-length attention: the call


def varlen_attention(qkv: torch.Tensor, info: Unpadded, dropout_p: float, preference: str = "auto") -> torch.Tensor:
    """Bidirectional attention of every sequence over its own real tokens.

    qkv [rows, 3, N, D] (the query/key/value projections of the real tokens, then any extra rows of a static
    layout), dropout_p the effective attention dropout (0 in eval), preference --varlen_kernel -> [rows, N, D].
    Extra rows (`info.real` False: a static-shape layout made outside the model) are in no sequence of cu_seqlens,
    and are zeroed on the way in and out: whatever a kernel writes there (its output, or the gradient it leaves in
    rows it never visits) reaches no weight."""
    if info.real is None:
        return _attend(qkv, info, dropout_p, preference)
    real = info.real.view(-1, 1, 1)  # [R, 1, 1]
    qkv = torch.where(real[:, None], qkv, 0)  # [R, 3, N, D]; backward: zero gradient at the extra rows
    return torch.where(real, _attend(qkv, info, dropout_p, preference), 0)  # [R, N, D]


def _attend(qkv: torch.Tensor, info: Unpadded, dropout_p: float, preference: str) -> torch.Tensor:
    """varlen_attention's kernel call: qkv [rows, 3, N, D] -> [rows, N, D] over the sequences of cu_seqlens."""
    kernel = choose_kernel(qkv.device.type, qkv.dtype, float(dropout_p), preference)
    if not torch.compiler.is_compiling():  # a log call would break a compiled graph: announced by eager calls
        _announce(kernel)
    if kernel.name == "varlen_attn":
        from torch.nn.attention.varlen import varlen_attn  # CUDA builds only; imported where it runs

        q, k, v = qkv.unbind(1)  # each [T, N, D]
        return varlen_attn(q, k, v, info.cu_seqlens, info.cu_seqlens, info.max_seqlen, info.max_seqlen)
    if kernel.name == "flash_varlen":
        q, k, v = qkv.unbind(1)  # each [T, N, D], the head dimension contiguous as the kernel needs
        # (output, logsumexp, rng state, unused, debug mask); autograd runs aten::_flash_attention_backward with
        # the same dropout mask (the rng state), and inductor calls the op as it is (a fallback kernel).
        return torch.ops.aten._flash_attention_forward(
            q, k, v, info.cu_seqlens, info.cu_seqlens, info.max_seqlen, info.max_seqlen, dropout_p, False, False
        )[0]
    if kernel.name == "flash_attn":
        from flash_attn import flash_attn_varlen_qkvpacked_func  # an optional package, imported where it runs

        return flash_attn_varlen_qkvpacked_func(qkv, info.cu_seqlens, info.max_seqlen, dropout_p=dropout_p)
    # padded_sdpa: one [T, 3H] -> [B, S, 3H] copy, SDPA with the key mask (the block-diagonal mask of packed rows),
    # then back to the real tokens (pad and unpad follow a static layout's sentinel).
    padded = pad(qkv, info)  # [B, S, 3, N, D], zeros at padding (masked out as keys)
    q, k, v = padded.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, N, S, D]
    y = sdpa(q, k, v, info.key_mask, dropout_p)  # [B, N, S, D]
    return unpad(y.transpose(1, 2), info)  # [B, S, N, D] -> [T, N, D]
