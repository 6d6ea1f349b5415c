"""The speed path beside modeling.py: unpadding, variable-length attention, the fixed-slot masked-LM gather and
dropout whose mask is kept in bits.

What it holds, in order: `Unpadded` (where a batch's real tokens are: flat indices, int32 cumulative sequence
offsets `cu_seqlens`, the longest length) with `unpad` / `pad` ([B, S, ...] <-> [T, ...], T = real tokens) and
`round_rows` (the [T, ...] layout padded with zero rows to a multiple of the token count: float8's products need 16)
and `fixed_rows` (a static-shape layout: T rounded up to one of a few sizes, the offsets to a fixed length, so that a
compiled step sees the same shapes at every micro-batch and CUDA graphs can replay it);
`Packed` / `packed_layout` (sequence packing: several sequences a row, each attending only to itself, positions
restarting at 0 in each); `choose_kernel`, the rule that picks the variable-length attention kernel;
`varlen_attention`, the attention call over packed [T, 3, N, D] projections; `gather_indexes`, Google's fixed-slot
gather for the masked-LM head; `BitMaskDropout`, dropout that keeps its mask for the backward in 1 bit an element
instead of torch's byte (BertConfig.dropout_mask_bits).

Kernels (checked against torch 2.13): `torch.nn.attention.varlen.varlen_attn` (CUDA, fp16/bf16, has no dropout
argument: it is chosen only when the effective attention dropout is 0, i.e. a config with
attention_probs_dropout_prob 0 or eval mode), `flash_varlen`: the FlashAttention-2 kernel under it called
directly (`aten::_flash_attention_forward`, CUDA sm80+, fp16/bf16, applies dropout, differentiable; BERT's
pre-training with attention dropout 0.1 on a GPU takes this one), `flash_attn.flash_attn_varlen_qkvpacked_func`
(CUDA, fp16/bf16, applies dropout; when the package is importable), `cudnn_varlen`: cuDNN's fused attention
over the same ragged layout (`aten::_cudnn_attention_forward` with cumulative lengths; applies dropout; only when
named: torch's own varlen_attn leaves it switched off, and it is checked on a GPU by `bench.gpu_speed check_flash
--kernel cudnn_varlen` before any measurement uses it), else `padded_sdpa`: pad q/k/v back to
[B, N, S, D] around one F.scaled_dot_product_attention call with the key-padding mask and the configured dropout
(every device; the CPU path). The first use of each choice is logged in one line saying which kernel runs and why.

Packed rows go through the same variable-length path: every packed sequence is its own entry of cu_seqlens (so the
varlen kernels never attend across sequences), and the padded fallbacks (padded_sdpa here, and modeling.py's
padded encoder) get the equivalent block-diagonal [B, 1, S, S] mask instead of the key-padding mask.

Notation as in modeling.py: B batch, S sequence length, T real tokens of the batch, N heads, D head size,
K packed sequences a row (slots; unused slots allowed).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import NamedTuple

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# Unpad / pad


class Unpadded(NamedTuple):
    """Where the real tokens of a [B, S] batch are; passed to every layer in place of the attention mask."""

    indices: torch.Tensor  # [T] int64 flat (row-major) positions of the real tokens in [B * S]
    cu_seqlens: torch.Tensor  # [B + 1] int32 offsets: sequence b is rows cu_seqlens[b]:cu_seqlens[b + 1] of [T, ...]
    # (packed rows: [number of packed sequences + 1], one entry per sequence, not per row)
    max_seqlen: int  # the longest sequence of the batch (a Python int: varlen kernels size their grid with it)
    batch: int  # B
    seqlen: int  # S
    key_mask: torch.Tensor | None  # [B, 1, 1, S] bool, True = a real key: the padded fallback's SDPA mask
    # (packed rows: the block-diagonal [B, 1, S, S] mask, True = query and key in the same sequence); None when
    # made on the host (host_unpad_info): the model derives it on the device
    rows: int = 0  # rows of the flat layout (round_rows, fixed_rows): T real tokens, then rows - T zero rows; 0 = T
    real: torch.Tensor | None = None  # [rows] bool, True at the T real tokens: set by fixed_rows, whose layout keeps
    # T out of every shape (indices then has `rows` entries, the extra ones pointing at the sentinel position B * S)

    @property
    def fixed(self) -> bool:
        """True for fixed_rows' static-shape layout."""
        return self.real is not None

    @property
    def tokens(self) -> int:
        """T, the real tokens (a static shape: no host sync); for a fixed layout, its rows (`real` tells the T)."""
        return self.indices.shape[0]

    @property
    def total_rows(self) -> int:
        """Rows of the flat [rows, ...] layout the layers see: T, or T rounded up by round_rows."""
        return self.rows or self.tokens

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Unpadded":
        """The same description with its tensors on `device` (the lengths stay Python ints)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return self._replace(
            indices=move(self.indices),
            cu_seqlens=move(self.cu_seqlens),
            key_mask=move(self.key_mask),
            real=move(self.real),
        )


def has_padding(attention_mask: torch.Tensor | None) -> bool:
    """True when some position is padding (one host sync)."""
    return attention_mask is not None and not bool(attention_mask.bool().all())


def unpad_info(attention_mask: torch.Tensor, packed: Packed | None = None) -> Unpadded:
    """The Unpadded description of a [B, S] mask (1 = real token). Real tokens need not be left-aligned.

    With `packed` (packed_layout of the same mask) every packed sequence gets its own cu_seqlens entry, and the
    padded fallback's mask is the block-diagonal one: attention never crosses from one sequence to another."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [batch, seq], got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    B, S = mask.shape
    indices = mask.reshape(-1).nonzero().squeeze(1)  # [T]
    if packed is None:
        lengths = mask.sum(1, dtype=torch.int32)  # [B]
        key_mask = mask[:, None, None, :]  # [B, 1, 1, S]
    else:
        # Row-major order of the real tokens is the sequences one after another (slot order within a row), so
        # the sequences' lengths, unused slots (length 0) left out, cut [T] into the packed sequences.
        lengths = packed.lengths.reshape(-1)  # [B * K]
        lengths = lengths[lengths > 0]  # [number of packed sequences] (a host sync, as nonzero above)
        key_mask = packed.block_mask  # [B, 1, S, S]
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # [sequences + 1], starts at 0
    return Unpadded(indices, cu_seqlens, int(lengths.max()), B, S, key_mask)


