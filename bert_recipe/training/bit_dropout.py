"""Dropout whose mask is kept for the backward in 1 bit an element, applied from outside the model: no GPU run has
yet shown it to pay (bench/STUDIES.md, "Which path is fastest on a GPU": Inductor already keeps a 1-byte mask, so a
GPU is expected to gain under 1% of a step; it saves about 1.3 GB of an H200 phase-1 micro-batch's memory).

    bit_dropout.convert(model)   # the encoder's hidden dropouts (nn.Dropout) become BitMaskDropout

`BitMaskDropout` is nn.Dropout's drop-in (same `p`, same train/eval behaviour, no state, no parameters: the state
dict does not change), whose kept elements are those whose uniform draw is at least p (torch's dropout draws
differently: the same distribution, not the same mask for a seed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modeling import BertEmbeddings, BertLayer


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


class BitMaskDropout(nn.Module):
    """nn.Dropout whose mask is saved for the backward in 1 bit an element: BERT's hidden dropouts write a mask the
    size of every layer's activations twice a layer, and the backward reads it again; packed, that traffic is an
    eighth."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return _BitMaskDropoutFn.apply(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def convert(model: nn.Module) -> int:
    """Swap the hidden dropouts of `model`'s encoder (every nn.Dropout of the embeddings and of each layer: two a
    layer) for BitMaskDropout of the same p, in place. Returns how many were swapped. Call before torch.compile
    traces the model (parallelize.apply_parallelism_and_precision does)."""
    swapped = 0
    for block in (m for m in model.modules() if isinstance(m, (BertEmbeddings, BertLayer))):
        for parent in block.modules():
            for name, child in list(parent.named_children()):
                if type(child) is nn.Dropout:
                    setattr(parent, name, BitMaskDropout(child.p))
                    swapped += 1
    return swapped
