"""Sequence packing (create_pretraining_data.py --pack_sequences, the model's block-diagonal attention) and
LDDL-style length binning (run_pretraining.py --length_bins).

The packer against a plain re-implementation of first-fit-decreasing; packed shards made from real WikiText-2
text against the unpacked shard of the same seed (the same instances, every one exactly once); the model on packed
rows against the same sequences unpacked (per-sequence MLM and NSP losses, on the unpadded path and the padded
fallback), attention never crossing sequences and positions restarting in each; run_pretraining.py trains on packed
shards and resumes exactly, and so does a length-binned run. fp32, dropout off where outputs are compared, one
intra-op thread (exact resume compares runs that must use the same thread count).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import args_for, make_shards, max_diff, read_log, shard_stream, weights

import bert_padding
import create_pretraining_data as cpd
import run_pretraining as rp
from bert_recipe.pretraining import data_stream, shard_format, trainer
from modeling import BertConfig, BertForPreTraining, set_execution

pytestmark = pytest.mark.usefixtures("one_thread_for_the_module")

# Sequence length 256: a WikiText-2 pair is at least ~44 tokens (2 sentences), so rows of 3 need more than 128.
SEQ, PRED, K = 256, 20, 3
ROW_PRED = shard_format.packed_predictions(SEQ, PRED, 0.15, K)  # 41 masked slots a packed row


# ---------------------------------------------------------------------------------------------------------------
# Real shards: the same WikiText-2 instances written unpacked and packed


def wikitext_corpus(source: Path, target: Path, limit_chars: int) -> Path:
    """WikiText-2 as create_pretraining_data's input: one sentence a line, each paragraph a document (a blank line
    between them). Paragraphs rather than articles: Google's algorithm draws its short target once per document and
    a document's last pair is short, so 100 KB (6 articles, 200 paragraphs) get a realistic spread of lengths."""
    lines, size = [], 0
    for raw in source.read_text(encoding="utf-8").splitlines():
        text = raw.strip()
        if not text or text.startswith("="):  # headings
            continue
        lines.append("")
        for sentence in text.replace(" . ", " .\n").splitlines():
            lines.append(sentence.strip())
            size += len(sentence)
        if size > limit_chars:
            break
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def make_shard(corpus: Path, vocab: Path, output: Path, *extra: str) -> dict:
    """One create_pretraining_data.py run; returns its summary line."""
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert (
            cpd.main(
                [
                    "--input_file",
                    str(corpus),
                    "--output_file",
                    str(output),
                    "--vocab_file",
                    str(vocab),
                    "--max_seq_length",
                    str(SEQ),
                    "--max_predictions_per_seq",
                    str(PRED),
                    "--dupe_factor",
                    "1",
                    "--random_seed",
                    "3",
                    "--num_workers",
                    "1",
                    "--no_progress",
                    *extra,
                ]
            )
            == 0
        )
    return json.loads(stdout.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wiki(tmp_path_factory, shared_data, uncased_vocab) -> dict:
    """Unpacked and packed (K = 3) shards of the same ~100 KB of WikiText-2, each alone in a folder."""
    root = tmp_path_factory.mktemp("wiki")
    corpus = wikitext_corpus(shared_data / "wikitext-2" / "valid.txt", root / "corpus.txt", 100_000)
    unpacked = make_shard(corpus, uncased_vocab, root / "unpacked" / "wiki.hdf5")
    packed = make_shard(corpus, uncased_vocab, root / "packed" / "wiki.hdf5", "--pack_sequences", str(K))
    with h5py.File(root / "unpacked" / "wiki.hdf5") as f:
        arrays = {key: f[key][()] for key in shard_format.SHARD_KEYS}
    return {
        "root": root,
        "unpacked": root / "unpacked",
        "packed": root / "packed",
        "arrays": arrays,
        "summary_unpacked": unpacked,
        "summary_packed": packed,
    }


def tiny_config(dropout: float = 0.0) -> BertConfig:
    return BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


def unpack_rows(arrays: dict[str, np.ndarray]) -> list[tuple]:
    """Every sequence of packed rows, cut out by plain Python from next_sentence_positions and input_mask: (token
    ids, token types, masked positions within the sequence, their original ids, NSP label)."""
    out = []
    for r in range(len(arrays["input_ids"])):
        starts = [int(s) for k, s in enumerate(arrays["next_sentence_positions"][r]) if k == 0 or s > 0]
        ends = starts[1:] + [int(arrays["input_mask"][r].sum())]
        positions, ids = arrays["masked_lm_positions"][r], arrays["masked_lm_ids"][r]
        for k, (a, b) in enumerate(zip(starts, ends)):
            inside = (positions >= max(a, 1)) & (positions < b)
            out.append(
                (
                    tuple(arrays["input_ids"][r, a:b].tolist()),
                    tuple(arrays["segment_ids"][r, a:b].tolist()),
                    tuple((positions[inside] - a).tolist()),
                    tuple(ids[inside].tolist()),
                    int(arrays["next_sentence_labels"][r, k]),
                )
            )
    return out


def plain_rows(arrays: dict[str, np.ndarray]) -> list[tuple]:
    """The same tuple for every row of an unpacked shard."""
    out = []
    for r in range(len(arrays["input_ids"])):
        n = int(arrays["input_mask"][r].sum())
        positions, ids = arrays["masked_lm_positions"][r], arrays["masked_lm_ids"][r]
        used = positions > 0
        out.append(
            (
                tuple(arrays["input_ids"][r, :n].tolist()),
                tuple(arrays["segment_ids"][r, :n].tolist()),
                tuple(positions[used].tolist()),
                tuple(ids[used].tolist()),
                int(arrays["next_sentence_labels"][r]),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# (a) The packer


def reference_ffd(lengths: list[int], capacity: int, max_per_row: int) -> list[list[int]]:
    """First-fit-decreasing written out: rows as lists of sequence indices."""
    rows: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for row in rows:
            if len(row) < max_per_row and sum(lengths[j] for j in row) + lengths[i] <= capacity:
                row.append(i)
                break
        else:
            rows.append([i])
    return rows


def test_first_fit_decreasing_on_a_worked_example():
    lengths = np.array([3, 7, 2, 5, 4, 1, 3])
    row, slot, start = shard_format.first_fit_decreasing(lengths, capacity=10, max_per_row=2)
    # order 7(i1), 5(i3), 4(i4), 3(i0), 3(i6), 2(i2), 1(i5):
    # 7 -> row 0 [7]; 5 -> row 1 [5]; 4 -> row 1 [5,4] full (K=2); 3 -> row 0 [7,3] full; 3 -> row 2 [3];
    # 2 -> row 2 [3,2] full; 1 -> row 3 [1]
    assert row.tolist() == [0, 0, 2, 1, 1, 3, 2]
    assert slot.tolist() == [1, 0, 1, 0, 1, 0, 0]
    assert start.tolist() == [7, 0, 3, 0, 5, 0, 0]
    with pytest.raises(ValueError, match="lengths"):
        shard_format.first_fit_decreasing(np.array([3, 11]), capacity=10, max_per_row=2)


@pytest.mark.parametrize("max_per_row", [1, 2, 3, 5])
def test_first_fit_decreasing_keeps_every_sequence_once_within_the_limits(max_per_row):
    rng = np.random.default_rng(max_per_row)
    lengths = np.concatenate([rng.integers(1, 129, 300), rng.integers(1, 30, 300)])  # long and short ones
    row, slot, start = shard_format.first_fit_decreasing(lengths, 128, max_per_row)
    expected = reference_ffd(lengths.tolist(), 128, max_per_row)
    got = [[] for _ in range(row.max() + 1)]
    for i in np.lexsort((slot, row)):
        got[row[i]].append(int(i))
    assert got == expected  # the same rows, the same order within each
    assert sorted(i for r in got for i in r) == list(range(len(lengths)))  # each sequence exactly once
    for r in got:
        assert len(r) <= max_per_row and sum(lengths[r]) <= 128
        assert [start[i] for i in r] == np.concatenate([[0], np.cumsum(lengths[r])[:-1]]).tolist()
    if max_per_row > 1:
        assert len(got) < len(lengths)
    print(
        f"\nK={max_per_row}: {len(lengths)} sequences -> {len(got)} rows, fill {lengths.sum() / (128 * len(got)):.2f}"
    )


def test_pack_sequences_keeps_every_instance_of_real_rows(wiki):
    arrays = wiki["arrays"]
    packed = shard_format.pack_sequences(arrays, K, ROW_PRED)
    assert sorted(unpack_rows(packed)) == sorted(plain_rows(arrays))
    assert len(packed["input_ids"]) < len(arrays["input_ids"])
    for name in (
        "input_ids",
        "input_mask",
        "segment_ids",
        "masked_lm_positions",
        "masked_lm_ids",
        "next_sentence_labels",
    ):
        assert packed[name].dtype == arrays[name].dtype, name
    assert packed["next_sentence_positions"].dtype == np.int32
    with pytest.raises(ValueError, match="masked positions"):
        shard_format.pack_sequences(arrays, K, 5)


# ---------------------------------------------------------------------------------------------------------------
# (g) create_pretraining_data.py --pack_sequences, end to end


def test_packed_shard_holds_the_unpacked_shards_instances(wiki):
    with h5py.File(wiki["packed"] / "wiki.hdf5") as f:
        packed = {key: f[key][()] for key in f}
        attrs = dict(f.attrs)
    dtypes = {
        "input_ids": np.int32,
        "input_mask": np.int8,
        "segment_ids": np.int8,
        "masked_lm_positions": np.int32,
        "masked_lm_ids": np.int32,
        "next_sentence_labels": np.int8,
        "next_sentence_positions": np.int32,
    }
    assert {k: v.dtype for k, v in packed.items()} == dtypes
    rows = len(packed["input_ids"])
    assert packed["input_ids"].shape == (rows, SEQ) and packed["masked_lm_positions"].shape == (rows, ROW_PRED)
    assert packed["next_sentence_labels"].shape == packed["next_sentence_positions"].shape == (rows, K)
    n = wiki["summary_unpacked"]["instances"]
    assert attrs["packing"] == "first_fit_decreasing" and attrs["max_sequences_per_row"] == K
    assert attrs["packed_sequences"] == n == wiki["summary_packed"]["instances"]
    assert attrs["max_predictions_per_row"] == ROW_PRED
    assert wiki["summary_packed"]["packed_rows"] == rows < n
    # Rows within max_seq_length: real tokens first, then padding; at most K sequences, each starting with [CLS].
    lengths = packed["input_mask"].sum(1)
    assert np.array_equal(packed["input_mask"], (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int8))
    used = (packed["next_sentence_positions"] > 0) | (np.arange(K) == 0)
    assert np.array_equal(used, packed["next_sentence_labels"] >= 0)
    assert (packed["input_ids"][np.nonzero(used)[0], packed["next_sentence_positions"][used]] == 101).all()
    # The same seed: exactly the unpacked shard's instances, each once (tokens, types, masks, NSP label).
    assert sorted(unpack_rows(packed)) == sorted(plain_rows(wiki["arrays"]))
    fill = [wiki["arrays"]["input_mask"].mean(), packed["input_mask"].mean()]
    print(f"\n{n} instances -> {rows} packed rows; real tokens {fill[0]:.2f} -> {fill[1]:.2f}")


def test_read_samples_takes_the_first_samples_of_the_shards_in_order(wiki):
    """shard_format.read_samples (the evaluation's held-out set, the studies' shards): the first N samples of
    the shards in the order given, compared with h5py's arrays cut by hand; a packed shard brings its
    next_sentence_positions, unless the keys are named."""
    files = [wiki["unpacked"] / "wiki.hdf5", wiki["packed"] / "wiki.hdf5"]
    with h5py.File(files[0]) as a, h5py.File(files[1]) as b:
        first, packed = {k: a[k][()] for k in a}, {k: b[k][()] for k in b}
    n = len(first["input_ids"])
    both = shard_format.read_samples(files[::-1], len(packed["input_ids"]) + 5, ("input_ids", "segment_ids"))
    assert set(both) == {"input_ids", "segment_ids"}
    for key in both:
        np.testing.assert_array_equal(both[key], np.concatenate([packed[key], first[key][:5]]))
    some = shard_format.read_samples(files[1:], 3)
    assert set(some) == set(packed) and shard_format.PACKED_KEY in some
    for key in some:
        np.testing.assert_array_equal(some[key], packed[key][:3])
    every = shard_format.read_samples(files[:1])
    assert set(every) == set(shard_format.SHARD_KEYS) and len(every["input_ids"]) == n


def test_pack_sequences_flag_is_documented_and_checked(wiki, uncased_vocab, capsys):
    with pytest.raises(SystemExit):
        cpd.main(["--help"])
    help_text = capsys.readouterr().out
    assert "--pack_sequences" in help_text and "next_sentence_positions" in help_text
    with pytest.raises(SystemExit, match="--pack_sequences 1 must be 0"):
        cpd.main(
            [
                "--input_file",
                str(wiki["root"] / "corpus.txt"),
                "--output_file",
                str(wiki["root"] / "x.hdf5"),
                "--vocab_file",
                str(uncased_vocab),
                "--pack_sequences",
                "1",
            ]
        )


# ---------------------------------------------------------------------------------------------------------------
# (b)-(d) The model on packed rows


@pytest.fixture(scope="module")
def packed_batch(wiki) -> dict:
    """36 real instances, unpacked ([36, S]) and packed ([R, S]), with where each sequence went: the 18 shortest
    and the 18 longest of the shard (rows of 3 short ones, long ones alone or in pairs)."""
    by_length = np.argsort(wiki["arrays"]["input_mask"].sum(1), kind="stable")
    chosen = np.sort(np.concatenate([by_length[:18], by_length[-18:]]))
    arrays = {k: v[chosen] for k, v in wiki["arrays"].items()}
    packed = shard_format.pack_sequences(arrays, K, ROW_PRED)
    row, slot, start = shard_format.first_fit_decreasing(arrays["input_mask"].sum(1), SEQ, K)
    assert (np.bincount(row) == K).any() and (np.bincount(row) == 1).any()  # full rows and rows alone
    return {
        "plain": data_stream.to_model_inputs(arrays, slice(None)),
        "packed": data_stream.to_model_inputs(packed, slice(None)),
        "row": row,
        "slot": slot,
        "start": start,
        "lengths": arrays["input_mask"].sum(1),
    }


def twin_models(unpad: str) -> BertForPreTraining:
    torch.manual_seed(0)
    return set_execution(BertForPreTraining(tiny_config()), unpad=unpad).eval()


def per_position_losses(out, batch, where) -> dict[tuple[int, int], float]:
    """{(sequence, position in it): cross-entropy} over every used masked-LM slot; where(row, position) names the
    sequence and its own position."""
    scores, positions, ids = out.prediction_scores, batch["masked_lm_positions"], batch["masked_lm_ids"]
    losses = F.cross_entropy(scores.flatten(0, 1), ids.reshape(-1), reduction="none").view(positions.shape)
    return {where(r, int(positions[r, q])): float(losses[r, q]) for r, q in (positions > 0).nonzero().tolist()}


@pytest.mark.parametrize("unpad", ["always", "never"])  # the unpadded (varlen) path and the padded fallback
def test_packed_losses_equal_the_same_sequences_unpacked(packed_batch, unpad):
    model = twin_models(unpad)
    plain, packed = packed_batch["plain"], packed_batch["packed"]
    row, slot, start = packed_batch["row"], packed_batch["slot"], packed_batch["start"]
    assert len(packed["input_ids"]) < len(plain["input_ids"]) and (packed["next_sentence_labels"] < 0).any()
    with torch.no_grad():
        a, b = model(**plain), model(**packed)
    for field in ("loss", "mlm_loss", "nsp_loss"):
        assert abs(getattr(a, field).item() - getattr(b, field).item()) <= 1e-5, field
    # Per sequence: every masked position's loss, and the NSP logits read at the sequence's own [CLS].
    where_packed = {}
    for i in range(len(row)):
        for p in range(packed_batch["lengths"][i]):
            where_packed[(int(row[i]), int(start[i]) + p)] = (i, p)
    mine = per_position_losses(b, packed, lambda r, t: where_packed[(r, t)])
    theirs = per_position_losses(a, plain, lambda r, t: (r, t))
    assert mine.keys() == theirs.keys()
    worst = max(abs(mine[k] - theirs[k]) for k in mine)
    assert worst <= 1e-5, worst
    for i in range(len(row)):
        seq_mlm = [v for (s, _), v in mine.items() if s == i]
        assert abs(np.mean(seq_mlm) - np.mean([v for (s, _), v in theirs.items() if s == i])) <= 1e-5
    nsp_packed = b.seq_relationship_score[torch.from_numpy(row), torch.from_numpy(slot)]  # [n, 2]
    torch.testing.assert_close(nsp_packed, a.seq_relationship_score, atol=1e-5, rtol=0)
    assert b.seq_relationship_score.shape == (len(packed["input_ids"]), K, 2)
    print(
        f"\nunpad={unpad}: {len(row)} sequences in {len(packed['input_ids'])} rows; |loss diff| "
        f"{abs(a.loss.item() - b.loss.item()):.1e}, max |per-position MLM diff| {worst:.1e}"
    )


@pytest.mark.parametrize("unpad", ["always", "never"])
def test_no_attention_across_packed_sequences(packed_batch, unpad):
    """Change every token but [CLS] of the second sequence of a full row: its row-neighbours' outputs (every token,
    and their pooled [CLS]) do not move; its own do."""
    model = twin_models(unpad)
    packed = packed_batch["packed"]
    r = int((packed["next_sentence_labels"] >= 0).sum(1).argmax())  # a row with K sequences
    starts = packed["next_sentence_positions"][r].tolist()
    end = int(packed["attention_mask"][r].sum())
    assert len(starts) == K and 0 < starts[1] < starts[2] < end
    changed = {k: v.clone() for k, v in packed.items()}
    changed["input_ids"][r, starts[1] + 1 : starts[2]] = torch.randint(1000, 2000, (starts[2] - starts[1] - 1,))

    def encode(batch):
        with torch.no_grad():
            return model.bert(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                padding_positions_read=False,
                sequence_starts=batch["next_sentence_positions"],
            )

    before, after = encode(packed), encode(changed)
    neighbours = torch.zeros(packed["input_ids"].shape[1], dtype=torch.bool)
    neighbours[: starts[1]] = neighbours[starts[2] : end] = True
    still = (after.sequence_output[r, neighbours] - before.sequence_output[r, neighbours]).abs().max().item()
    moved = (after.sequence_output[r, starts[1] : starts[2]] - before.sequence_output[r, starts[1] : starts[2]]).abs()
    assert still <= 1e-6, still
    assert moved.max().item() > 1e-2
    torch.testing.assert_close(after.pooled_output[r, [0, 2]], before.pooled_output[r, [0, 2]], atol=1e-6, rtol=0)
    assert (after.pooled_output[r, 1] - before.pooled_output[r, 1]).abs().max().item() > 1e-3
    others = torch.arange(len(packed["input_ids"])) != r
    torch.testing.assert_close(after.sequence_output[others], before.sequence_output[others], atol=0, rtol=0)
    print(f"\nunpad={unpad}: neighbours moved {still:.1e}, the changed sequence {moved.max().item():.2f}")


@pytest.mark.parametrize("unpad", ["always", "never"])
def test_positions_restart_in_every_packed_sequence(packed_batch, unpad):
    """The last sequence of a full row (starting far from column 0) gives the outputs it gives alone."""
    model = twin_models(unpad)
    packed = packed_batch["packed"]
    r = int((packed["next_sentence_labels"] >= 0).sum(1).argmax())
    a, b = packed["next_sentence_positions"][r, K - 1].item(), int(packed["attention_mask"][r].sum())
    layout = bert_padding.packed_layout(packed["attention_mask"], packed["next_sentence_positions"])
    assert layout.position_ids[r, a:b].tolist() == list(range(b - a)) and layout.position_ids[r, b:].eq(0).all()
    alone = {k: packed[k][r : r + 1, a:b] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        row_out = model.bert(
            packed["input_ids"],
            packed["token_type_ids"],
            packed["attention_mask"],
            padding_positions_read=False,
            sequence_starts=packed["next_sentence_positions"],
        )
        alone_out = model.bert(**alone, padding_positions_read=False)
    torch.testing.assert_close(row_out.sequence_output[r, a:b], alone_out.sequence_output[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(row_out.pooled_output[r, K - 1], alone_out.pooled_output[0], atol=1e-5, rtol=0)


def test_packed_layout_of_a_full_row_and_unused_slots():
    """A row without padding still takes the packed path (its block structure), and unused slots are ignored."""
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    starts = torch.tensor([[0, 2, 5], [0, 0, 0]])  # row 0: 3 sequences, no padding; row 1: one, slots 1-2 unused
    layout = bert_padding.packed_layout(mask, starts)
    assert layout.sequence_index.tolist() == [[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, -1, -1]]
    assert layout.position_ids.tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 0]]
    assert layout.lengths.tolist() == [[2, 3, 1], [4, 0, 0]]
    assert layout.block_mask.shape == (2, 1, 6, 6) and not layout.block_mask[0, 0, 1, 2]
    info = bert_padding.unpad_info(mask, layout)
    assert info.cu_seqlens.tolist() == [0, 2, 5, 6, 10] and info.max_seqlen == 4
    # What the host needs (the trainer's description and FLOP count) comes without the [B, 1, S, S] mask.
    bare = bert_padding.packed_layout(mask, starts, block_mask=False)
    assert bare.block_mask is None and all(
        torch.equal(getattr(bare, f), getattr(layout, f)) for f in ("sequence_index", "position_ids", "lengths")
    )
    host = bert_padding.host_unpad_info(mask, starts)
    assert host.key_mask is None and host.cu_seqlens.tolist() == [0, 2, 5, 6, 10] and host.max_seqlen == 4
    assert host.indices.tolist() == info.indices.tolist()
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).eval()
    ids = torch.randint(1000, 2000, (2, 6)) * mask
    labels = torch.tensor([[0, 1, 1], [1, -1, -1]])
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "masked_lm_positions": torch.tensor([[1, 3], [2, 0]]),
        "masked_lm_ids": torch.tensor([[7, 8], [9, 0]]),
        "next_sentence_labels": labels,
        "next_sentence_positions": starts,
    }
    with torch.no_grad():
        auto = model(**batch)
        set_execution(model, unpad="never")
        padded = model(**batch)
    torch.testing.assert_close(auto.loss, padded.loss, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="next_sentence_labels of the shape"):
        model(**{**batch, "next_sentence_labels": torch.tensor([0, 1])})


def test_packed_flops_count_each_sequence(packed_batch):
    """MFU's FLOPs: a packed micro-batch costs what its sequences cost unpacked (attention within each one)."""
    config = tiny_config()
    plain = trainer.batch_flops(config, packed_batch["plain"])
    packed = trainer.batch_flops(config, packed_batch["packed"])
    assert math.isclose(plain, packed, rel_tol=1e-12)


def test_throughput_counts_every_packed_sequence_and_only_real_tokens(packed_batch):
    """The FINAL line's real sequences and tokens: a packed micro-batch holds as many as the same sequences unpacked
    (written out: one sequence per unpacked row, tokens = the unpacked lengths), not its row count."""
    plain, packed, lengths = packed_batch["plain"], packed_batch["packed"], packed_batch["lengths"]
    expected = (len(lengths), int(lengths.sum()))
    assert trainer.real_counts(plain) == expected
    assert trainer.real_counts(packed) == expected and len(packed["input_ids"]) < expected[0]


def test_packed_training_step_traces_into_one_graph(packed_batch):
    """The packed step under torch.compile(fullgraph=True): Dynamo traces forward and backward of packed rows with
    the fixed-slot head into one graph (no graph break, no host sync: packed_layout and the block-diagonal mask
    have static shapes), and the loss and every gradient equal eager mode's unpadded (varlen) step. The backend is
    AOT autograd without inductor's code generation: what is checked is the trace, not inductor's kernels (those
    are checked once, in tests/test_padding.py), and it takes seconds instead of minutes on 2 cores."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).train()  # dropout 0: the same numbers in both modes
    packed = packed_batch["packed"]
    rows = (packed["next_sentence_labels"] >= 0).sum(1).argsort(descending=True, stable=True)[[0, 1, -2, -1]]
    batch = {k: v[rows] for k, v in packed.items()}  # two rows of K sequences, two long ones alone
    assert (batch["next_sentence_labels"] >= 0).sum(1).tolist()[0] == K and (batch["attention_mask"] == 0).any()

    def loss_and_grads(m):
        model.zero_grad(set_to_none=True)
        out = m(**batch)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager_loss, eager_grads = loss_and_grads(model)  # auto, eager: the unpadded path
    torch._dynamo.reset()
    compiled_loss, compiled_grads = loss_and_grads(torch.compile(model, fullgraph=True, backend="aot_eager"))
    torch._dynamo.reset()
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=0)
    assert eager_grads.keys() == compiled_grads.keys()
    worst = max((eager_grads[k] - compiled_grads[k]).abs().max().item() for k in eager_grads)
    assert worst <= 1e-5, worst


# ---------------------------------------------------------------------------------------------------------------
# (e) run_pretraining.py on packed shards


def config_file(folder: Path, dropout: float = 0.1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tiny_config(dropout=dropout).to_json_file(folder / "bert_config.json")
    return folder / "bert_config.json"


def test_run_pretraining_learns_on_packed_shards(wiki, tmp_path):
    out = tmp_path / "out"
    config = config_file(tmp_path, dropout=0.0)
    assert (
        rp.main(
            args_for(
                wiki["packed"],
                config,
                out,
                "--max_steps",
                "40",
                "--log_freq",
                "10",
                "--learning_rate",
                "5e-2",
                "--warmup_proportion",
                "0.1",
                "--skip_checkpoint",
                "--eval_dir",
                str(wiki["packed"]),
                "--max_eval_samples",
                "32",
                seq=SEQ,
                pred=PRED,
            )
        )
        == 0
    )
    log = read_log(out / "log.json")
    mlm = [r["data"]["mlm_loss"] for r in log if isinstance(r["step"], int) and "mlm_loss" in r["data"]]
    nsp = [r["data"]["nsp_loss"] for r in log if isinstance(r["step"], int) and "nsp_loss" in r["data"]]
    evals = [r["data"] for r in log if "eval_mlm_accuracy" in r["data"]]
    print(f"\npacked: MLM loss {mlm[0]:.3f} -> {mlm[-1]:.3f}, NSP {nsp[0]:.3f} -> {nsp[-1]:.3f}, eval {evals}")
    assert mlm[-1] < mlm[0] - 1.0 and all(math.isfinite(x) for x in nsp)
    assert evals and evals[-1]["eval_masked_positions"] > 32 * 20  # ~36 masked tokens a packed row
    final = next(r["data"] for r in log if r["step"] == "FINAL")
    rows, real = final["training_sequences_per_second"], final["training_real_sequences_per_second"]
    print(
        f"throughput: {rows:.1f} rows/s, {real:.1f} sequences/s, {final['training_real_tokens_per_second']:.0f} "
        "tokens/s"
    )
    assert real > 1.2 * rows and final["training_real_tokens_per_second"] > real  # rows hold 1.5-2 sequences


def six_steps_and_the_first_three(shards: Path, config: Path, tmp_path: Path, common: list[str]) -> tuple[Path, Path]:
    """A 6-step reference run, and a second run stopped after 3 steps (--steps_this_run) for a test to resume."""
    reference, part = tmp_path / "reference", tmp_path / "part"
    assert rp.main(args_for(shards, config, reference, *common, seq=SEQ, pred=PRED)) == 0
    assert rp.main(args_for(shards, config, part, *common, "--steps_this_run", "3", seq=SEQ, pred=PRED)) == 0
    return reference, part


def test_packed_run_resumes_exactly(wiki, tmp_path):
    """6 steps in one go against 3 + 3 with a resume (dropout on): the same weights and data position."""
    config = config_file(tmp_path)
    common = ["--max_steps", "6", "--gradient_accumulation_steps", "2", "--seed", "5"]
    reference, part = six_steps_and_the_first_three(wiki["packed"], config, tmp_path, common)
    assert rp.main(args_for(wiki["packed"], config, part, *common, "--resume_from_checkpoint", seq=SEQ, pred=PRED)) == 0
    diff = max_diff(weights(part / "ckpt_6.pt"), weights(reference / "ckpt_6.pt"))
    print(f"\npacked resume: max |w_resumed - w_uninterrupted| = {diff}")
    assert diff == 0.0
    a, b = (torch.load(p / "ckpt_6.pt", weights_only=True) for p in (part, reference))
    assert a["data"] == b["data"]


def test_packed_and_unpacked_shards_do_not_mix_and_slots_are_checked(wiki, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("packed", "unpacked"):
        (mixed / f"{name}.hdf5").symlink_to(wiki[name] / "wiki.hdf5")
    config = config_file(tmp_path)
    with pytest.raises(SystemExit, match="not packed alike"):
        rp.main(args_for(mixed, config, tmp_path / "out", "--max_steps", "1", seq=SEQ, pred=PRED))
    # 41 slots a packed row fit K x 20; with --max_predictions_per_seq 13 (39 < 41) they do not
    with pytest.raises(SystemExit, match="41 masked positions per row of up to 3 sequences"):
        rp.main(args_for(wiki["packed"], config, tmp_path / "out", "--max_steps", "1", seq=SEQ, pred=13))


def test_dynamic_masking_of_packed_rows(wiki, uncased_vocab):
    """--dynamic_masking on packed shards masks each row as a whole, in the packed row's slots: round(p L) of its L
    real tokens, never a [CLS] or [SEP] of any of its sequences, and a resumed stream draws the same masks."""
    masker = data_stream.Masker.from_vocab(str(uncased_vocab), 0.15, ROW_PRED)
    (info,) = data_stream.inspect_shards(
        data_stream.list_shards(str(wiki["packed"]), "--input_dir"),
        data_stream.ShardSpec(SEQ, PRED, True),
        "--input_dir",
    )
    assert (info.packed, info.width) == (K, ROW_PRED)
    data = data_stream.PretrainingData([info], seed=3, micro_batch=8, masker=masker)
    batches = take(data, 3)
    for b in batches:
        positions, ids = b["masked_lm_positions"], b["input_ids"]
        assert positions.shape == (8, ROW_PRED) and "next_sentence_positions" in b
        used = positions > 0
        expected = np.minimum(ROW_PRED, np.rint(b["attention_mask"].sum(1).numpy() * 0.15))
        assert used.sum(1).tolist() == expected.astype(int).tolist()
        rows = torch.arange(8)[:, None].expand_as(positions)[used]
        assert (b["attention_mask"][rows, positions[used]] == 1).all()
        starts = b["next_sentence_positions"]
        assert not (positions[:, :, None] == starts[:, None, :]).logical_and(used[:, :, None]).any()  # no [CLS]
        original = ids.clone()
        original[rows, positions[used]] = b["masked_lm_ids"][used]
        assert (original[rows, positions[used]] != 102).all()  # no [SEP]
    resumed = data_stream.PretrainingData([info], seed=3, micro_batch=8, masker=masker)
    resumed.load_state_dict({**data.state_dict(), "epoch": 0, "shard_index": 0, "sample_offset": 8})
    resumed = take(resumed, 2)
    assert all(torch.equal(x[k], y[k]) for x, y in zip(resumed, batches[1:]) for k in x)


# ---------------------------------------------------------------------------------------------------------------
# (f) Length binning


def stream(
    folder: Path, micro: int, bins: int, rank: int = 0, world: int = 1, seed: int = 7, state=None, workers: int = 0
) -> data_stream.PretrainingData:
    return shard_stream(folder, micro, rank, world, state, seed=seed, num_workers=workers, length_bins=bins)


def take(data: data_stream.PretrainingData, count: int) -> list[dict[str, torch.Tensor]]:
    it = iter(data)
    batches = [next(it) for _ in range(count)]
    data.close()
    return batches


def test_length_bins_group_lengths_see_every_sample_once_and_resume_exactly(tmp_path):
    folder = make_shards(tmp_path / "d", n_shards=3, n=40, tag=True)  # lengths 16..32 of S = 32
    bins, seq = 4, 32
    epoch = take(stream(folder, 8, bins), 15)  # 3 shards x 5 micro-batches
    tags = [int(t) for b in epoch for t in b["input_ids"][:, 1]]
    assert sorted(tags) == list(range(120))  # every sample exactly once in the epoch
    spans, padding = 0, []
    for b in epoch:
        lengths = b["attention_mask"].sum(1).numpy()
        bins_seen = set(((lengths - 1) * bins // seq).tolist())
        spans += len(bins_seen) > 1
        assert b["input_ids"].shape[1] == data_stream.bin_width(lengths.max(), bins, seq)  # cut to the bin
        padding.append(1 - lengths.sum() / lengths.size / b["input_ids"].shape[1])
    unbinned = take(stream(folder, 8, 0), 15)
    padding_unbinned = [1 - b["attention_mask"].float().mean().item() for b in unbinned]
    print(
        f"\nbinned: {spans} of 15 micro-batches mix bins; padding {np.mean(padding):.2f} (unbinned "
        f"{np.mean(padding_unbinned):.2f})"
    )
    assert spans <= 3 * (bins - 1)  # only the bins' leftovers mix
    assert np.mean(padding) < 0.7 * np.mean(padding_unbinned)
    # Deterministic given the seed, another seed another order
    again = take(stream(folder, 8, bins), 15)
    assert all(torch.equal(x[k], y[k]) for x, y in zip(epoch, again) for k in x)
    other = take(stream(folder, 8, bins, seed=8), 15)
    assert [int(t) for b in other for t in b["input_ids"][:, 1]] != tags
    # 2 processes see the same global micro-batches (the same widths), and a resume continues exactly
    ranks = [take(stream(folder, 4, bins, rank=r, world=2), 20) for r in range(2)]
    single = take(stream(folder, 8, bins), 20)
    for k in range(20):
        for key in single[k]:
            assert torch.equal(single[k][key], torch.cat([ranks[0][k][key], ranks[1][k][key]])), (k, key)
    first = stream(folder, 8, bins)
    it = iter(first)
    for _ in range(7):
        next(it)
    resumed = take(stream(folder, 8, bins, state=first.state_dict(), workers=1), 13)
    first.close()
    for k in range(13):
        for key in resumed[k]:
            assert torch.equal(resumed[k][key], single[7 + k][key])


def test_binned_run_resumes_exactly_and_refuses_another_binning(wiki, tmp_path):
    config = config_file(tmp_path)
    common = ["--max_steps", "6", "--seed", "5", "--length_bins", "4"]
    reference, part = six_steps_and_the_first_three(wiki["unpacked"], config, tmp_path, common)
    with pytest.raises(SystemExit, match="--length_bins 4 and a global micro-batch of 8, this run with 2"):
        rp.main(
            args_for(
                wiki["unpacked"],
                config,
                part,
                "--max_steps",
                "6",
                "--length_bins",
                "2",
                "--resume_from_checkpoint",
                seq=SEQ,
                pred=PRED,
            )
        )
    assert (
        rp.main(args_for(wiki["unpacked"], config, part, *common, "--resume_from_checkpoint", seq=SEQ, pred=PRED)) == 0
    )
    diff = max_diff(weights(part / "ckpt_6.pt"), weights(reference / "ckpt_6.pt"))
    print(f"\nbinned resume: max |w_resumed - w_uninterrupted| = {diff}")
    assert diff == 0.0
    data = torch.load(part / "ckpt_6.pt", weights_only=True)["data"]
    assert data["length_bins"] == 4 and data["global_micro_batch"] == 8
    with pytest.raises(SystemExit, match="--length_bins 300 must be in"):
        rp.main(args_for(wiki["unpacked"], config, tmp_path / "x", "--length_bins", "300", seq=SEQ, pred=PRED))