def host_unpad_info(
    attention_mask: torch.Tensor, sequence_starts: torch.Tensor | None = None, fixed_sizes: int = 0, multiple: int = 1
) -> Unpadded | None:
    """unpad_info of a micro-batch while it is still on the host, or None when it has no padding and is not packed.
    fixed_sizes > 0: already in fixed_rows' static layout (with `multiple`), so a whole-model graph can take it.

    Why: on a GPU, unpad_info's nonzero and longest length are host syncs that drain the queue at every
    micro-batch (measured on an H200, BERT-large phase 2: the GPU idle 38% of the step). On the host they cost
    microseconds; the loop moves the result with the batch and the model takes it (BertModel's `unpadded`)."""
    packed = None if sequence_starts is None else packed_layout(attention_mask, sequence_starts, block_mask=False)
    if packed is None and not has_padding(attention_mask):
        return None
    info = unpad_info(attention_mask, packed)._replace(key_mask=None)  # the mask is derived on the device
    if fixed_sizes:
        info = fixed_rows(info, fixed_sizes, multiple, sequence_slots(attention_mask, packed))
    return info


def round_rows(info: Unpadded, multiple: int) -> Unpadded:
    """The same description with its flat layout padded to a multiple of `multiple` rows: T real tokens, then zero
    rows that no sequence of cu_seqlens holds. Why: float8's products need a token count divisible by 16 (it is
    the inner dimension of the weight gradient); the extra rows stay out of attention and out of pad()."""
    if multiple <= 1 or info.fixed:
        return info
    return info._replace(rows=round_up(info.tokens, multiple))


