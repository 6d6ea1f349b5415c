"""Checkpoint interop: Hugging Face directories, NVIDIA .pt files, errors that list keys, safe loading."""
from __future__ import annotations

import pickle

import pytest
import torch
from transformers.models.bert import modeling_bert as hf

import convert_checkpoint
import modeling
from modeling import BertConfig, CheckpointError



@pytest.fixture(autouse=True)
def _no_grad():
    """Inference only here; scoped to each test so other test modules keep autograd."""
    with torch.no_grad():
        yield


def tiny_config(**overrides) -> BertConfig:
    kwargs = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    kwargs.update(overrides)
    return BertConfig(**kwargs)


def batch(seed=0, vocab=1000):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab, (2, 16), generator=g)
    mask = torch.ones_like(input_ids)
    mask[1, 11:] = 0
    return input_ids * mask, torch.zeros_like(input_ids), mask


def test_hf_round_trip_through_transformers(tmp_path, minilm_dir):
    # Hugging Face directory -> ours -> Hugging Face directory -> transformers: identical outputs.
    ours = modeling.BertForPreTraining.from_pretrained(minilm_dir, log=None).eval()
    modeling.save_hf_directory(ours, tmp_path / "hf", vocab_file=minilm_dir / "vocab.txt")
    theirs, info = hf.BertForPreTraining.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    theirs.eval()
    input_ids, token_type_ids, mask = batch(vocab=30522)
    mlm, nsp = ours(input_ids, token_type_ids, mask)
    reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=mask)
    torch.testing.assert_close(mlm, reference.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(nsp, reference.seq_relationship_logits, atol=1e-5, rtol=0)
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()


def nvidia_style_checkpoint(model: modeling.BertForPreTraining, path, old_layernorm_names=False):
    """Write a checkpoint the way NVIDIA's run_pretraining.py did: {"model": state_dict} with `dense_act`
    names, the vocabulary padded to a multiple of 8, and (in older ones) LayerNorm gamma/beta."""
    state = modeling.nvidia_state_dict(model)
    if old_layernorm_names:
        state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                 for k, v in state.items()}
    state = {"module." + k: v for k, v in state.items()}  # saved from inside DDP
    torch.save({"model": state, "optimizer": {}, "files": [0, 1], "epoch": 3}, path)


@pytest.mark.parametrize("old_names", [False, True])
def test_nvidia_checkpoint_loads_with_same_outputs(tmp_path, old_names):
    torch.manual_seed(0)
    original = modeling.BertForPreTraining(tiny_config(vocab_size=1001)).eval()
    nvidia_style_checkpoint(original, tmp_path / "ckpt.pt", old_layernorm_names=old_names)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]
    assert state["module.cls.predictions.bias"].shape[0] == 1008  # padded, as NVIDIA's are
    assert any(".dense_act." in k for k in state)
    loaded = modeling.BertForPreTraining.from_pretrained(tmp_path / "ckpt.pt", config=tiny_config(vocab_size=1001),
                                                         log=None).eval()
    inputs = batch(vocab=1001)
    for a, b in zip(original(*inputs), loaded(*inputs)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_task_head_is_reported_fresh_and_pretraining_heads_left_out(tmp_path):
    source = modeling.BertForPreTraining(tiny_config())
    torch.save({"model": source.state_dict(), "config": source.config.to_dict()}, tmp_path / "ckpt_10.pt")
    lines = []
    qa = modeling.BertForQuestionAnswering.from_pretrained(tmp_path / "ckpt_10.pt", log=lines.append)
    assert any("initialised fresh: qa_outputs.weight, qa_outputs.bias" in line for line in lines), lines
    assert any("not used by BertForQuestionAnswering" in line and "cls.seq_relationship.weight" in line
               for line in lines), lines
    torch.testing.assert_close(qa.bert.encoder.layer[1].output.dense.weight,
                               source.bert.encoder.layer[1].output.dense.weight)


def test_missing_and_unexpected_encoder_keys_are_errors_that_list_them():
    model = modeling.BertForPreTraining(tiny_config())
    state = dict(model.state_dict())
    del state["bert.encoder.layer.1.attention.self.key.weight"]
    state["bert.encoder.layer.7.output.dense.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointError) as e:
        modeling.load_checkpoint_state(modeling.BertForPreTraining(tiny_config()), state, source="x.pt")
    message = str(e.value)
    assert "bert.encoder.layer.1.attention.self.key.weight" in message
    assert "bert.encoder.layer.7.output.dense.weight" in message and "x.pt" in message


def test_wrong_shape_is_an_error():
    state = modeling.BertForPreTraining(tiny_config(hidden_size=64)).state_dict()
    with pytest.raises(CheckpointError, match="wrong shape"):
        modeling.load_checkpoint_state(modeling.BertForPreTraining(tiny_config()), state)


class _Evil:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_pickled_code_is_never_executed(tmp_path, capsys):
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"model": _Evil()}, f)
    with pytest.raises(CheckpointError, match="weights_only"):
        modeling.read_state_dict(tmp_path / "evil.pt")
    assert "pickled code ran" not in capsys.readouterr().out


def test_encoder_checkpoint_without_bert_prefix_loads_into_pretraining_model(minilm_dir):
    # MiniLM's safetensors keys have no `bert.` prefix and no MLM/NSP head.
    lines = []
    model = modeling.BertForPreTraining.from_pretrained(minilm_dir, log=lines.append)
    assert len(lines) == 1 and lines[0].split(": ", 1)[1].startswith("initialised fresh: cls.")
    assert model.config.hidden_size == 384


def test_converter_writes_hf_and_nvidia(tmp_path, minilm_dir):
    source = modeling.BertForPreTraining(tiny_config()).eval()
    torch.save({"model": source.state_dict(), "config": source.config.to_dict()}, tmp_path / "ckpt_5.pt")
    assert convert_checkpoint.main(["--input", str(tmp_path / "ckpt_5.pt"), "--output", str(tmp_path / "hf"),
                                    "--vocab_file", str(minilm_dir / "vocab.txt")]) == 0
    theirs, info = hf.BertForPreTraining.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert convert_checkpoint.main(["--input", str(tmp_path / "hf"), "--output", str(tmp_path / "nv.pt"),
                                    "--format", "nvidia"]) == 0
    back = modeling.BertForPreTraining.from_pretrained(tmp_path / "nv.pt", log=None).eval()
    inputs = batch()
    reference = theirs.eval()(input_ids=inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2])
    torch.testing.assert_close(back(*inputs)[0], reference.prediction_logits, atol=1e-5, rtol=0)
    assert convert_checkpoint.main(["--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "o")]) == 2
