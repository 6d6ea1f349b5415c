"""The speed path (bert_padding.py and its use in modeling.py) against the plain one: the fixed-slot masked-LM head
gives the sparse head's loss and compiles into one graph; the unpadded encoder gives the padded encoder's outputs,
losses and gradients on real WikiText-2 text with heavy padding, and both match transformers on the real MiniLM
weights; unpad/pad round-trips; how a model runs is not saved with its config. The attention kernels and their rule
are tests/test_attention.py's; the static-shape layout for CUDA graphs tests/test_cuda_graphs.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SENTENCES, bert_config, padded_batch
from transformers.models.bert import modeling_bert as hf

import bert_attention
import bert_padding
import modeling
from bert_recipe.io import checkpoint_io
from bert_recipe.pretraining import data_stream
from bert_recipe.training import cuda_graphs
from modeling import BertConfig, BertForPreTraining, set_execution
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
    model = set_execution(BertForPreTraining(small_config()), unpad="never").train()
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


def host_layout(batch, granule: int, sizes: int = cuda_graphs.MAX_SIZES):
    """What the trainer hands the model under --static_token_granule: the host's description in fixed_rows' layout."""
    starts = batch.get("next_sentence_positions")
    info = bert_padding.host_unpad_info(batch["attention_mask"], starts)
    return cuda_graphs.fixed_rows(info, granule, cuda_graphs.sequence_slots(batch["attention_mask"], starts), sizes)


@pytest.mark.parametrize("granule", [16, 97])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fixed_rows_change_no_loss_and_no_gradient(wiki_batch, layout, granule):
    """cuda_graphs.fixed_rows (the static-shape layout for CUDA graphs, made on the host outside the model): T rounded
    up to a multiple of the granule (at least the 8th size below the largest), the offsets padded to B (or B*K) + 1
    by repeating the last, max_seqlen S. The losses and gradients are the padded encoder's."""
    padded, unpadded = twin_models()
    batch = fixed(wiki_batch)
    if layout == "packed":
        batch = packed_rows(batch)
    starts = batch.get("next_sentence_positions")
    mask = batch["attention_mask"]
    B, S = mask.shape
    T = int(mask.sum())
    info = host_layout(batch, granule)
    top = -(-B * S // granule) * granule  # B * S rounded up: the largest size; at most 8 sizes below it
    R = max(-(-T // granule) * granule, top - 7 * granule)
    assert info.fixed and info.tokens == R > T and info.key_mask is None  # really padded
    assert int(info.real.sum()) == T and info.max_seqlen == S
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
    out_fixed, grads_fixed = loss_and_grads(unpadded.train(), {**batch, "unpadded": info})
    torch.testing.assert_close(out_fixed.loss, out_padded.loss, atol=1e-5, rtol=0)
    assert max_grad_diff(grads_fixed, grads_padded) <= 1e-5


def test_fixed_rows_give_at_most_the_sizes_asked_for_whatever_the_token_count():
    """Every T from 1 to B * S lands on one of at most `sizes` row counts, each a multiple of the granule and at
    least T: the written-out rule, checked over every count."""
    B, S, granule = 4, 64, 16
    for sizes in (1, 3, 8):
        seen = set()
        for T in range(1, B * S + 1):
            mask = (torch.arange(B * S) < T).reshape(B, S).long()
            info = cuda_graphs.fixed_rows(bert_padding.unpad_info(mask), granule, sizes=sizes)
            assert info.tokens % granule == 0 and info.tokens >= T
            assert info.tokens == max(-(-T // granule) * granule, B * S - (sizes - 1) * granule)
            seen.add(info.tokens)
        assert len(seen) == min(sizes, B * S // granule), (sizes, sorted(seen))
    with pytest.raises(ValueError, match="granule"):
        cuda_graphs.fixed_rows(bert_padding.unpad_info(mask), 0)


def test_fixed_rows_keep_a_kernels_garbage_out_of_every_weight(wiki_batch, monkeypatch):
    """A varlen kernel writes only the rows of cu_seqlens' sequences: the rest of its output, and of the gradient
    it returns, is whatever the memory held. Such a kernel (NaN in every other row, forward and backward) leaves the
    fixed layout's losses and gradients those of the padded encoder."""
    real_attend = bert_attention._attend

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

    padded, unpadded = twin_models()
    batch = fixed(wiki_batch)
    out_padded, grads_padded = loss_and_grads(padded.train(), batch)
    monkeypatch.setattr(bert_attention, "_attend", lambda qkv, info, p, pref: Sloppy.apply(qkv, info, p, pref))
    out_fixed, grads_fixed = loss_and_grads(unpadded.train(), {**batch, "unpadded": host_layout(batch, 64)})
    torch.testing.assert_close(out_fixed.loss, out_padded.loss, atol=1e-5, rtol=0)
    assert max_grad_diff(grads_fixed, grads_padded) <= 1e-5


def test_a_whole_model_graph_over_fixed_rows_compiles_once_per_size(wiki_batch):
    """The static-shape unpadded step in one graph (fullgraph: no graph break, no host sync inside): micro-batches
    with different token counts of one size reuse the graph; a count of another size compiles one more. Counted
    with Dynamo's CompileCounter (the graph runs eagerly: what is checked is the capture, not Inductor)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertForPreTraining(small_config())  # unpad auto: in a graph only on a host's static layout
    counter = CompileCounter()
    step = torch.compile(model.train(), backend=counter, fullgraph=True)
    batch = fixed(wiki_batch)
    mask = batch["attention_mask"]
    B, S = mask.shape
    granule = B * S // 2  # two sizes: half the positions, and all of them
    shorter = mask.clone()
    shorter[1, int(mask[1].sum()) - 3 :] = 0  # three tokens fewer, in the same half of B * S
    longer = mask.clone()
    longer[0, :] = 1
    longer[4, :] = 1
    T = [int(m.sum()) for m in (mask, shorter, longer)]
    assert T[0] <= granule and T[1] <= granule < T[2]
    for i, m in enumerate((mask, shorter, longer)):
        host = host_layout({**batch, "attention_mask": m}, granule)
        out_graph, grads_graph = loss_and_grads(step, {**batch, "attention_mask": m, "unpadded": host})
        out_eager, grads_eager = loss_and_grads(model, {**batch, "attention_mask": m, "unpadded": host})
        torch.testing.assert_close(out_graph.loss, out_eager.loss, atol=1e-6, rtol=0)
        assert counter.frame_count == (1 if i < 2 else 2), (i, counter.frame_count)
    torch._dynamo.reset()


def test_how_a_model_runs_is_no_config_field_and_old_configs_still_load():
    """unpad and the varlen kernel are set on the model (set_execution, a one-line error for a bad name), never
    saved with its config; a config or checkpoint of an earlier version that carries them still loads."""
    model = BertForPreTraining(small_config())
    assert model.bert.unpad == "auto"
    set_execution(model, unpad="never", varlen_kernel="padded_sdpa")
    assert model.bert.unpad == "never"
    assert {m.varlen_kernel for m in model.modules() if isinstance(m, modeling.BertSelfAttention)} == {"padded_sdpa"}
    for bad in ({"unpad": "sometimes"}, {"varlen_kernel": "cudnn_varlen"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            set_execution(model, **bad)
    saved = model.config.to_dict()
    assert not set(modeling.RETIRED_CONFIG_KEYS) & set(saved)
    old = {**saved, "unpad": "never", "varlen_kernel": "cudnn_varlen", "unpad_fixed_sizes": 4, "dropout_mask_bits": 1}
    assert BertConfig.from_dict(old) == model.config


# ---------------------------------------------------------------------------------------------------------------
# The unpadded encoder against the padded one, and both against transformers


def twin_models(**overrides):
    """Two BertForPreTraining with the same weights, one always unpadding, one never."""
    torch.manual_seed(0)
    padded = set_execution(BertForPreTraining(small_config(**overrides)), unpad="never")
    unpadded = set_execution(BertForPreTraining(small_config(**overrides)), unpad="always")
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
    model = BertForPreTraining(small_config()).eval()  # unpad "auto"
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
    set_execution(ours, unpad=unpad)
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