def round_up(n: int, multiple: int) -> int:
    """The least multiple of `multiple` that is at least n."""
    return -(-n // multiple) * multiple


MAX_FIXED_SIZES = 8
"""fixed_rows' most sizes: each is a graph of every compiled region, and torch.compile keeps 8 a region by default."""


def sequence_slots(attention_mask: torch.Tensor, packed: Packed | None) -> int:
    """How many sequences a [B, S] batch can hold: B, or B * K with K packed slots a row (cu_seqlens' fixed size
    minus one in fixed_rows' layout)."""
    return attention_mask.shape[0] * (1 if packed is None else packed.lengths.shape[1])


def fixed_rows(info: Unpadded, sizes: int, multiple: int = 1, sequences: int | None = None) -> Unpadded:
    """The same tokens in a static-shape layout, MLPerf's fixed buffer generalised to `sizes` buffer sizes: rows R
    = T rounded up to a multiple of ceil(B * S / sizes) (itself a multiple of `multiple`), so a compiled layer sees
    at most `sizes` shapes; the real tokens first, then zero rows; indices padded to R with the sentinel position
    B * S (unpad reads zeros there, pad drops it); cu_seqlens padded to `sequences` + 1 entries (default B) by
    repeating its last, so the extra sequences are empty; max_seqlen S. Nothing of it depends on T but the values:
    no recompilation between micro-batches of one size, no host sync, and CUDA graphs can replay the step.
    The extra rows cost only row-wise work: attention sees them as nobody's (varlen_attention zeroes them, forward
    and back, whatever a kernel leaves there)."""
    if info.fixed:
        return info
    if sizes < 1:
        raise ValueError(f"fixed_rows needs at least one size, got {sizes}")
    total = info.batch * info.seqlen  # B * S: every position of the batch, and the sentinel's index
    step = round_up(round_up(total, sizes) // sizes, multiple)  # ceil(B*S / sizes), rounded up to `multiple`
    T = info.tokens
    rows = max(step, round_up(T, step))  # R
    indices = torch.cat([info.indices, info.indices.new_full((rows - T,), total)])  # [R]
    sequences = info.batch if sequences is None else sequences
    cu = info.cu_seqlens  # [used sequences + 1]
    if cu.shape[0] > sequences + 1:
        raise ValueError(f"fixed_rows: {cu.shape[0] - 1} sequences do not fit the {sequences} given")
    cu_seqlens = torch.cat([cu, cu[-1:].expand(sequences + 1 - cu.shape[0])])  # [sequences + 1]
    real = torch.arange(rows, device=info.indices.device) < T  # [R]
    return info._replace(indices=indices, cu_seqlens=cu_seqlens, max_seqlen=info.seqlen, rows=rows, real=real)


def unpad(x: torch.Tensor, info: Unpadded) -> torch.Tensor:
    """[B, S, ...] -> [rows, ...]: the rows of the real tokens, in row-major order, then round_rows' zero rows."""
    flat = x.reshape(info.batch * info.seqlen, *x.shape[2:])  # [B * S, ...]
    if info.fixed:  # indices [R], the extra ones at the sentinel B * S: a zero row appended there
        return torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])]).index_select(0, info.indices)  # [R, ...]
    real = flat.index_select(0, info.indices)  # [T, ...]
    extra = info.total_rows - info.tokens
    return torch.cat([real, real.new_zeros(extra, *real.shape[1:])]) if extra else real


def pad(x: torch.Tensor, info: Unpadded) -> torch.Tensor:
    """[rows, ...] -> [B, S, ...] with zeros at the padding positions (the inverse of unpad on the real tokens)."""
    total = info.batch * info.seqlen
    if info.fixed:  # every extra row goes to the sentinel row B * S, dropped; zeroed first, so the copies agree
        x = torch.where(info.real.view(-1, *[1] * (x.dim() - 1)), x, 0)  # [R, ...]
        out = x.new_zeros(total + 1, *x.shape[1:]).index_copy(0, info.indices, x)[:total]  # [B * S, ...]
        return out.view(info.batch, info.seqlen, *x.shape[1:])  # [B, S, ...]
    x = x[: info.tokens] if info.rows else x  # [T, ...]: round_rows' extra rows are nobody's
    out = x.new_zeros(total, *x.shape[1:]).index_copy(0, info.indices, x)  # [B * S, ...]
    return out.view(info.batch, info.seqlen, *x.shape[1:])  # [B, S, ...]


