"""Model configs: every JSON in configs/ and bert_config.json loads, has Google's key set and builds a model whose
parameter count matches Hugging Face transformers' BertForPreTraining built from the same file (the independent
reference) and the published sizes (BERT-large ~335M, BERT-base ~110M with the pre-training heads).

BERT-large and BERT-base are built on the meta device (shapes only, no memory); the small configs for real, with
one forward pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modeling

REPO = Path(__file__).resolve().parent.parent
CONFIG_FILES = sorted((REPO / "configs").glob("*.json")) + [REPO / "bert_config.json"]
# The keys of Google's bert_config.json (uncased_L-24_H-1024_A-16), nothing more, nothing less.
GOOGLE_KEYS = {
    "attention_probs_dropout_prob",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
}
GOOGLE_KEY_SET_FILES = ("bert_config.json", "bert-base.json", "bert-mini.json", "bert-small-cpu.json")
# (layers, hidden, heads, intermediate), as the brief and the BERT paper define them.
EXPECTED_SHAPES = {
    "bert_config.json": (24, 1024, 16, 4096),
    "bert-base.json": (12, 768, 12, 3072),
    "bert-mini.json": (4, 256, 4, 1024),
}


def hf_parameter_count(path: Path) -> int:
    """transformers' BertForPreTraining from the same JSON, on the meta device (tied weights counted once)."""
    from transformers.models.bert.modeling_bert import BertConfig as HFConfig
    from transformers.models.bert.modeling_bert import BertForPreTraining as HFBertForPreTraining

    with torch.device("meta"):
        model = HFBertForPreTraining(HFConfig(**json.loads(path.read_text())))
    return sum(p.numel() for p in model.parameters())


def test_the_expected_config_files_exist():
    names = {p.name for p in CONFIG_FILES}
    assert {"bert_config.json", "bert-base.json", "bert-mini.json", "bert-small-cpu.json"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_loads(path):
    raw = json.loads(path.read_text())
    if path.name in GOOGLE_KEY_SET_FILES:
        assert set(raw) == GOOGLE_KEYS, f"{path.name}: keys differ from Google's: {set(raw) ^ GOOGLE_KEYS}"
        assert raw["vocab_size"] == 30522 and raw["hidden_act"] == "gelu" and raw["type_vocab_size"] == 2
    config = modeling.BertConfig.from_json_file(path)
    assert config.hidden_size % config.num_attention_heads == 0
    if path.name in EXPECTED_SHAPES:
        shape = (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size)
        assert shape == EXPECTED_SHAPES[path.name]
    for key, value in raw.items():  # every value read as written
        assert getattr(config, key) == value, key


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_parameter_count_matches_transformers(path):
    config = modeling.BertConfig.from_json_file(path)
    with torch.device("meta"):
        ours = modeling.BertForPreTraining(config)
    assert modeling.count_parameters(ours) == hf_parameter_count(path)


# Published sizes: the encoder (BertModel with pooler) of BERT-large has 335M parameters and of BERT-base 110M
# (109.5M); the pre-training heads add the MLM transform, the output bias and the NSP layer (1.1M / 0.6M).
@pytest.mark.parametrize(
    "name, encoder_millions, pretraining_millions",
    [("bert_config.json", 335.1, 336.2), ("bert-base.json", 109.5, 110.1)],
)
def test_published_sizes(name, encoder_millions, pretraining_millions):
    path = REPO / name if name == "bert_config.json" else REPO / "configs" / name
    config = modeling.BertConfig.from_json_file(path)
    with torch.device("meta"):
        encoder = modeling.BertModel(config)
        pretraining = modeling.BertForPreTraining(config)
    assert modeling.count_parameters(encoder) / 1e6 == pytest.approx(encoder_millions, abs=0.1)
    assert modeling.count_parameters(pretraining) / 1e6 == pytest.approx(pretraining_millions, abs=0.1)


@pytest.mark.parametrize("name", ["bert-mini.json", "bert-small-cpu.json"])
def test_small_configs_run_a_pretraining_forward(name):
    config = modeling.BertConfig.from_json_file(REPO / "configs" / name)
    torch.manual_seed(0)
    model = modeling.BertForPreTraining(config).eval()
    input_ids = torch.randint(1000, config.vocab_size, (2, 16))
    labels = torch.full_like(input_ids, -1)
    labels[:, 3] = input_ids[:, 3]
    with torch.no_grad():
        total, mlm, nsp, scores, nsp_scores = model(
            input_ids, masked_lm_labels=labels, next_sentence_labels=torch.tensor([0, 1])
        )
    assert scores.shape == (2, config.vocab_size) and nsp_scores.shape == (2, 2)
    # Freshly initialised (std 0.02): the masked-LM loss is near that of a uniform guess over the vocabulary.
    assert float(mlm) == pytest.approx(float(torch.log(torch.tensor(config.vocab_size * 1.0))), abs=0.5)
    assert torch.isfinite(total)
