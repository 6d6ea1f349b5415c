"""The speed path (bert_padding.py and its use in modeling.py) against the plain one: the fixed-slot masked-LM head
gives the sparse head's loss and compiles into one graph; the unpadded encoder gives the padded encoder's outputs,
losses and gradients on real WikiText-2 text with heavy padding, and both match transformers on the real MiniLM
weights; unpad/pad round-trips; the kernel rule never picks a dropout-free kernel when dropout is configured."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from helpers import SENTENCES, bert_config, padded_batch
from transformers.models.bert import modeling_bert as hf

import bert_padding
import modeling
from bert_recipe.io import checkpoint_io
from bert_recipe.pretraining import data_stream
from modeling import BertConfig, BertForPreTraining
from tokenization import BertTokenizer

P = 8  # prediction slots per sequence (the shards' max_predictions_per_seq)


def small_config(**overrides) -> BertConfig:
    return bert_config(
        **{
            "vocab_size": 30522,
            "hidden_size": 64,
            "intermediate_size": 128,
            "max_position_embeddings": 128,
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def wiki_batch(shared_data, uncased_vocab) -> dict[str, torch.Tensor]:
    """Real WikiText-2 lines, cut to very different lengths (3 to 60 words) and zero-padded to the longest (cut
    at 64 tokens): about half the positions are padding. Masked as in the shards: up to P positions per row
    (never [CLS] or the last [SEP]; short rows use fewer slots, the rest 0), the tokens there replaced by [MASK]."""
    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    lines = [
        line.strip()
        for line in (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines()
        if len(line.split()) > 60 and not line.strip().startswith("=")
    ]
    words = [3, 60, 8, 15, 5, 40]
    texts = [" ".join(line.split()[:n]) for line, n in zip(lines, words)]
    input_ids, token_type_ids, attention_mask = padded_batch(tokenizer, texts, max_len=64)
    rng = np.random.default_rng(0)
    lengths = attention_mask.sum(1).numpy()
    positions = np.zeros((len(texts), P), dtype=np.int64)
    for row, length in enumerate(lengths):
        n = min(P, max(1, (length - 2) // 3))
        positions[row, :n] = np.sort(rng.choice(np.arange(1, length - 1), n, replace=False))
    original = input_ids.numpy().copy()
    ids = np.where(positions > 0, np.take_along_axis(original, positions, 1), 0)
    masked = input_ids.clone()
    rows, slots = np.nonzero(positions)
    masked[rows, positions[rows, slots]] = tokenizer.vocab["[MASK]"]
    return {
        "input_ids": masked,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "masked_lm_labels": torch.from_numpy(data_stream.mlm_labels(positions, ids, masked.shape[1])),
        "masked_lm_positions": torch.from_numpy(positions),
        "masked_lm_ids": torch.from_numpy(ids),
        "next_sentence_labels": torch.tensor([0, 1, 1, 0, 1, 0]),
    }


def sparse(batch):
    return {k: v for k, v in batch.items() if k not in ("masked_lm_positions", "masked_lm_ids")}


def fixed(batch):
    return {k: v for k, v in batch.items() if k != "masked_lm_labels"}


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


def max_grad_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


# ---------------------------------------------------------------------------------------------------------------
# The fixed-slot masked-LM head


def test_fixed_slot_head_gives_the_sparse_heads_loss_and_gradients(wiki_batch):
    assert (wiki_batch["masked_lm_positions"] == 0).any()  # some slots unused
    torch.manual_seed(0)
    model = BertForPreTraining(small_config(unpad="never")).train()
    sparse_out, sparse_grads = loss_and_grads(model, sparse(wiki_batch))
    fixed_out, fixed_grads = loss_and_grads(model, fixed(wiki_batch))
    for field in ("loss", "mlm_loss", "nsp_loss"):
        diff = (getattr(sparse_out, field) - getattr(fixed_out, field)).abs().item()
        assert diff <= 1e-6, (field, diff)
    used = wiki_batch["masked_lm_positions"] > 0
    assert fixed_out.prediction_scores.shape == (*used.shape, 30522)
    torch.testing.assert_close(fixed_out.prediction_scores[used], sparse_out.prediction_scores, atol=1e-6, rtol=0)
    worst = max_grad_diff(sparse_grads, fixed_grads)
    assert worst <= 1e-6, worst
    print(
        f"\nfixed-slot vs sparse head: |loss diff| {(sparse_out.loss - fixed_out.loss).abs().item():.1e}, "
        f"max |grad diff| {worst:.1e}"
    )
    with pytest.raises(ValueError, match="masked_lm_ids"):
        model(wiki_batch["input_ids"], masked_lm_positions=wiki_batch["masked_lm_positions"])


def test_fixed_slot_pretraining_step_compiles_into_one_graph():
    """torch.compile(fullgraph=True) of forward + backward with the fixed-slot head (padded batch): no graph break,
    no host sync; loss and gradients as in eager mode. The one compile of this file (1-2 minutes on 2 cores)."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForPreTraining(config).train()
    ids = torch.randint(5, 50, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    batch = {
        "input_ids": ids * mask,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "masked_lm_positions": torch.tensor([[2, 5, 9], [3, 0, 0]]),
        "masked_lm_ids": torch.tensor([[7, 8, 9], [10, 0, 0]]),
        "next_sentence_labels": torch.tensor([0, 1]),
    }
    eager_out, eager_grads = loss_and_grads(model, batch)
    compiled = torch.compile(model, fullgraph=True)
    compiled_out, compiled_grads = loss_and_grads(compiled, batch)
    compiled_grads = {k.removeprefix("_orig_mod."): v for k, v in compiled_grads.items()}
    assert abs(eager_out.loss.item() - compiled_out.loss.item()) <= 1e-5
    assert max_grad_diff(eager_grads, compiled_grads) <= 1e-5


# ---------------------------------------------------------------------------------------------------------------
# Unpad / pad and the kernel rule


def test_unpad_pad_round_trip_and_offsets():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 1, 1, 0, 1]])  # any layout
    x = torch.randn(4, 5, 3, 2)
    info = bert_padding.unpad_info(mask)
    assert info.cu_seqlens.dtype == torch.int32 and info.cu_seqlens.tolist() == [0, 3, 8, 9, 12]
    assert info.max_seqlen == 5 and (info.batch, info.seqlen) == (4, 5)
    flat = bert_padding.unpad(x, info)  # [T, 3, 2]
    assert flat.shape == (12, 3, 2)
    torch.testing.assert_close(flat, x[mask.bool()], atol=0, rtol=0)
    back = bert_padding.pad(flat, info)  # [B, S, 3, 2]
    torch.testing.assert_close(back, x * mask[:, :, None, None], atol=0, rtol=0)
    assert bert_padding.has_padding(mask) and not bert_padding.has_padding(torch.ones(2, 3))
    with pytest.raises(ValueError, match="batch, seq"):
        bert_padding.unpad_info(torch.ones(2, 3, 4))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_rule_never_drops_a_configured_dropout(device, dtype, monkeypatch):
    """The rule, for every combination of what is importable: varlen_attn (no dropout argument) only at dropout 0;
    with dropout, torch's own FlashAttention varlen entry (flash_varlen, which applies it) where the GPU has it,
    else flash_attn's, else SDPA around padding; fp32 and CPUs always pad around SDPA."""
    for torch_flash in (False, True):
        for flash in (False, True):
            monkeypatch.setattr(bert_padding, "_importable", lambda m, flash=flash: m != "flash_attn" or flash)
            monkeypatch.setattr(bert_padding, "_torch_flash_available", lambda tf=torch_flash: tf)
            bert_padding.choose_kernel.cache_clear()
            with_dropout = bert_padding.choose_kernel(device, dtype, 0.1)
            without = bert_padding.choose_kernel(device, dtype, 0.0)
            assert with_dropout.name != "varlen_attn"  # torch's varlen_attn has no dropout argument
            assert with_dropout.reason and "\n" not in with_dropout.reason
            if device == "cpu" or dtype == torch.float32:
                assert with_dropout.name == without.name == "padded_sdpa"
            else:
                assert without.name == "varlen_attn"
                assert with_dropout.name == (
                    "flash_varlen" if torch_flash else "flash_attn" if flash else "padded_sdpa"
                )
    bert_padding.choose_kernel.cache_clear()