# ----------------------------------------------------------------------------------------------------------------
# Sequence packing: several sequences share a row


class Packed(NamedTuple):
    """Where the packed sequences of a [B, S] batch are. Static shapes (no host sync): the padded path can use it
    under torch.compile."""

    sequence_index: torch.Tensor  # [B, S] int64: k at a token of the row's k-th sequence, -1 at padding
    position_ids: torch.Tensor  # [B, S] int64: the token's position within its own sequence (0 at padding)
    block_mask: torch.Tensor | None  # [B, 1, S, S] bool: True where query and key are in the same sequence;
    # padding attends to the row's padding only (a query row that attends to nothing would give NaN in SDPA). None
    # when not asked for: B*S*S comparisons, 27 ms a micro-batch of 64 x 512 on the H200 machine's host CPU
    lengths: torch.Tensor  # [B, K] int32: real tokens of each slot's sequence (0: an unused slot)


def packed_layout(attention_mask: torch.Tensor, sequence_starts: torch.Tensor, block_mask: bool = True) -> Packed:
    """The Packed description of rows holding several sequences back to back (without its block mask unless
    `block_mask`: the host's uses need only the lengths).

    attention_mask [B, S] (1 = a real token of any sequence), sequence_starts [B, K] int: where each slot's
    sequence starts (its [CLS]), ascending over the used slots. Slot 0 always holds the row's first sequence at 0;
    a later slot at position 0 is unused (the convention of masked_lm_positions: nothing else can start at 0).
    A sequence runs from its start to the next used start (or the row's end); padding is wherever the mask is 0."""
    if attention_mask.dim() != 2 or sequence_starts.dim() != 2 or sequence_starts.shape[0] != attention_mask.shape[0]:
        raise ValueError(
            f"packing needs attention_mask [batch, seq] and sequence starts [batch, K], got shapes "
            f"{tuple(attention_mask.shape)} and {tuple(sequence_starts.shape)}"
        )
    mask = attention_mask.bool()  # [B, S]
    B, S = mask.shape
    starts = sequence_starts.long()  # [B, K]
    K = starts.shape[1]
    slot = torch.arange(K, device=starts.device)
    used = (starts > 0) | (slot == 0)  # [B, K]
    column = torch.arange(S, device=mask.device)  # [S]
    begun = (starts[:, None, :] <= column[None, :, None]) & used[:, None, :]  # [B, S, K]: slot k has started by j
    index = torch.where(mask, begun.sum(-1) - 1, -1)  # [B, S]: the last slot started (ascending starts), -1 padding
    start_of_token = starts.gather(1, index.clamp(min=0))  # [B, S]: the start of each token's sequence
    position_ids = torch.where(mask, column - start_of_token, 0)  # [B, S]: restarts at 0 in every sequence
    lengths = (index[:, :, None] == slot).sum(1, dtype=torch.int32)  # [B, S, K] -> [B, K]
    if not block_mask:
        return Packed(index, position_ids, None, lengths)
    return Packed(index, position_ids, (index[:, :, None] == index[:, None, :])[:, None], lengths)  # [B, 1, S, S]


# ----------------------------------------------------------------------------------------------------------------
# Variable-length attention: which kernel, and the call


class Kernel(NamedTuple):
    name: str  # one of KERNELS
    reason: str  # one line: why this kernel and not a faster one


KERNELS = ("varlen_attn", "flash_varlen", "flash_attn", "cudnn_varlen", "padded_sdpa")
"""The variable-length attention kernels, for BertConfig.varlen_kernel (which may also be "auto")."""


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


