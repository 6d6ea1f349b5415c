"""The speed path (bert_padding.py and its use in modeling.py) against the plain one: the fixed-slot masked-LM head
gives the sparse head's loss and compiles into one graph; the unpadded encoder gives the padded encoder's outputs,
losses and gradients on real WikiText-2 text with heavy padding, and both match transformers on the real MiniLM
weights; unpad/pad round-trips; the kernel rule never picks a dropout-free kernel when dropout is configured."""
from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from transformers.models.bert import modeling_bert as hf

import bert_padding
import checkpoint_io
import modeling
import pretraining_data
from conftest import SENTENCES, padded_batch
from modeling import BertConfig, BertForPreTraining
from tokenization import BertTokenizer

P = 8  # prediction slots per sequence (the shards' max_predictions_per_seq)


def small_config(**overrides) -> BertConfig:
    kwargs = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    kwargs.update(overrides)
    return BertConfig(**kwargs)


@pytest.fixture(scope="module")
def wiki_batch(shared_data, uncased_vocab) -> dict[str, torch.Tensor]:
    """Real WikiText-2 lines, cut to very different lengths (3 to 60 words) and zero-padded to the longest (cut
    at 64 tokens): about half the positions are padding. Masked as in the shards: up to P positions per row
    (never [CLS] or the last [SEP]; short rows use fewer slots, the rest 0), the tokens there replaced by [MASK]."""
    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    lines = [line.strip() for line in (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
             .splitlines() if len(line.split()) > 60 and not line.strip().startswith("=")]
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
    return {"input_ids": masked, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
            "masked_lm_labels": torch.from_numpy(pretraining_data.mlm_labels(positions, ids, masked.shape[1])),
            "masked_lm_positions": torch.from_numpy(positions), "masked_lm_ids": torch.from_numpy(ids),
            "next_sentence_labels": torch.tensor([0, 1, 1, 0, 1, 0])}


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
    model = BertForPreTraining(small_config()).train()
    sparse_out, sparse_grads = loss_and_grads(model, sparse(wiki_batch))
    fixed_out, fixed_grads = loss_and_grads(model, fixed(wiki_batch))
    for field in ("loss", "mlm_loss", "nsp_loss"):
        diff = (getattr(sparse_out, field) - getattr(fixed_out, field)).abs().item()
        assert diff <= 1e-6, (field, diff)
    used = wiki_batch["masked_lm_positions"] > 0
    assert fixed_out.prediction_scores.shape == (*used.shape, 30522)
    torch.testing.assert_close(fixed_out.prediction_scores[used], sparse_out.prediction_scores, atol=1e-6, rtol=0)
    assert max_grad_diff(sparse_grads, fixed_grads) <= 1e-6
    with pytest.raises(ValueError, match="masked_lm_ids"):
        model(wiki_batch["input_ids"], masked_lm_positions=wiki_batch["masked_lm_positions"])


def test_fixed_slot_pretraining_step_compiles_into_one_graph():
    """torch.compile(fullgraph=True) of forward + backward with the fixed-slot head (padded batch): no graph break,
    no host sync; loss and gradients as in eager mode. The one compile of this file (1-2 minutes on 2 cores)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config).train()
    ids = torch.randint(5, 50, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    batch = {"input_ids": ids * mask, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
             "masked_lm_positions": torch.tensor([[2, 5, 9], [3, 0, 0]]),
             "masked_lm_ids": torch.tensor([[7, 8, 9], [10, 0, 0]]), "next_sentence_labels": torch.tensor([0, 1])}
    eager_out, eager_grads = loss_and_grads(model, batch)
    compiled = torch.compile(model, fullgraph=True)
    compiled_out, compiled_grads = loss_and_grads(compiled, batch)
    compiled_grads = {k.removeprefix("_orig_mod."): v for k, v in compiled_grads.items()}
    assert abs(eager_out.loss.item() - compiled_out.loss.item()) <= 1e-5
    assert max_grad_diff(eager_grads, compiled_grads) <= 1e-5