def test_the_kernel_rule_carries_torchs_constant_mark_without_importing_dynamo():
    """choose_kernel is marked as torch.compiler.assume_constant_result marks a function (the reference: torch's
    decorator applied to a probe sets these attributes and nothing else), and the scripts start without importing
    torch._dynamo, which that decorator would import (1.6 s at every start on 2 cores)."""
    import subprocess
    import sys

    def probe():
        return None

    assert torch.compiler.assume_constant_result(probe) is probe
    assert vars(probe) and all(getattr(bert_padding.choose_kernel, k, None) == v for k, v in vars(probe).items())
    code = (
        "import sys, modeling, run_pretraining, run_glue, run_squad, run_swag, inference, extract_features; "
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=modeling.__file__.rsplit("/", 1)[0],
    )
    assert out.stdout.strip() == "False"


def test_a_named_kernel_is_used_where_it_can_run_and_gives_way_where_it_cannot(monkeypatch):
    """BertConfig.varlen_kernel: a kernel named there is taken when this device, dtype and dropout allow it;
    otherwise the rule's choice runs and the reason names what was asked for (a config written on a GPU still
    loads and runs on a CPU). Names outside the list are refused by the config."""
    monkeypatch.setattr(bert_padding, "_torch_flash_available", lambda: True)
    bert_padding.choose_kernel.cache_clear()
    assert bert_padding.choose_kernel("cuda", torch.bfloat16, 0.1, "padded_sdpa").name == "padded_sdpa"
    assert bert_padding.choose_kernel("cuda", torch.bfloat16, 0.0, "flash_varlen").name == "flash_varlen"
    gave_way = bert_padding.choose_kernel("cuda", torch.bfloat16, 0.1, "varlen_attn")  # it has no dropout
    assert gave_way.name == "flash_varlen" and "varlen_attn" in gave_way.reason
    on_cpu = bert_padding.choose_kernel("cpu", torch.float32, 0.1, "flash_varlen")
    assert on_cpu.name == "padded_sdpa" and "flash_varlen" in on_cpu.reason
    monkeypatch.setattr(bert_padding, "_cudnn_attention_available", lambda: True)
    bert_padding.choose_kernel.cache_clear()
    assert bert_padding.choose_kernel("cuda", torch.bfloat16, 0.1, "cudnn_varlen").name == "cudnn_varlen"
    assert bert_padding.choose_kernel("cuda", torch.bfloat16, 0.1).name == "flash_varlen"  # never by the rule
    assert bert_padding.choose_kernel("cuda", torch.float32, 0.1, "cudnn_varlen").name == "padded_sdpa"
    bert_padding.choose_kernel.cache_clear()
    with pytest.raises(ValueError, match="varlen_kernel"):
        BertConfig(varlen_kernel="triton")
    assert "varlen_kernel" not in BertConfig().to_dict()
    assert BertConfig(varlen_kernel="padded_sdpa").to_dict()["varlen_kernel"] == "padded_sdpa"


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_unpadding_described_on_the_host_gives_the_same_losses_and_gradients(wiki_batch, layout):
    """The training loop describes a micro-batch's real tokens on the host (bert_padding.host_unpad_info: no device
    sync) and hands the description to the model with the batch; the model must compute exactly what it computes
    when it finds them itself, on plain rows and on packed rows (two sequences a row, positions restarting)."""
    _, model = twin_models()
    batch = fixed(wiki_batch)
    starts = None
    if layout == "packed":  # rows 0 and 2 hold 3 and 8 words: put the second one behind the first, in row 0
        starts = torch.zeros(len(batch["input_ids"]), 2, dtype=torch.long)
        batch = {k: v.clone() for k, v in batch.items()}
        n0, n2 = int(batch["attention_mask"][0].sum()), int(batch["attention_mask"][2].sum())
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            batch[key][0, n0 : n0 + n2] = batch[key][2, :n2]
        starts[0, 1] = n0
        batch["next_sentence_positions"] = starts
        batch["next_sentence_labels"] = torch.stack(
            [batch["next_sentence_labels"], torch.full_like(batch["next_sentence_labels"], -1)], 1
        )
        batch["next_sentence_labels"][0, 1] = 1
    host = bert_padding.host_unpad_info(batch["attention_mask"], starts)
    assert host is not None and host.key_mask is None
    assert bert_padding.host_unpad_info(torch.ones(2, 5, dtype=torch.long)) is None  # no padding, not packed
    out_device, grads_device = loss_and_grads(model.train(), batch)
    out_host, grads_host = loss_and_grads(model.train(), {**batch, "unpadded": host.to("cpu")})
    torch.testing.assert_close(out_host.loss, out_device.loss, atol=0, rtol=0)
    assert max_grad_diff(grads_host, grads_device) == 0.0


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_rounded_token_rows_change_no_loss_and_no_gradient(wiki_batch, layout):
    """unpad_token_multiple 16 (what float8 needs): the real tokens, then zero rows up to a multiple of 16, which no
    sequence of cu_seqlens holds. The losses and gradients are the unrounded run's: the extra rows reach neither
    attention nor the outputs, forward or backward."""
    _, plain = twin_models()
    _, rounded = twin_models(unpad_token_multiple=16)
    batch = fixed(wiki_batch)
    starts = None
    if layout == "packed":  # two sequences a row in row 0 (positions restart), as in the host-description test
        starts = torch.zeros(len(batch["input_ids"]), 2, dtype=torch.long)
        starts[0, 1] = 2
        batch = {
            **batch,
            "next_sentence_positions": starts,
            "next_sentence_labels": torch.stack(
                [batch["next_sentence_labels"], torch.full_like(batch["next_sentence_labels"], -1)], 1
            ),
        }
    info = rounded.bert.unpadded(
        batch["attention_mask"],
        False,
        None if starts is None else bert_padding.packed_layout(batch["attention_mask"], starts),
    )
    T = int(batch["attention_mask"].sum())
    assert T % 16 and info.tokens == T and info.total_rows == -(-T // 16) * 16  # really rounded
    x = torch.randn(len(batch["input_ids"]), batch["input_ids"].shape[1], 3)
    flat = bert_padding.unpad(x, info)  # [rows, 3]
    assert flat.shape[0] == info.total_rows and torch.all(flat[T:] == 0)
    torch.testing.assert_close(
        bert_padding.pad(flat, info)[batch["attention_mask"].bool()], x[batch["attention_mask"].bool()], rtol=0, atol=0
    )
    out_plain, grads_plain = loss_and_grads(plain.train(), batch)
    out_rounded, grads_rounded = loss_and_grads(rounded.train(), batch)
    torch.testing.assert_close(out_rounded.loss, out_plain.loss, atol=1e-6, rtol=0)
    assert max_grad_diff(grads_rounded, grads_plain) <= 1e-6
    with pytest.raises(ValueError, match="unpad_token_multiple"):
        BertConfig(unpad_token_multiple=0)
    assert "unpad_token_multiple" not in BertConfig().to_dict()


def packed_rows(batch):
    """The batch with row 0 holding two sequences (the second starting at position 2) and the NSP labels per slot."""
    starts = torch.zeros(len(batch["input_ids"]), 2, dtype=torch.long)
    starts[0, 1] = 2
    return {
        **batch,
        "next_sentence_positions": starts,
        "next_sentence_labels": torch.stack(
            [batch["next_sentence_labels"], torch.full_like(batch["next_sentence_labels"], -1)], 1
        ),
    }


@pytest.mark.parametrize("sizes", [1, 3])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fixed_rows_change_no_loss_and_no_gradient(wiki_batch, layout, sizes):
    """unpad_fixed_sizes (the static-shape layout for CUDA graphs): T rounded up to one of `sizes` multiples of
    ceil(B*S / sizes), the offsets padded to B (or B*K) + 1 by repeating the last, max_seqlen S. The losses and
    gradients are the padded encoder's, whether the model makes the layout or the loop makes it on the host."""
    padded, fixed_model = twin_models(unpad_fixed_sizes=sizes)
    batch = fixed(wiki_batch)
    starts = None
    if layout == "packed":
        batch = packed_rows(batch)
        starts = batch["next_sentence_positions"]
    mask = batch["attention_mask"]
    B, S = mask.shape
    T = int(mask.sum())
    step = -(-B * S // sizes)
    info = fixed_model.bert.unpadded(mask, False, None if starts is None else bert_padding.packed_layout(mask, starts))
    assert info.fixed and info.total_rows == -(-T // step) * step and info.total_rows > T  # really padded
    assert info.indices.shape == (info.total_rows,) and int(info.real.sum()) == T and info.max_seqlen == S
    K = 1 if starts is None else 2
    lengths = info.cu_seqlens.diff()
    assert info.cu_seqlens.shape == (B * K + 1,) and int(info.cu_seqlens[-1]) == T and torch.all(lengths >= 0)
    if starts is not None:  # the unused slots' empty sequences come last, after every real one
        assert torch.all(lengths[: B + 1] > 0) and torch.all(lengths[B + 1 :] == 0)
    x = torch.randn(B, S, 3)
    flat = bert_padding.unpad(x, info)  # [R, 3]
    assert torch.all(flat[T:] == 0)
    torch.testing.assert_close(bert_padding.pad(flat, info), x * mask[:, :, None], rtol=0, atol=0)
    out_padded, grads_padded = loss_and_grads(padded.train(), batch)
    out_fixed, grads_fixed = loss_and_grads(fixed_model.train(), batch)
    host = bert_padding.host_unpad_info(mask, starts, sizes)
    assert host.fixed and host.total_rows == info.total_rows and host.key_mask is None
    out_host, grads_host = loss_and_grads(fixed_model.train(), {**batch, "unpadded": host})
    for out, grads in ((out_fixed, grads_fixed), (out_host, grads_host)):
        torch.testing.assert_close(out.loss, out_padded.loss, atol=1e-5, rtol=0)
        assert max_grad_diff(grads, grads_padded) <= 1e-5
    rounded = bert_padding.fixed_rows(bert_padding.unpad_info(mask), sizes, 16)  # float8's multiple
    assert rounded.total_rows % 16 == 0 and rounded.total_rows >= T
    with pytest.raises(ValueError, match="unpad_fixed_sizes"):
        BertConfig(unpad_fixed_sizes=9)
    assert "unpad_fixed_sizes" not in BertConfig().to_dict()


def test_fixed_rows_keep_a_kernels_garbage_out_of_every_weight(wiki_batch, monkeypatch):
    """A varlen kernel writes only the rows of cu_seqlens' sequences: the rest of its output, and of the gradient
    it returns, is whatever the memory held. Such a kernel (NaN in every other row, forward and backward) leaves the
    fixed layout's losses and gradients those of the padded encoder."""
    real_attend = bert_padding._attend

    class Sloppy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, qkv, info, dropout_p, preference):
            with torch.enable_grad():
                ctx.qkv = qkv.detach().requires_grad_()
                ctx.y = real_attend(ctx.qkv, info, dropout_p, preference)
            ctx.tokens = int(info.cu_seqlens[-1])
            y = ctx.y.detach().clone()
            y[ctx.tokens :] = float("nan")
            return y

        @staticmethod
        def backward(ctx, grad):
            (dqkv,) = torch.autograd.grad(ctx.y, ctx.qkv, grad.nan_to_num())
            dqkv = dqkv.clone()
            dqkv[ctx.tokens :] = float("nan")
            return dqkv, None, None, None

    padded, fixed_model = twin_models(unpad_fixed_sizes=2)
    batch = fixed(wiki_batch)
    out_padded, grads_padded = loss_and_grads(padded.train(), batch)
    monkeypatch.setattr(bert_padding, "_attend", lambda qkv, info, p, pref: Sloppy.apply(qkv, info, p, pref))
    out_fixed, grads_fixed = loss_and_grads(fixed_model.train(), batch)
    torch.testing.assert_close(out_fixed.loss, out_padded.loss, atol=1e-5, rtol=0)
    assert max_grad_diff(grads_fixed, grads_padded) <= 1e-5


def test_a_whole_model_graph_over_fixed_rows_compiles_once_per_size(wiki_batch):
    """The static-shape unpadded step in one graph (fullgraph: no graph break, no host sync inside): micro-batches
    with different token counts of one size reuse the graph; a count of another size compiles one more. Counted
    with Dynamo's CompileCounter (the graph runs eagerly: what is checked is the capture, not Inductor)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertForPreTraining(small_config(unpad_fixed_sizes=2))  # unpad auto: in a graph only on fixed rows
    counter = CompileCounter()
    step = torch.compile(model.train(), backend=counter, fullgraph=True)
    batch = fixed(wiki_batch)
    mask = batch["attention_mask"]
    B, S = mask.shape
    shorter = mask.clone()
    shorter[1, int(mask[1].sum()) - 3 :] = 0  # three tokens fewer, in the same half of B * S
    longer = mask.clone()
    longer[0, :] = 1
    longer[4, :] = 1
    T = [int(m.sum()) for m in (mask, shorter, longer)]
    assert T[0] <= B * S // 2 and T[1] <= B * S // 2 < T[2]
    for i, m in enumerate((mask, shorter, longer)):
        host = bert_padding.host_unpad_info(m, None, 2)
        out_graph, grads_graph = loss_and_grads(step, {**batch, "attention_mask": m, "unpadded": host})
        out_eager, grads_eager = loss_and_grads(model, {**batch, "attention_mask": m, "unpadded": host})
        torch.testing.assert_close(out_graph.loss, out_eager.loss, atol=1e-6, rtol=0)
        assert counter.frame_count == (1 if i < 2 else 2), (i, counter.frame_count)
    torch._dynamo.reset()


def test_the_kernel_in_use_is_said_in_one_line(caplog):
    bert_padding._announce.cache_clear()
    model = BertForPreTraining(small_config(vocab_size=50, unpad="always")).eval()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with caplog.at_level(logging.INFO, logger="bert_padding"):
        model(torch.randint(5, 50, (2, 4)) * mask, attention_mask=mask)
    lines = [r.getMessage() for r in caplog.records if r.name == "bert_padding"]
    assert len(lines) == 1 and lines[0].startswith("variable-length attention: padded_sdpa (cpu:"), lines


def test_unpad_setting_is_validated_and_kept_out_of_googles_keys():
    with pytest.raises(ValueError, match="unpad"):
        BertConfig(unpad="sometimes")
    assert "unpad" not in BertConfig().to_dict() and BertConfig(unpad="never").to_dict()["unpad"] == "never"


# ---------------------------------------------------------------------------------------------------------------
# The unpadded encoder against the padded one, and both against transformers


def twin_models(**overrides):
    """Two BertForPreTraining with the same weights, one always unpadding, one never."""
    torch.manual_seed(0)
    padded = BertForPreTraining(small_config(unpad="never", **overrides))
    unpadded = BertForPreTraining(small_config(unpad="always", **overrides))
    unpadded.load_state_dict(padded.state_dict())
    return padded, unpadded


@pytest.mark.parametrize("head", ["sparse", "fixed"])
def test_unpadded_encoder_gives_the_padded_losses_and_gradients_on_wikitext(wiki_batch, head):
    real = wiki_batch["attention_mask"].float().mean().item()
    assert real < 0.6  # heavy padding
    padded, unpadded = twin_models()
    batch = sparse(wiki_batch) if head == "sparse" else fixed(wiki_batch)
    out_p, grads_p = loss_and_grads(padded.train(), batch)
    out_u, grads_u = loss_and_grads(unpadded.train(), batch)
    for field in ("loss", "mlm_loss", "nsp_loss", "prediction_scores", "seq_relationship_score"):
        torch.testing.assert_close(getattr(out_u, field), getattr(out_p, field), atol=1e-5, rtol=0, msg=field)
    worst = max_grad_diff(grads_p, grads_u)
    assert worst <= 1e-5, worst
    print(
        f"\n{head}: real tokens {real:.2f}, |loss diff| {(out_u.loss - out_p.loss).abs().item():.1e}, "
        f"max |grad diff| {worst:.1e}"
    )


def test_unpadded_encoder_outputs_and_hidden_states_equal_the_padded_ones(wiki_batch):
    padded, unpadded = twin_models(num_hidden_layers=3)
    args = (wiki_batch["input_ids"], wiki_batch["token_type_ids"], wiki_batch["attention_mask"])
    with torch.no_grad():
        ref = padded.bert.eval()(*args, output_hidden_states=True)
        out = unpadded.bert.eval()(*args, output_hidden_states=True)
    real = wiki_batch["attention_mask"].bool()
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for mine, theirs in zip((out.sequence_output, *out.hidden_states), (ref.sequence_output, *ref.hidden_states)):
        torch.testing.assert_close(mine[real], theirs[real], atol=1e-5, rtol=0)
        assert torch.all(mine[~real] == 0)  # padding positions are zeros on the unpadded path
    torch.testing.assert_close(out.pooled_output, ref.pooled_output, atol=1e-5, rtol=0)


def test_auto_unpads_only_where_padding_positions_are_not_read(wiki_batch, monkeypatch):
    calls = []
    real_unpad_info = bert_padding.unpad_info
    monkeypatch.setattr(modeling, "unpad_info", lambda mask: calls.append(1) or real_unpad_info(mask))
    model = BertForPreTraining(small_config()).eval()  # unpad="auto"
    with torch.no_grad():
        model(**sparse(wiki_batch))  # labels: only labelled positions and [CLS] are read
        assert len(calls) == 1
        model(wiki_batch["input_ids"], wiki_batch["token_type_ids"], wiki_batch["attention_mask"])  # [B, S, V]
        assert len(calls) == 1
        full_row = {k: v[1:2] for k, v in sparse(wiki_batch).items()}  # the longest row: no padding
        assert not bert_padding.has_padding(full_row["attention_mask"])
        model(**full_row)  # the plain path
        assert len(calls) == 1


@pytest.mark.parametrize("unpad", ["never", "always"])
def test_both_paths_match_transformers_on_minilm(minilm_dir, unpad):
    ours = checkpoint_io.from_pretrained(modeling.BertModel, minilm_dir, log=None).eval()
    ours.config.unpad = unpad
    theirs = hf.BertModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt")
    input_ids, token_type_ids, attention_mask = padded_batch(tokenizer, SENTENCES, pair=True)
    assert bert_padding.has_padding(attention_mask)
    with torch.no_grad():
        sequence_output, pooled_output = ours(input_ids, token_type_ids, attention_mask)
        reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    diff = (sequence_output[real] - reference.last_hidden_state[real]).abs().max().item()
    torch.testing.assert_close(sequence_output[real], reference.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled_output, reference.pooler_output, atol=1e-5, rtol=0)
    print(f"\nMiniLM unpad={unpad}: max |ours - transformers| {diff:.1e}")


def test_the_output_gradient_reaches_a_kernel_laid_out_as_its_output():
    """cuDNN's attention backward reads the output gradient with the output's strides. Downstream, a reshape of a
    [T, N, D] output laid out head-major (as a kernel may write it) hands back a row-major gradient; through
    GradLaidOutLike the producer receives it with its output's strides, and the same values."""
    seen = {}

    class Producer(torch.autograd.Function):  # stands in for the kernel: an output laid out [N, T, D] in memory
        @staticmethod
        def forward(ctx, x):
            return x.transpose(0, 1).contiguous().transpose(0, 1)  # [T, N, D] values, strides of [N, T, D]

        @staticmethod
        def backward(ctx, grad):
            seen["stride"] = grad.stride()
            return grad

    x = torch.randn(5, 2, 3, requires_grad=True)  # [T, N, D]
    weight = torch.randn(5, 6)
    for guard in (False, True):
        out = Producer.apply(x)
        y = bert_padding.GradLaidOutLike.apply(out) if guard else out
        x.grad = None
        (y.reshape(5, 6) * weight).sum().backward()  # the gradient arrives row-major [T, N * D]
        assert (seen["stride"] == out.stride()) == guard, (seen["stride"], out.stride())
        torch.testing.assert_close(x.grad, weight.view(5, 2, 3), rtol=0, atol=0)