def _cudnn_attention_available() -> bool:
    """cuDNN's fused attention (aten::_cudnn_attention_forward) in this torch, with cuDNN on an sm80+ GPU."""
    return (
        hasattr(torch.ops.aten, "_cudnn_attention_forward")
        and torch.cuda.is_available()
        and torch.backends.cudnn.is_available()
        and torch.cuda.get_device_capability() >= (8, 0)
    )


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

    preference: "auto" (the rule below) or a name from KERNELS (BertConfig.varlen_kernel); a named kernel that
    cannot run here gives way to the rule, and the reason says so."""
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
        "cudnn_varlen": cuda_half and _cudnn_attention_available(),
    }[preference]
    if usable:
        return Kernel(preference, "asked for by the config's varlen_kernel")
    return Kernel(
        auto.name,
        f"the config asks for {preference}, which cannot run here ({device_type} {dtype}, "
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


def varlen_attention(qkv: torch.Tensor, info: Unpadded, dropout_p: float, preference: str = "auto") -> torch.Tensor:
    """Bidirectional attention of every sequence over its own real tokens.

    qkv [rows, 3, N, D] (the query/key/value projections of the real tokens, then round_rows' extra rows),
    dropout_p the effective attention dropout (0 in eval), preference BertConfig.varlen_kernel -> [rows, N, D], zero
    at the extra rows: the kernels see the real tokens only, so nothing of those rows reaches them, forward or back.
    In fixed_rows' layout the kernels get all R rows (no shape depends on T) and the extra rows, in no sequence of
    cu_seqlens, are zeroed on the way in and out: whatever a kernel writes there (its output, or the gradient it
    leaves in rows it never visits) reaches no weight."""
    if info.fixed:
        real = info.real.view(-1, 1, 1)  # [R, 1, 1]
        qkv = torch.where(real[:, None], qkv, 0)  # [R, 3, N, D]; backward: zero gradient at the extra rows
        return torch.where(real, _attend(qkv, info, dropout_p, preference), 0)  # [R, N, D]
    if info.rows:
        y = _attend(qkv[: info.tokens], info._replace(rows=0), dropout_p, preference)  # [T, N, D]
        return torch.cat([y, y.new_zeros(info.rows - info.tokens, *y.shape[1:])])  # [rows, N, D]
    return _attend(qkv, info, dropout_p, preference)


def _attend(qkv: torch.Tensor, info: Unpadded, dropout_p: float, preference: str) -> torch.Tensor:
    """varlen_attention's kernel call: qkv [rows, 3, N, D] -> [rows, N, D] over the sequences of cu_seqlens."""
    kernel = choose_kernel(qkv.device.type, qkv.dtype, float(dropout_p), preference)
    if not torch.compiler.is_compiling():  # a log call would break a compiled graph: announced by eager calls
        _announce(kernel)
    if kernel.name == "varlen_attn":
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = qkv.unbind(1)  # each [T, N, D]
        return varlen_attn(q, k, v, info.cu_seqlens, info.cu_seqlens, info.max_seqlen, info.max_seqlen)
    if kernel.name == "flash_varlen":
        q, k, v = qkv.unbind(1)  # each [T, N, D], the head dimension contiguous as the kernel needs
        # (output, logsumexp, rng state, unused, debug mask); autograd runs aten::_flash_attention_backward with
        # the same dropout mask (the rng state), and inductor calls the op as it is (a fallback kernel).
        return torch.ops.aten._flash_attention_forward(
            q, k, v, info.cu_seqlens, info.cu_seqlens, info.max_seqlen, info.max_seqlen, dropout_p, False, False
        )[0]
    if kernel.name == "cudnn_varlen":
        q, k, v = qkv.unbind(1)  # each [T, N, D]
        # (output, logsumexp, ...): the logsumexp is what its backward (aten::_cudnn_attention_backward) needs
        out = torch.ops.aten._cudnn_attention_forward(
            q,
            k,
            v,
            None,
            info.cu_seqlens,
            info.cu_seqlens,
            info.max_seqlen,
            info.max_seqlen,
            qkv.requires_grad,
            dropout_p,
        )[0]
        # cuDNN 9.5 and later read the output gradient with the output's strides, whatever its own are (pytorch
        # #138354): the failed check of its backward. The gradient reaches the kernel laid out as the output.
        return GradLaidOutLike.apply(out)
    if kernel.name == "flash_attn":
        from flash_attn import flash_attn_varlen_qkvpacked_func

        return flash_attn_varlen_qkvpacked_func(qkv, info.cu_seqlens, info.max_seqlen, dropout_p=dropout_p)
    # padded_sdpa: one [T, 3H] -> [B, S, 3H] copy, SDPA with the key mask (the block-diagonal mask of packed rows),
    # then back to the real tokens (pad and unpad follow a fixed layout's sentinel).
    _, _, N, D = qkv.shape
    padded = pad(qkv, info)  # [B, S, 3, N, D], zeros at padding (masked out as keys)
    q, k, v = padded.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, N, S, D]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=info.key_mask, dropout_p=dropout_p)  # [B, N, S, D]
    return unpad(y.transpose(1, 2), info)  # [B, S, N, D] -> [T, N, D]


