"""The model against Hugging Face transformers: real MiniLM weights for the encoder, random weights copied
through our checkpoint loader (checkpoint_io) for the pre-training and task heads; the named-tuple outputs."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import SENTENCES, padded_batch
from transformers.models.bert import modeling_bert as hf
from transformers.models.bert.configuration_bert import BertConfig as HFConfig

import modeling
from bert_recipe.io import checkpoint_io
from modeling import BertConfig
from tokenization import BertTokenizer


@pytest.fixture(autouse=True)
def _no_grad():
    """Inference only here; scoped to each test so other test modules keep autograd."""
    with torch.no_grad():
        yield


def small_hf_config(**overrides) -> HFConfig:
    kwargs = dict(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    kwargs.update(overrides)
    return HFConfig(**kwargs)


def ours_from_hf(cls, hf_model, **kwargs):
    config = BertConfig.from_dict(hf_model.config.to_dict())
    model = cls(config, **kwargs)
    report = checkpoint_io.load_checkpoint_state(model, hf_model.state_dict(), source="transformers")
    assert report.fresh == () and report.left_out == () and report.lines() == [], report  # every tensor placed
    return model.eval()


def random_batch(vocab_size=1000, batch=3, seq=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, seq), generator=g)
    lengths = torch.tensor([seq, seq - 7, seq - 13])
    attention_mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    token_type_ids = (torch.arange(seq)[None] >= (lengths[:, None] // 2)).long() * attention_mask
    return input_ids, token_type_ids, attention_mask


# ---------------------------------------------------------------------------------------------------------------
# The encoder with real weights


def test_minilm_encoder_matches_transformers(minilm_dir):
    ours = checkpoint_io.from_pretrained(modeling.BertModel, minilm_dir, log=None).eval()
    theirs = hf.BertModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt")
    input_ids, token_type_ids, attention_mask = padded_batch(tokenizer, SENTENCES)
    assert len(set(attention_mask.sum(1).tolist())) == len(SENTENCES)  # really different lengths

    sequence_output, pooled_output = ours(input_ids, token_type_ids, attention_mask)
    reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(sequence_output[real], reference.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled_output, reference.pooler_output, atol=1e-5, rtol=0)


def test_padding_does_not_change_real_positions(minilm_dir):
    model = checkpoint_io.from_pretrained(modeling.BertModel, minilm_dir, log=None).eval()
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt")
    alone = padded_batch(tokenizer, SENTENCES[1:2])
    batched = padded_batch(tokenizer, SENTENCES)
    length = alone[0].shape[1]
    out_alone, _ = model(*alone)
    out_batched, _ = model(*batched)
    torch.testing.assert_close(out_batched[1, :length], out_alone[0], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Heads, with random transformers weights copied through the checkpoint loader


def test_pretraining_heads_and_loss_match_transformers():
    torch.manual_seed(0)
    theirs = hf.BertForPreTraining(small_hf_config()).eval()
    ours = ours_from_hf(modeling.BertForPreTraining, theirs)
    input_ids, token_type_ids, attention_mask = random_batch()
    labels = torch.full_like(input_ids, -1)
    labels[0, 3], labels[0, 10], labels[1, 5], labels[2, 1] = 17, 400, 999, 5
    nsp_labels = torch.tensor([0, 1, 1])

    total, mlm, nsp, scores, nsp_scores = ours(input_ids, token_type_ids, attention_mask, labels, nsp_labels)
    reference = theirs(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        labels=labels.masked_fill(labels < 0, -100),
        next_sentence_label=nsp_labels,
    )
    labelled = labels >= 0
    torch.testing.assert_close(scores, reference.prediction_logits[labelled], atol=1e-5, rtol=0)
    torch.testing.assert_close(nsp_scores, reference.seq_relationship_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(total, reference.loss, atol=1e-5, rtol=0)
    # The loss is the written-out formula: mean CE over labelled positions + NSP CE.
    expected = torch.nn.functional.cross_entropy(
        reference.prediction_logits[labelled], labels[labelled]
    ) + torch.nn.functional.cross_entropy(reference.seq_relationship_logits, nsp_labels)
    torch.testing.assert_close(total, expected, atol=1e-5, rtol=0)
    # Without labels: full-vocabulary scores at every position.
    all_scores, _ = ours(input_ids, token_type_ids, attention_mask)
    torch.testing.assert_close(all_scores, reference.prediction_logits, atol=1e-5, rtol=0)


def test_question_answering_matches_transformers():
    torch.manual_seed(1)
    theirs = hf.BertForQuestionAnswering(small_hf_config()).eval()
    ours = ours_from_hf(modeling.BertForQuestionAnswering, theirs)
    input_ids, token_type_ids, attention_mask = random_batch(seed=1)
    starts, ends = torch.tensor([1, 4, 30]), torch.tensor([2, 6, 31])  # 30, 31 are outside: ignored
    loss, start, end = ours(input_ids, token_type_ids, attention_mask, starts, ends)
    reference = theirs(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        start_positions=starts,
        end_positions=ends,
    )
    torch.testing.assert_close(start, reference.start_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(end, reference.end_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, reference.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_labels", [1, 3])
def test_sequence_classification_matches_transformers(num_labels):
    torch.manual_seed(2)
    theirs = hf.BertForSequenceClassification(small_hf_config(num_labels=num_labels)).eval()
    ours = ours_from_hf(modeling.BertForSequenceClassification, theirs, num_labels=num_labels)
    input_ids, token_type_ids, attention_mask = random_batch(seed=2)
    labels = torch.tensor([0.5, 2.0, -1.0]) if num_labels == 1 else torch.tensor([0, 2, 1])
    loss, logits = ours(input_ids, token_type_ids, attention_mask, labels)
    reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels)
    torch.testing.assert_close(logits, reference.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, reference.loss, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Outputs: named tuples whose positional order is the one callers unpacked before the fields had names


def test_outputs_are_named_tuples_with_fixed_fields_in_positional_order():
    torch.manual_seed(3)
    config = BertConfig.from_dict(small_hf_config().to_dict())
    input_ids, token_type_ids, attention_mask = random_batch()
    labels = torch.full_like(input_ids, -1)
    labels[0, 2], labels[2, 4] = 7, 8
    expected = {  # (model, arguments after the three inputs) -> (type, its fields in order)
        "encoder": (modeling.BertModel(config), (), modeling.BertModelOutput, ("sequence_output", "pooled_output")),
        "pretraining": (
            modeling.BertForPreTraining(config),
            (),
            modeling.PreTrainingOutput,
            ("prediction_scores", "seq_relationship_score"),
        ),
        "pretraining+labels": (
            modeling.BertForPreTraining(config),
            (labels, torch.tensor([0, 1, 1])),
            modeling.PreTrainingOutputWithLoss,
            ("loss", "mlm_loss", "nsp_loss", "prediction_scores", "seq_relationship_score"),
        ),
        "qa": (
            modeling.BertForQuestionAnswering(config),
            (),
            modeling.QuestionAnsweringOutput,
            ("start_logits", "end_logits"),
        ),
        "qa+labels": (
            modeling.BertForQuestionAnswering(config),
            (torch.tensor([1, 2, 3]), torch.tensor([2, 2, 4])),
            modeling.QuestionAnsweringOutputWithLoss,
            ("loss", "start_logits", "end_logits"),
        ),
        "classification": (
            modeling.BertForSequenceClassification(config, num_labels=3),
            (),
            modeling.SequenceClassificationOutput,
            ("logits",),
        ),
        "classification+labels": (
            modeling.BertForSequenceClassification(config, num_labels=3),
            (torch.tensor([0, 2, 1]),),
            modeling.SequenceClassificationOutputWithLoss,
            ("loss", "logits"),
        ),
    }
    outs = {}
    for name, (model, extra, cls, fields) in expected.items():
        out = outs[name] = model.eval()(input_ids, token_type_ids, attention_mask, *extra)
        assert type(out) is cls and isinstance(out, tuple), name
        assert out._fields == fields and len(out) == len(fields), name
    # Positional order is the API of callers that unpack: unpack by position and check each value against the
    # written-out formula of what that position must hold (a swapped order fails here).
    ce = torch.nn.functional.cross_entropy
    loss, mlm, nsp, scores, relationship = outs["pretraining+labels"]
    torch.testing.assert_close(mlm, ce(scores, labels[labels != -1]))  # scores [M, V] at the labelled slots
    torch.testing.assert_close(nsp, ce(relationship, torch.tensor([0, 1, 1])))
    torch.testing.assert_close(loss, mlm + nsp)
    loss, start, end = outs["qa+labels"]
    torch.testing.assert_close(loss, (ce(start, torch.tensor([1, 2, 3])) + ce(end, torch.tensor([2, 2, 4]))) / 2)
    loss, logits = outs["classification+labels"]
    torch.testing.assert_close(loss, ce(logits, torch.tensor([0, 2, 1])))
    sequence_output, pooled = outs["encoder"]  # the pooler is tanh(dense([CLS]'s hidden state))
    pooler = expected["encoder"][0].pooler.dense
    torch.testing.assert_close(pooled, torch.tanh(pooler(sequence_output[:, 0])))
    # Shapes behind the names: scores at every position without labels, at the M labelled ones with them.
    scores = expected["pretraining"][0](input_ids, token_type_ids, attention_mask)
    assert scores.prediction_scores.shape == (3, 24, 1000) and scores.seq_relationship_score.shape == (3, 2)
    with_loss = expected["pretraining"][0](input_ids, token_type_ids, attention_mask, labels)
    assert with_loss.prediction_scores.shape == (2, 1000) and with_loss.nsp_loss is None
    assert torch.equal(with_loss.loss, with_loss.mlm_loss)
    pooled = modeling.BertModel(config, add_pooling_layer=False)(input_ids, token_type_ids, attention_mask)
    assert pooled.pooled_output is None and pooled.sequence_output.shape == (3, 24, 64)


# ---------------------------------------------------------------------------------------------------------------
# Config and initialisation


def test_config_reads_google_and_hf_json(tmp_path, minilm_dir, repo_root):
    google = {
        "vocab_size": 30522,
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
    }
    (tmp_path / "bert_config.json").write_text(json.dumps(google))
    config = BertConfig.from_json_file(tmp_path / "bert_config.json")
    assert (config.hidden_size, config.num_hidden_layers, config.layer_norm_eps) == (1024, 24, 1e-12)
    config.to_json_file(tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text()) == {**google, "layer_norm_eps": 1e-12}
    minilm = BertConfig.from_json_file(minilm_dir / "config.json")  # Hugging Face keys, extra ones ignored
    assert (minilm.hidden_size, minilm.num_hidden_layers, minilm.intermediate_size) == (384, 6, 1536)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("num_attention_heads", 10, "divisible"),
        ("hidden_size", 0, "positive"),
        ("hidden_act", "tanh", "hidden_act"),
        ("hidden_dropout_prob", 1.5, "hidden_dropout_prob"),
    ],
)
def test_config_validation_names_the_field(tmp_path, field, value, message):
    d = BertConfig().to_dict()
    d[field] = value
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message) as e:
        BertConfig.from_json_file(tmp_path / "bad.json")
    assert str(tmp_path / "bad.json") in str(e.value) and "\n" not in str(e.value)


def test_padded_vocabulary_is_cut_on_export():
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        pad_vocab_size_multiple=8,
    )
    model = modeling.BertForPreTraining(config)
    assert model.bert.embeddings.word_embeddings.weight.shape[0] == 30528
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    state = checkpoint_io.export_state_dict(model)
    assert state["bert.embeddings.word_embeddings.weight"].shape[0] == 30522
    assert state["cls.predictions.bias"].shape[0] == 30522
    assert checkpoint_io.nvidia_state_dict(model)["cls.predictions.bias"].shape[0] == 30528


def test_initialisation_is_googles():
    config = BertConfig(
        vocab_size=5000,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=1024,
        initializer_range=0.02,
    )
    model = modeling.BertForPreTraining(config)
    for name, p in model.named_parameters():
        if "LayerNorm.weight" in name:
            assert torch.all(p == 1), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:  # every Linear and Embedding weight: normal(0, 0.02)
            assert abs(p.std().item() - 0.02) < 0.002 and abs(p.mean().item()) < 0.002, name
