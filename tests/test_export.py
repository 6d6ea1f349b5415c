"""triton/export_model.py: ONNX and TorchScript exports match PyTorch (and Hugging Face transformers) on real,
padded inputs, from every checkpoint layout the loader takes.

Real weights: all-MiniLM-L6-v2 (6 layers, hidden 384) with a seeded QA head, saved as a Hugging Face directory and
as this project's ckpt .pt; a small random classifier saved in NVIDIA's layout. Real inputs: SQuAD questions and
contexts, MRPC sentence pairs, tokenized with the project's tokenizer, with rows of different lengths padded.
"""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_recipe.io.checkpoint_io import from_pretrained, nvidia_state_dict, save_hf_directory
from bert_recipe.io.triton_scripts import load_triton_script as load_script
from modeling import BertConfig, BertForQuestionAnswering, BertForSequenceClassification
from tokenization import BertTokenizer

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def export_model():
    return load_script("export_model")


def encode_pairs(tokenizer: BertTokenizer, pairs: list[tuple[str, str]], max_len: int, dtype) -> tuple:
    """[CLS] a [SEP] b [SEP] per pair (b truncated to max_len), padded with id 0 / mask 0 to the longest row."""
    rows = []
    for a, b in pairs:
        ids_a, ids_b = tokenizer.encode(a), tokenizer.encode(b)
        ids_b = ids_b[: max_len - len(ids_a) - 3]
        cls, sep = tokenizer.token_id("[CLS]"), tokenizer.token_id("[SEP]")
        ids = [cls] + ids_a + [sep] + ids_b + [sep]
        rows.append((ids, [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = np.zeros((len(rows), width), dtype)
    token_type_ids = np.zeros_like(input_ids)
    attention_mask = np.zeros_like(input_ids)
    for i, (ids, types) in enumerate(rows):
        input_ids[i, : len(ids)] = ids
        token_type_ids[i, : len(ids)] = types
        attention_mask[i, : len(ids)] = 1
    assert attention_mask.min() == 0, "the batch must contain padding"
    return input_ids, token_type_ids, attention_mask


@pytest.fixture(scope="module")
def squad_batches(shared_data, minilm_dir):
    """Two padded batches of real SQuAD question/context pairs (int64): 3 rows and 2 rows of other lengths."""
    records = json.loads((shared_data / "hf-test-fixtures" / "SQUAD" / "sample.json").read_text())["data"]
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    pairs = [(r["question"], r["context"]) for r in records]
    first = encode_pairs(
        tokenizer, [pairs[0], (pairs[1][0], pairs[1][1][:150]), (pairs[2][0], pairs[2][1][:60])], 128, np.int64
    )
    second = encode_pairs(tokenizer, [(pairs[3][0], pairs[3][1][:90]), pairs[4]], 96, np.int64)
    return [first, second]


@pytest.fixture(scope="module")
def qa_model(minilm_dir):
    """MiniLM encoder (real weights) with a seeded QA head: what a briefly fine-tuned model looks like."""
    torch.manual_seed(0)
    model = from_pretrained(BertForQuestionAnswering, minilm_dir, log=None).eval()
    with torch.no_grad():  # a head with a clear signal, so answers are not decided by near-ties
        model.qa_outputs.weight.normal_(0, 0.2)
    return model


def torch_outputs(model, batch) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*(torch.from_numpy(a).long() for a in batch))
    return [t.numpy() for t in out]


def onnx_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_outputs(session, batch) -> list[np.ndarray]:
    return session.run(None, dict(zip(("input_ids", "token_type_ids", "attention_mask"), batch)))


def torchscript_module(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated in 2.13, still served
        return torch.jit.load(str(path))


def torchscript_outputs(module, batch) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in module(*(torch.from_numpy(a) for a in batch))]


def max_diff(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_qa_from_hf_directory_int64(export_model, qa_model, squad_batches, minilm_dir, tmp_path):
    """A Hugging Face directory -> ONNX + TorchScript (int64); matches our PyTorch and transformers' model."""
    hf_dir = tmp_path / "hf"
    save_hf_directory(qa_model, hf_dir, vocab_file=minilm_dir / "vocab.txt")
    out = tmp_path / "export"
    assert (
        export_model.main(["--checkpoint", str(hf_dir), "--task", "qa", "--output_dir", str(out), "--no_verify"]) == 0
    )  # the built-in check runs in the classification tests

    info = json.loads((out / "export.json").read_text())
    assert info["input_dtype"] == "int64" and info["output_names"] == ["start_logits", "end_logits"]
    assert info["opset"] >= 17 and (out / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()

    import onnx

    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert max(i.version for i in onnx.load(str(out / "model.onnx"), load_external_data=False).opset_import) >= 17
    for tensor in list(graph.input) + list(graph.output):  # batch and sequence axes are symbolic
        dims = tensor.type.tensor_type.shape.dim
        assert dims[0].dim_param and dims[1].dim_param, tensor.name
    assert [i.type.tensor_type.elem_type for i in graph.input] == [onnx.TensorProto.INT64] * 3

    from transformers.models.bert.modeling_bert import BertForQuestionAnswering as HFBertForQuestionAnswering

    hf = HFBertForQuestionAnswering.from_pretrained(str(hf_dir), attn_implementation="eager").eval()
    session, scripted = onnx_session(out / "model.onnx"), torchscript_module(out / "model.pt")
    for batch in squad_batches:  # two batch shapes, neither the traced one
        reference = torch_outputs(qa_model, batch)
        with torch.no_grad():
            hf_out = hf(
                **{k: torch.from_numpy(v) for k, v in zip(("input_ids", "token_type_ids", "attention_mask"), batch)}
            )
        hf_ref = [hf_out.start_logits.numpy(), hf_out.end_logits.numpy()]
        got_onnx = onnx_outputs(session, batch)
        got_ts = torchscript_outputs(scripted, batch)
        mask = batch[2].astype(bool)  # transformers' logits at padded positions are not masked either: compare all
        assert got_onnx[0].shape == batch[0].shape and mask.sum() < mask.size
        assert max_diff(got_onnx, reference) <= TOLERANCE
        assert max_diff(got_ts, reference) <= TOLERANCE
        assert max_diff(got_onnx, hf_ref) <= TOLERANCE


def test_qa_from_project_checkpoint_int32(export_model, qa_model, squad_batches, tmp_path):
    """This project's ckpt .pt ({"model": ..., "config": ...}) -> int32 ONNX; results equal the int64 PyTorch
    model's, and int64 inputs are refused by the int32 graph. (int32 TorchScript: the classification test.)"""
    ckpt = tmp_path / "ckpt_100.pt"
    torch.save({"model": qa_model.state_dict(), "config": qa_model.config.to_dict(), "step": 100}, ckpt)
    out = tmp_path / "export"
    assert (
        export_model.main(
            [
                "--checkpoint",
                str(ckpt),
                "--task",
                "qa",
                "--output_dir",
                str(out),
                "--input_dtype",
                "int32",
                "--format",
                "onnx",
                "--no_verify",
            ]
        )
        == 0
    )
    assert not (out / "model.pt").exists()
    session = onnx_session(out / "model.onnx")
    assert [i.type for i in session.get_inputs()] == ["tensor(int32)"] * 3
    for batch in squad_batches:
        batch32 = tuple(a.astype(np.int32) for a in batch)
        reference = torch_outputs(qa_model, batch)
        got_onnx = onnx_outputs(session, batch32)
        assert max_diff(got_onnx, reference) <= TOLERANCE
    with pytest.raises(Exception, match="int64|INVALID_ARGUMENT|type"):
        session.run(None, dict(zip(("input_ids", "token_type_ids", "attention_mask"), squad_batches[0])))


def mrpc_pairs(shared_data, n: int) -> list[tuple[str, str]]:
    with open(shared_data / "glue-mrpc" / "dev.tsv", encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1 : n + 1]
    return [(r[3], r[4]) for r in rows]


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_classification_from_nvidia_checkpoint(export_model, shared_data, uncased_vocab, tmp_path, dtype):
    """An NVIDIA-layout .pt ({"model": ...}, dense_act names, vocabulary padded to 30528) with bert_config.json
    beside it -> classification ONNX + TorchScript, int64 and int32; num_labels is read from the checkpoint."""
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    torch.manual_seed(1)
    model = BertForSequenceClassification(config, num_labels=3).eval()
    folder = tmp_path / "nvidia"
    folder.mkdir()
    torch.save({"model": nvidia_state_dict(model)}, folder / "bert_classifier.pt")
    config.to_json_file(folder / "bert_config.json")
    out = tmp_path / "export"
    assert (
        export_model.main(
            [
                "--checkpoint",
                str(folder / "bert_classifier.pt"),
                "--task",
                "classification",
                "--output_dir",
                str(out),
                "--input_dtype",
                dtype,
                "--max_seq_length",
                "128",
                "--vocab_file",
                str(uncased_vocab),
            ]
        )
        == 0
    )
    info = json.loads((out / "export.json").read_text())
    assert info["num_labels"] == 3 and info["output_names"] == ["logits"]
    assert set(info["parity_max_abs_diff"]) == {"onnx", "torchscript"}  # the exporter's own check ran
    assert all(v <= TOLERANCE for v in info["parity_max_abs_diff"].values())

    tokenizer = BertTokenizer(uncased_vocab)
    batch = encode_pairs(tokenizer, mrpc_pairs(shared_data, 4), 128, np.int64)
    reference = torch_outputs(model, batch)
    feed = tuple(a.astype(np.int32 if dtype == "int32" else np.int64) for a in batch)
    got_onnx = onnx_outputs(onnx_session(out / "model.onnx"), feed)
    assert got_onnx[0].shape == (4, 3)
    assert max_diff(got_onnx, reference) <= TOLERANCE
    assert max_diff(torchscript_outputs(torchscript_module(out / "model.pt"), feed), reference) <= TOLERANCE


def test_refuses_bad_requests(export_model, minilm_dir, tmp_path):
    """Clear one-line errors: a checkpoint without the task head, an old opset, a missing checkpoint."""
    with pytest.raises(SystemExit, match="has no qa head.*--allow_fresh_head"):
        export_model.main(["--checkpoint", str(minilm_dir), "--output_dir", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match="--opset 13"):
        export_model.main(["--checkpoint", str(minilm_dir), "--output_dir", str(tmp_path / "b"), "--opset", "13"])
    with pytest.raises(SystemExit, match="--checkpoint .*not found"):
        export_model.main(["--checkpoint", str(tmp_path / "missing.pt"), "--output_dir", str(tmp_path / "c")])
    with pytest.raises(SystemExit, match="--max_seq_length 1000"):
        export_model.main(
            [
                "--checkpoint",
                str(minilm_dir),
                "--output_dir",
                str(tmp_path / "d"),
                "--allow_fresh_head",
                "--max_seq_length",
                "1000",
            ]
        )
    assert not (tmp_path / "a" / "export.json").exists()