class GradLaidOutLike(torch.autograd.Function):
    """The identity, whose backward hands on the gradient with the strides of the forward's tensor (a copy only when
    they differ): for kernels whose backward assumes the output gradient is laid out as their output."""

    @staticmethod
    def forward(ctx, out: torch.Tensor) -> torch.Tensor:
        ctx.stride = out.stride()
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if grad.stride() == ctx.stride:
            return grad
        return torch.empty_strided(grad.shape, ctx.stride, dtype=grad.dtype, device=grad.device).copy_(grad)


# ----------------------------------------------------------------------------------------------------------------
# The fixed-slot masked-LM gather


def gather_indexes(sequence_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Google's gather_indexes: the hidden states at P positions per sequence, a static shape (no nonzero, no host
    sync). sequence_output [B, S, H], positions [B, P] int -> [B, P, H]; unused slots (position 0) gather [CLS] and
    are given weight 0 by the caller."""
    index = positions.long()[:, :, None].expand(-1, -1, sequence_output.shape[-1])  # [B, P, H]
    return sequence_output.gather(1, index)  # [B, P, H]


# ----------------------------------------------------------------------------------------------------------------
# Dropout with a 1-bit mask


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor of n elements -> [ceil(n / 8)] uint8, element i in bit i % 8 of byte i // 8."""
    flat = F.pad(mask.reshape(-1).to(torch.uint8), (0, -mask.numel() % 8)).view(-1, 8)  # [n / 8, 8]
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=mask.device)
    return (flat * weights).sum(-1, dtype=torch.uint8)  # [n / 8]: the bits are disjoint, so the sum is their OR


def unpack_bits(packed: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """pack_bits' inverse: [ceil(n / 8)] uint8 -> the bool tensor of `shape`."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed[:, None] >> shifts) & 1  # [n / 8, 8]
    return bits.reshape(-1)[: shape.numel()].view(shape).bool()


class _BitMaskDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = torch.rand_like(x, dtype=torch.float32) >= p  # fp32 draws: bf16's would round p's threshold
        ctx.p, ctx.shape = p, keep.shape
        ctx.save_for_backward(pack_bits(keep))  # 1 bit an element where torch's dropout keeps a byte
        return x * keep / (1.0 - p)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (packed,) = ctx.saved_tensors
        return grad * unpack_bits(packed, ctx.shape) / (1.0 - ctx.p), None


class BitMaskDropout(torch.nn.Module):
    """nn.Dropout's drop-in (same `p`, same train/eval behaviour, no state), whose mask is saved for the backward in
    1 bit an element: BERT's hidden dropouts write a mask the size of every layer's activations twice a layer, and
    the backward reads it again; packed, that traffic is an eighth. The kept elements are those whose uniform draw is
    at least p (torch's dropout draws differently: same distribution, not the same mask for a seed)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return _BitMaskDropoutFn.apply(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
