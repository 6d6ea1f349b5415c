"""Checkpoint interop: Hugging Face directories, NVIDIA .pt files, errors that list keys, safe loading."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import bert_config
from transformers.models.bert import modeling_bert as hf

import convert_checkpoint
import modeling
from bert_recipe.io import checkpoint_io
from bert_recipe.io.checkpoint_io import CheckpointError, from_pretrained
from modeling import BertConfig


@pytest.fixture(autouse=True)
def _no_grad():
    """Inference only here; scoped to each test so other test modules keep autograd."""
    with torch.no_grad():
        yield


def tiny_config(**overrides) -> BertConfig:
    return bert_config(
        **{"vocab_size": 1000, "hidden_size": 32, "intermediate_size": 64, "max_position_embeddings": 64, **overrides}
    )


def batch(seed=0, vocab=1000):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab, (2, 16), generator=g)
    mask = torch.ones_like(input_ids)
    mask[1, 11:] = 0
    return input_ids * mask, torch.zeros_like(input_ids), mask


def test_hf_round_trip_through_transformers(tmp_path, minilm_dir):
    # Hugging Face directory -> ours -> Hugging Face directory -> transformers: identical outputs.
    ours = from_pretrained(modeling.BertForPreTraining, minilm_dir, log=None).eval()
    checkpoint_io.save_hf_directory(ours, tmp_path / "hf", vocab_file=minilm_dir / "vocab.txt")
    theirs, info = hf.BertForPreTraining.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    theirs.eval()
    input_ids, token_type_ids, mask = batch(vocab=30522)
    mlm, nsp = ours(input_ids, token_type_ids, mask)
    reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=mask)
    # torch's fp32 tolerances (atol 1e-5, rtol 1.3e-6): the logits (up to ~10) differ in the last bits with the
    # number of threads the matmuls are split over (1e-5 at |x| = 1.9 with one thread, on CI).
    torch.testing.assert_close(mlm, reference.prediction_logits, atol=1e-5, rtol=1.3e-6)
    torch.testing.assert_close(nsp, reference.seq_relationship_logits, atol=1e-5, rtol=1.3e-6)
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()


def nvidia_style_checkpoint(model: modeling.BertForPreTraining, path, old_layernorm_names=False):
    """Write a checkpoint the way NVIDIA's run_pretraining.py did: {"model": state_dict} with `dense_act`
    names, the vocabulary padded to a multiple of 8, and (in older ones) LayerNorm gamma/beta."""
    state = checkpoint_io.nvidia_state_dict(model)
    if old_layernorm_names:
        state = {
            k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in state.items()
        }
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
    loaded = from_pretrained(
        modeling.BertForPreTraining, tmp_path / "ckpt.pt", config=tiny_config(vocab_size=1001), log=None
    ).eval()
    inputs = batch(vocab=1001)
    for a, b in zip(original(*inputs), loaded(*inputs)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# NVIDIA DeepLearningExamples' layout, written out by hand from the module names of its PyTorch BERT
# (PyTorch/LanguageModeling/BERT/modeling.py), not from our exporter: the fused bias+activation Linear of the
# intermediate layer, the pooler and the MLM transform is `dense_act` (LinearActivation: .weight, .bias); LayerNorm
# has .weight/.bias (checkpoints of the TF-converted lineage: .gamma/.beta); the decoder weight is tied to the word
# embeddings and saved under both names; run_pretraining.py / run_squad.py pad the vocabulary to a multiple of 8
# (30522 -> 30528 rows) before building the model, and save `model.module` when wrapped (a checkpoint saved from
# inside DDP has `module.` before every key).
NV_H, NV_I, NV_P, NV_V = 32, 64, 64, 30528


# Modules with a .weight and a .bias ([rows of the weight]), by their NVIDIA path: one encoder layer, then the rest.
NV_LAYER = [
    ("attention.self.query", (NV_H, NV_H)),
    ("attention.self.key", (NV_H, NV_H)),
    ("attention.self.value", (NV_H, NV_H)),
    ("attention.output.dense", (NV_H, NV_H)),
    ("attention.output.LayerNorm", (NV_H,)),
    ("intermediate.dense_act", (NV_I, NV_H)),
    ("output.dense", (NV_H, NV_I)),
    ("output.LayerNorm", (NV_H,)),
]
NV_POOLER = [("bert.pooler.dense_act", (NV_H, NV_H))]
NV_PRETRAINING_HEADS = [
    ("cls.predictions.transform.dense_act", (NV_H, NV_H)),
    ("cls.predictions.transform.LayerNorm", (NV_H,)),
    ("cls.seq_relationship", (2, NV_H)),
]


def with_biases(modules: list[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    return {
        key: shape
        for path, weight in modules
        for key, shape in ((f"{path}.weight", weight), (f"{path}.bias", weight[:1]))
    }


def nvidia_encoder_keys(layers: int) -> dict[str, tuple[int, ...]]:
    keys = {
        "bert.embeddings.word_embeddings.weight": (NV_V, NV_H),
        "bert.embeddings.position_embeddings.weight": (NV_P, NV_H),
        "bert.embeddings.token_type_embeddings.weight": (2, NV_H),
        **with_biases([("bert.embeddings.LayerNorm", (NV_H,))]),
    }
    for n in range(layers):
        keys.update(with_biases([(f"bert.encoder.layer.{n}.{path}", shape) for path, shape in NV_LAYER]))
    return {**keys, **with_biases(NV_POOLER)}


def nvidia_pretraining_keys(layers: int) -> dict[str, tuple[int, ...]]:
    return {
        **nvidia_encoder_keys(layers),
        "cls.predictions.bias": (NV_V,),
        **with_biases(NV_PRETRAINING_HEADS),
        "cls.predictions.decoder.weight": (NV_V, NV_H),
    }


def random_nvidia_state(keys: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(shape, generator=g) for k, shape in keys.items()}
    if "cls.predictions.decoder.weight" in state:  # one tensor under two names, as in a saved tied model
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    return state


def nvidia_config(pad_vocab_size_multiple: int = 1) -> BertConfig:
    return BertConfig(
        vocab_size=30522,
        hidden_size=NV_H,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=NV_I,
        max_position_embeddings=NV_P,
        hidden_act="gelu",
        pad_vocab_size_multiple=pad_vocab_size_multiple,
    )


def ours_for_nvidia(key: str) -> str:
    """Our (Hugging Face) name for an NVIDIA key, written out for the test: dense_act -> dense, gamma/beta ->
    weight/bias, no DDP prefix."""
    key = key.removeprefix("module.").replace(".dense_act.", ".dense.")
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


@pytest.mark.parametrize(
    "ddp_prefix,old_layernorm,pad_multiple", [(False, False, 8), (False, False, 1), (True, True, 1)]
)
def test_nvidia_layout_written_by_hand_loads_every_tensor(tmp_path, ddp_prefix, old_layernorm, pad_multiple):
    state = random_nvidia_state(nvidia_pretraining_keys(2))
    assert len(state) == 5 + 2 * 16 + 2 + 8  # embeddings, 2 layers, pooler, heads
    saved = dict(state)
    if old_layernorm:
        saved = {
            k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in saved.items()
        }
    if ddp_prefix:
        saved = {"module." + k: v for k, v in saved.items()}
    torch.save({"model": saved, "optimizer": {}, "files": [0, 1], "epoch": 2}, tmp_path / "nvidia.pt")

    lines = []
    model = from_pretrained(
        modeling.BertForPreTraining, tmp_path / "nvidia.pt", config=nvidia_config(pad_multiple), log=lines.append
    )
    assert lines == []  # every tensor has a place, nothing is started fresh
    rows = 30528 if pad_multiple == 8 else 30522
    assert model.bert.embeddings.word_embeddings.weight.shape == (rows, NV_H)
    ours = model.state_dict()
    for key, value in saved.items():
        name = ours_for_nvidia(key)
        expected = value[:rows] if value.shape[0] == NV_V else value
        assert torch.equal(ours[name], expected), key
    # The same by attribute, for a few NVIDIA names whose module differs from ours.
    assert torch.equal(
        model.bert.encoder.layer[1].intermediate.dense.weight,
        state["bert.encoder.layer.1.intermediate.dense_act.weight"],
    )
    assert torch.equal(model.bert.pooler.dense.bias, state["bert.pooler.dense_act.bias"])
    assert torch.equal(
        model.cls.predictions.transform.dense.weight, state["cls.predictions.transform.dense_act.weight"]
    )
    assert torch.equal(model.cls.predictions.bias, state["cls.predictions.bias"][:rows])
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight

    # Our NVIDIA exporter writes exactly the hand-written keys and shapes (vocabulary padded to 30528).
    exported = checkpoint_io.nvidia_state_dict(model)
    assert {k: tuple(v.shape) for k, v in exported.items()} == nvidia_pretraining_keys(2)
    for key, value in exported.items():
        torch.testing.assert_close(value[:30522], state[key][:30522], atol=0, rtol=0, msg=key)


def test_nvidia_squad_checkpoint_loads_into_question_answering(tmp_path):
    """NVIDIA's BertForQuestionAnswering keeps its BertModel's pooler (unused by the span head): it is reported as
    left out, and qa_outputs loads."""
    keys = {**nvidia_encoder_keys(2), "qa_outputs.weight": (2, NV_H), "qa_outputs.bias": (2,)}
    state = random_nvidia_state(keys, seed=1)
    torch.save({"model": state}, tmp_path / "pytorch_model.bin")
    lines = []
    qa = from_pretrained(
        modeling.BertForQuestionAnswering, tmp_path / "pytorch_model.bin", config=nvidia_config(), log=lines.append
    )
    assert [line.split(": ", 1)[1] for line in lines] == [
        "not used by BertForQuestionAnswering: bert.pooler.dense.weight, bert.pooler.dense.bias"
    ]
    assert torch.equal(qa.qa_outputs.weight, state["qa_outputs.weight"])
    assert torch.equal(
        qa.bert.encoder.layer[0].intermediate.dense.bias, state["bert.encoder.layer.0.intermediate.dense_act.bias"]
    )
    assert torch.equal(
        qa.bert.embeddings.word_embeddings.weight, state["bert.embeddings.word_embeddings.weight"][:30522]
    )
    # A bare encoder exports the same names without `bert.` (as Hugging Face's BertModel), vocabulary padded too.
    encoder = checkpoint_io.nvidia_state_dict(modeling.BertModel(nvidia_config()))
    assert {k: tuple(v.shape) for k, v in encoder.items()} == {
        k.removeprefix("bert."): shape for k, shape in nvidia_encoder_keys(2).items()
    }


def test_task_head_is_reported_fresh_and_pretraining_heads_left_out(tmp_path):
    source = modeling.BertForPreTraining(tiny_config())
    torch.save({"model": source.state_dict(), "config": source.config.to_dict()}, tmp_path / "ckpt_10.pt")
    lines = []
    qa = from_pretrained(modeling.BertForQuestionAnswering, tmp_path / "ckpt_10.pt", log=lines.append)
    assert any("initialised fresh: qa_outputs.weight, qa_outputs.bias" in line for line in lines), lines
    assert any(
        "not used by BertForQuestionAnswering" in line and "cls.seq_relationship.weight" in line for line in lines
    ), lines
    torch.testing.assert_close(
        qa.bert.encoder.layer[1].output.dense.weight, source.bert.encoder.layer[1].output.dense.weight
    )
    # The report as an object, which the scripts test (nobody reads the log lines back)
    _, report = checkpoint_io.load_pretrained(modeling.BertForQuestionAnswering, tmp_path / "ckpt_10.pt")
    assert report.fresh == ("qa_outputs.weight", "qa_outputs.bias")
    assert report.fresh_head("qa_outputs.") == list(report.fresh) and report.fresh_head("classifier.") == []
    assert "cls.seq_relationship.weight" in report.left_out and report.model == "BertForQuestionAnswering"


def test_missing_and_unexpected_encoder_keys_are_errors_that_list_them():
    model = modeling.BertForPreTraining(tiny_config())
    state = dict(model.state_dict())
    del state["bert.encoder.layer.1.attention.self.key.weight"]
    state["bert.encoder.layer.7.output.dense.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointError) as e:
        checkpoint_io.load_checkpoint_state(modeling.BertForPreTraining(tiny_config()), state, source="x.pt")
    message = str(e.value)
    assert "bert.encoder.layer.1.attention.self.key.weight" in message
    assert "bert.encoder.layer.7.output.dense.weight" in message and "x.pt" in message


def test_wrong_shape_is_an_error():
    state = modeling.BertForPreTraining(tiny_config(hidden_size=64)).state_dict()
    with pytest.raises(CheckpointError, match="wrong shape"):
        checkpoint_io.load_checkpoint_state(modeling.BertForPreTraining(tiny_config()), state)


class _Evil:
    def __reduce__(self):
        return (print, ("pickled code ran",))


class _Pickled:  # an ordinary class: torch.save writes it as a pickled global that weights_only refuses
    pass


@pytest.mark.parametrize("how", ["pickle.dump with __reduce__", "torch.save of a class instance"])
def test_pickled_code_is_never_executed_and_the_refusal_is_our_one_line(tmp_path, capsys, how):
    path = tmp_path / "evil.pt"
    if how.startswith("pickle"):
        with open(path, "wb") as f:
            pickle.dump({"model": _Evil()}, f)
    else:
        torch.save({"model": {"w": torch.zeros(2)}, "args": _Pickled()}, path)
    with pytest.raises(CheckpointError, match="was refused: it holds") as exc:
        checkpoint_io.read_state_dict(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and ".safetensors" in message
    # Ours only: none of PyTorch's advice to load it unsafely or to allowlist what it holds.
    assert "weights_only" not in message and "safe_globals" not in message and "In PyTorch" not in message
    if how.startswith("torch.save"):
        assert "_Pickled" in message  # what was refused, by name
    assert "pickled code ran" not in capsys.readouterr().out


def test_encoder_checkpoint_without_bert_prefix_loads_into_pretraining_model(minilm_dir):
    # MiniLM's safetensors keys have no `bert.` prefix and no MLM/NSP head.
    lines = []
    model = from_pretrained(modeling.BertForPreTraining, minilm_dir, log=lines.append)
    assert len(lines) == 1 and lines[0].split(": ", 1)[1].startswith("initialised fresh: cls.")
    assert model.config.hidden_size == 384


def test_converter_writes_hf_and_nvidia(tmp_path, minilm_dir):
    source = modeling.BertForPreTraining(tiny_config()).eval()
    torch.save({"model": source.state_dict(), "config": source.config.to_dict()}, tmp_path / "ckpt_5.pt")
    assert (
        convert_checkpoint.main(
            [
                "--input",
                str(tmp_path / "ckpt_5.pt"),
                "--output",
                str(tmp_path / "hf"),
                "--vocab_file",
                str(minilm_dir / "vocab.txt"),
            ]
        )
        == 0
    )
    theirs, info = hf.BertForPreTraining.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert (
        convert_checkpoint.main(
            ["--input", str(tmp_path / "hf"), "--output", str(tmp_path / "nv.pt"), "--format", "nvidia"]
        )
        == 0
    )
    back = from_pretrained(modeling.BertForPreTraining, tmp_path / "nv.pt", log=None).eval()
    inputs = batch()
    reference = theirs.eval()(input_ids=inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2])
    torch.testing.assert_close(back(*inputs)[0], reference.prediction_logits, atol=1e-5, rtol=0)
    with pytest.raises(SystemExit, match=r"^convert_checkpoint.py: error: --input .*nothing not found"):
        convert_checkpoint.main(["--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "o")])
