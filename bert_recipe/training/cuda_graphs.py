"""What replaying a training step as CUDA graphs (--compile_mode reduce-overhead) needs, applied from outside the
model: no GPU run has yet shown this path to win (bench/STUDIES.md, "Which path is fastest on a GPU", says what the
next one times and what would make it a default).

    info = fixed_rows(host_unpad_info(mask, starts), granule=2048, sequences=sequence_slots(mask, starts))
    allocate_grads(model)                    # before the first step; the step rule then zeroes them in place
    with without_graphs():                   # evaluation between steps
        validator(raw_model)
    graph_report()                           # {"cudagraph_skips": n}, for a run's summary

Why each:
- `fixed_rows`: a CUDA graph replays fixed shapes. The unpadded layout has T rows, a new T at every micro-batch;
  rounded up to a multiple of a token granule (about 2k rows), with the offsets padded to a fixed length, a compiled
  step sees at most a few shapes (each one recorded once) and no host sync. The extra rows belong to no sequence:
  bert_attention.varlen_attention zeroes them on the way in and out, bert_padding.pad drops them.
- `allocate_grads`: with CUDA-graph trees, autograd takes the backward graph's output as a parameter's `.grad` when
  the grad is None; the next micro-batch's replay (after `torch.compiler.cudagraph_mark_step_begin`) frees that
  memory, and accumulating into it reads overwritten values (pytorch#169545; silently wrong without the mark,
  #96693). A `.grad` that exists before the first step, zeroed in place after every optimizer step
  (train_step.StepRule's `stable_grads`), is never a graph's output.
- `without_graphs`: evaluation calls the same compiled layers without gradients, and each such call starts a new
  graph generation under per-layer graphs (pytorch#152887, #160281); between steps it runs them eagerly instead.
- `graph_report`: how many regions Inductor ran without graphs (a skipped graph is a slow step, not an error,
  unless TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1).
"""

from __future__ import annotations

import contextlib

import torch

from bert_padding import Unpadded

MAX_SIZES = 8
"""fixed_rows' most sizes: each is one recording of every graph, and torch.compile keeps 8 graphs a region by
default."""


def round_up(n: int, multiple: int) -> int:
    """The least multiple of `multiple` that is at least n."""
    return -(-n // multiple) * multiple


def sequence_slots(attention_mask: torch.Tensor, sequence_starts: torch.Tensor | None) -> int:
    """How many sequences a [B, S] batch can hold: B, or B * K with K packed slots a row ([B, K] sequence starts):
    cu_seqlens' fixed size minus one in fixed_rows' layout."""
    return attention_mask.shape[0] * (1 if sequence_starts is None else sequence_starts.shape[1])


def fixed_rows(info: Unpadded, granule: int, sequences: int | None = None, sizes: int = MAX_SIZES) -> Unpadded:
    """The same tokens in a static-shape layout: R rows, T rounded up to a multiple of `granule`, at least the
    `sizes`-th multiple below the largest (B * S rounded up), so a micro-batch of B rows of S positions gives at most
    `sizes` shapes whatever its T; the real tokens first, then zero rows. indices padded to R with the sentinel
    position B * S (bert_padding.unpad reads zeros there, pad drops it); cu_seqlens padded to `sequences` + 1
    entries (default B) by repeating its last, so the extra sequences are empty; max_seqlen S. Nothing of it
    depends on T but the values: no recompilation between micro-batches of one size, no host sync."""
    if info.fixed:
        return info
    if granule < 1 or sizes < 1:
        raise ValueError(f"fixed_rows needs a granule and a number of sizes of at least 1, got {granule}, {sizes}")
    total = info.batch * info.seqlen  # B * S: every position of the batch, and the sentinel's index
    largest = round_up(total, granule)
    T = info.tokens
    rows = max(round_up(T, granule), largest - (sizes - 1) * granule, granule)  # R
    indices = torch.cat([info.indices, info.indices.new_full((rows - T,), total)])  # [R]
    sequences = info.batch if sequences is None else sequences
    cu = info.cu_seqlens  # [used sequences + 1]
    if cu.shape[0] > sequences + 1:
        raise ValueError(f"fixed_rows: {cu.shape[0] - 1} sequences do not fit the {sequences} given")
    cu_seqlens = torch.cat([cu, cu[-1:].expand(sequences + 1 - cu.shape[0])])  # [sequences + 1]
    real = torch.arange(rows, device=info.indices.device) < T  # [R]
    return info._replace(indices=indices, cu_seqlens=cu_seqlens, max_seqlen=info.seqlen, real=real)


def allocate_grads(model: torch.nn.Module) -> None:
    """A zero `.grad` for every trainable parameter that has none: buffers that outlive every graph replay."""
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


def without_graphs() -> contextlib.AbstractContextManager:
    """Compiled code runs eagerly inside (evaluation between the steps of a run whose steps replay graphs)."""
    return torch.compiler.set_stance("force_eager")


def graph_report() -> dict[str, int]:
    """{"cudagraph_skips": regions Inductor ran without CUDA graphs in this process} (0 when nothing compiled)."""
    from torch._dynamo.utils import counters  # imported once something compiled: Dynamo costs 1.6 s at start

    return {"cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}
