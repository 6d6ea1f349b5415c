"""Padding and packing beside modeling.py: where a batch's real tokens are, and the fixed-slot masked-LM gather.

What it holds, in order: `Unpadded` (where a batch's real tokens are: flat indices, int32 cumulative sequence
offsets `cu_seqlens`, the longest length) with `unpad_info`, `host_unpad_info` (the same, made on the host before
the batch moves) and `unpad` / `pad` ([B, S, ...] <-> [T, ...], T = real tokens); `Packed` / `packed_layout`
(sequence packing: several sequences a row, each attending only to itself, positions restarting at 0 in each);
`gather_indexes`, Google's fixed-slot gather for the masked-LM head. Attention over this layout, and the choice of
its kernel, are bert_attention.py's.

An Unpadded may also describe a static-shape layout made outside the model (bert_recipe/training/cuda_graphs.py's
`fixed_rows`, for CUDA graphs): the real tokens, then extra rows that belong to no sequence (`real` says which rows
are real; their indices point at a sentinel position B * S). unpad and pad follow it.

Notation as in modeling.py: B batch, S sequence length, T real tokens of the batch, K packed sequences a row
(slots; unused slots allowed).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

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
    real: torch.Tensor | None = None  # [R] bool, True at the T real tokens: a static-shape layout made outside the
    # model (cuda_graphs.fixed_rows), which keeps T out of every shape: indices then has R entries, the extra ones
    # pointing at the sentinel position B * S, and no sequence of cu_seqlens holds the extra rows

    @property
    def fixed(self) -> bool:
        """True for a static-shape layout (extra rows after the real tokens)."""
        return self.real is not None

    @property
    def tokens(self) -> int:
        """Rows of the flat [T, ...] layout the layers see (a static shape: no host sync): T, or R for a static
        layout (`real` tells its T)."""
        return self.indices.shape[0]

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


def host_unpad_info(attention_mask: torch.Tensor, sequence_starts: torch.Tensor | None = None) -> Unpadded | None:
    """unpad_info of a micro-batch while it is still on the host, or None when it has no padding and is not packed.

    Why: on a GPU, unpad_info's nonzero and longest length are host syncs that drain the queue at every
    micro-batch (measured on an H200, BERT-large phase 2: the GPU idle 38% of the step). On the host they cost
    microseconds; the loop moves the result with the batch and the model takes it (BertModel's `unpadded`)."""
    packed = None if sequence_starts is None else packed_layout(attention_mask, sequence_starts, block_mask=False)
    if packed is None and not has_padding(attention_mask):
        return None
    return unpad_info(attention_mask, packed)._replace(key_mask=None)  # the mask is derived on the device


def unpad(x: torch.Tensor, info: Unpadded) -> torch.Tensor:
    """[B, S, ...] -> [T, ...]: the rows of the real tokens, in row-major order (a static layout: then its zero
    rows)."""
    flat = x.reshape(info.batch * info.seqlen, *x.shape[2:])  # [B * S, ...]
    if info.fixed:  # indices [R], the extra ones at the sentinel B * S: a zero row appended there
        flat = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])  # [B * S + 1, ...]
    return flat.index_select(0, info.indices)  # [T, ...] ([R, ...])


def pad(x: torch.Tensor, info: Unpadded) -> torch.Tensor:
    """[T, ...] -> [B, S, ...] with zeros at the padding positions (the inverse of unpad on the real tokens)."""
    total = info.batch * info.seqlen
    if info.fixed:  # every extra row goes to the sentinel row B * S, dropped; zeroed first, so the copies agree
        x = torch.where(info.real.view(-1, *[1] * (x.dim() - 1)), x, 0)  # [R, ...]
        out = x.new_zeros(total + 1, *x.shape[1:]).index_copy(0, info.indices, x)[:total]  # [B * S, ...]
    else:
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
# The fixed-slot masked-LM gather


def gather_indexes(sequence_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Google's gather_indexes: the hidden states at P positions per sequence, a static shape (no nonzero, no host
    sync). sequence_output [B, S, H], positions [B, P] int -> [B, P, H]; unused slots (position 0) gather [CLS] and
    are given weight 0 by the caller."""
    index = positions.long()[:, :, None].expand(-1, -1, sequence_output.shape[-1])  # [B, P, H]
    return sequence_output.gather(1, index)  # [B, P, H]
