"""extract_features.py: the features of every chosen layer against transformers' BertModel(output_hidden_states=True)
with the real MiniLM weights and its own tokenizer, line by line without padding; the three output formats hold the
same numbers in the layouts the docstring promises; BertModel's new output_hidden_states leaves the old outputs as
they were; bad input fails in one line."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import extract_features
from bert_recipe.io.checkpoint_io import from_pretrained
from modeling import BertModel

# Real text: MRPC dev pairs (as " ||| " pairs and as single sentences), a line longer than --max_seq_length, a blank
# line, accents and punctuation.
MAX_SEQ = 96


def _lines(shared_data) -> list[str]:
    rows = (shared_data / "glue-mrpc" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1:4]
    pairs = [row.split("\t")[3:5] for row in rows]
    long = " ".join(" ".join(p) for p in pairs)  # about 150 WordPieces: cut to MAX_SEQ
    return [
        f"{pairs[0][0]} ||| {pairs[0][1]}",
        pairs[1][0],
        long,
        "",
        "Zoë's café, naïve — and 3.14 déjà vu!",
        f"{pairs[2][0]} ||| {pairs[2][1]}",
    ]


def _extract(tmp_path, minilm_dir, lines, output, *flags) -> dict:
    """extract_features.py with its default precision (auto) unless `flags` name one."""
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return extract_features.main(
        [
            "--input_file",
            str(tmp_path / "input.txt"),
            "--output_file",
            str(output),
            "--init_checkpoint",
            str(minilm_dir),
            "--max_seq_length",
            str(MAX_SEQ),
            "--disable_progress_bar",
            *flags,
        ]
    )


@pytest.fixture(scope="module")
def hf_model(minilm_dir):
    from transformers import BertModel, BertTokenizer

    model = BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    return model, BertTokenizer.from_pretrained(str(minilm_dir))


def test_features_match_transformers(tmp_path, minilm_dir, shared_data, hf_model, cpu_bf16):
    """Every line's tokens are transformers' tokens and every chosen layer's values its hidden states
    (Google's indexing: -1 = the last layer's output = hidden_states[-1], 0 = the first layer's = hidden_states[1]),
    with the default flags, on a CPU that decides for bf16 and on one that does not (cpu_bf16): a command that
    only reads a model computes in fp32 unless told otherwise, so the same command gives the same features."""
    model, tokenizer = hf_model
    lines = _lines(shared_data)
    layers = [-1, -2, -3, -4, 0, 5]
    out = tmp_path / "features.jsonl"
    summary = _extract(
        tmp_path,
        minilm_dir,
        lines,
        out,
        "--layers",
        ",".join(map(str, layers)),
        "--decimals",
        "-1",
        "--batch_size",
        "4",
    )  # two batches of different padded lengths
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["linex_index"] for r in records] == list(range(len(lines)))
    worst = 0.0
    for line, record in zip(lines, records):
        a, _, b = line.partition(" ||| ")
        # Pairs fit (transformers' Rust longest-first splits an odd cut differently from Google's rule, which
        # tests/test_glue.py covers); the long single line is cut to MAX_SEQ.
        enc = tokenizer(a, b or None, truncation=not b, max_length=MAX_SEQ, return_tensors="pt")
        assert enc["input_ids"].shape[1] <= MAX_SEQ
        tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
        assert [f["token"] for f in record["features"]] == tokens, line
        with torch.no_grad():
            hidden = model(**enc, output_hidden_states=True).hidden_states  # L + 1 tensors [1, T, H]
        for f_index, feature in enumerate(record["features"]):
            assert [layer["index"] for layer in feature["layers"]] == layers
            for layer in feature["layers"]:
                ref = hidden[layer["index"] + (len(hidden) if layer["index"] < 0 else 1)][0, f_index]
                diff = (torch.tensor(layer["values"]) - ref).abs().max().item()
                worst = max(worst, diff)
    print(f"max abs diff vs transformers over {summary['tokens']} tokens x {len(layers)} layers: {worst:.2e}")
    assert worst <= 1e-5 and summary["precision"] == "fp32"
    assert len(records[2]["features"]) == MAX_SEQ  # the long line was cut
    assert [f["token"] for f in records[3]["features"]] == ["[CLS]", "[SEP]"]  # the blank line
    assert summary["lines"] == len(lines) and summary["tokens"] == sum(len(r["features"]) for r in records)


def test_bf16_runs_only_when_named(tmp_path, minilm_dir, shared_data, cpu_bf16):
    lines = _lines(shared_data)[:2]
    default = _extract(tmp_path, minilm_dir, lines, tmp_path / "fp32.npz")
    named = _extract(tmp_path, minilm_dir, lines, tmp_path / "bf16.npz", "--bf16")
    assert (default["precision"], named["precision"]) == ("fp32", "bf16")
    diff = np.abs(np.load(tmp_path / "fp32.npz")["features"] - np.load(tmp_path / "bf16.npz")["features"]).max()
    assert 0 < diff < 0.25  # bf16 really ran, and computed the same features to bf16's precision


def test_three_formats_hold_the_same_features(tmp_path, minilm_dir, shared_data):
    """jsonl (Google's keys, rounded to 6 decimals), npz and HDF5 (features [tokens, layers, H], offsets per line,
    token ids, token types, tokens, layers) give the same values; npz loads without pickle."""
    lines = _lines(shared_data)
    paths = {fmt: tmp_path / f"features.{fmt}" for fmt in ("jsonl", "npz", "h5")}
    for path in paths.values():
        _extract(tmp_path, minilm_dir, lines, path, "--batch_size", "3")
    records = [json.loads(line) for line in paths["jsonl"].read_text(encoding="utf-8").splitlines()]
    assert set(records[0]) == {"linex_index", "features"}
    assert set(records[0]["features"][0]) == {"token", "layers"}
    assert set(records[0]["features"][0]["layers"][0]) == {"index", "values"}
    npz = np.load(paths["npz"], allow_pickle=False)
    with h5py.File(paths["h5"], "r") as h5:
        arrays = {name: h5[name][()] for name in h5}
    arrays["tokens"] = np.array([t.decode() if isinstance(t, bytes) else t for t in arrays["tokens"]])
    assert set(npz.files) == set(arrays) == {"features", "offsets", "token_ids", "token_type_ids", "tokens", "layers"}
    for name in npz.files:
        np.testing.assert_array_equal(npz[name], arrays[name], err_msg=name)
    assert npz["layers"].tolist() == [-1, -2, -3, -4]
    offsets = npz["offsets"]
    assert offsets[0] == 0 and offsets[-1] == len(npz["features"]) == len(npz["tokens"]) and len(offsets) == 7
    for i, record in enumerate(records):
        rows = slice(offsets[i], offsets[i + 1])
        assert npz["tokens"][rows].tolist() == [f["token"] for f in record["features"]]
        values = np.array([[layer["values"] for layer in f["layers"]] for f in record["features"]])
        np.testing.assert_allclose(values, npz["features"][rows], atol=5.1e-7, rtol=0)  # rounded to 6 decimals
    pair = slice(offsets[0], offsets[1])  # [CLS] A [SEP] B [SEP]: types 0 up to the first [SEP], then 1
    types, tokens = npz["token_type_ids"][pair], npz["tokens"][pair].tolist()
    first_sep = tokens.index("[SEP]")
    assert types[: first_sep + 1].tolist() == [0] * (first_sep + 1) and set(types[first_sep + 1 :]) == {1}


def test_output_hidden_states_keeps_the_old_outputs(minilm_dir):
    """BertModel without the flag returns what it always returned; with it a third item, transformers' hidden_states
    (embeddings first), whose last entry is sequence_output."""
    from transformers import BertModel as HFBert

    ours = from_pretrained(BertModel, minilm_dir, log=None).eval()
    hf = HFBert.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    ids = torch.tensor([[101, 7592, 2088, 1010, 2023, 2003, 14324, 1012, 102], [101, 2009, 102] + [0] * 6])
    mask = (ids != 0).long()
    with torch.no_grad():
        plain = ours(ids, None, mask)
        sequence_output, pooled, hidden = ours(ids, None, mask, output_hidden_states=True)
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(plain) == 2 and torch.equal(plain[0], sequence_output) and torch.equal(plain[1], pooled)
    assert len(hidden) == len(ref) == ours.config.num_hidden_layers + 1 and hidden[-1] is sequence_output
    for ours_h, ref_h in zip(hidden, ref):
        torch.testing.assert_close(ours_h[mask.bool()], ref_h[mask.bool()], atol=1e-5, rtol=1e-5)


def test_bad_input_is_one_line_error(tmp_path, minilm_dir):
    with pytest.raises(SystemExit, match=r"--layers \[6, -7\] out of range for a 6-layer model: use -6..5"):
        _extract(tmp_path, minilm_dir, ["a line"], tmp_path / "f.jsonl", "--layers", "-1,6,-7")
    with pytest.raises(SystemExit, match="cannot tell the format from '.txt'"):
        _extract(tmp_path, minilm_dir, ["a line"], tmp_path / "f.txt")
    with pytest.raises(SystemExit, match="--input_file .*missing.txt not found"):
        extract_features.main(
            [
                "--input_file",
                str(tmp_path / "missing.txt"),
                "--output_file",
                str(tmp_path / "f.npz"),
                "--init_checkpoint",
                str(minilm_dir),
            ]
        )
    with pytest.raises(SystemExit, match="--layers 'last'"):
        _extract(tmp_path, minilm_dir, ["a line"], tmp_path / "f.jsonl", "--layers", "last")
    assert not (tmp_path / "f.jsonl").exists() and not (tmp_path / "f.txt").exists()
    with pytest.raises(SystemExit) as e:
        extract_features.main(["--help"])
    assert e.value.code == 0
