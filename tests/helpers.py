"""Builders shared by the test files (imported as `from helpers import ...`; no test file imports another): real
sentences and padded batches for model parity, tiny NVIDIA-layout shards written directly with h5py, tiny configs,
run_pretraining argument lists and logs, the environment of the processes the tests start, and stand-ins for faults
(a disk that fills mid-write, a bench study that must not train).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from bert_recipe.pretraining.data_stream import PretrainingData, ShardInfo
from bert_recipe.training.dist_env import DistEnv
from modeling import BertConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------------------------
# Model parity

SENTENCES = [
    "The tower is 324 metres tall, about the same height as an 81-storey building.",
    "Hello world.",
    "Robert Boulter is an English film, television and theatre actor who had a guest-starring role in 2000.",
    "Its base is square, measuring 125 metres on each side.",
]


def padded_batch(tokenizer, sentences: list[str], pair: bool = False, max_len: int | None = None):
    """[CLS] A [SEP] (B [SEP]) with zero padding: input_ids, token_type_ids, attention_mask, each [B, S].
    max_len cuts every row to at most that many tokens (its last one stays [SEP])."""
    rows, types = [], []
    for i, s in enumerate(sentences):
        a = tokenizer.encode(s)
        ids, tt = [tokenizer.vocab["[CLS]"], *a, tokenizer.vocab["[SEP]"]], [0] * (len(a) + 2)
        if pair:
            b = tokenizer.encode(sentences[(i + 1) % len(sentences)])
            ids += [*b, tokenizer.vocab["[SEP]"]]
            tt += [1] * (len(b) + 1)
        if max_len is not None and len(ids) > max_len:
            ids, tt = ids[: max_len - 1] + [tokenizer.vocab["[SEP]"]], tt[:max_len]
        rows.append(ids)
        types.append(tt)
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    token_type_ids = torch.tensor([t + [0] * (width - len(t)) for t in types])
    return input_ids, token_type_ids, (input_ids != 0).long()


# --------------------------------------------------------------------------------------------------------------
# Pre-training: tiny NVIDIA-layout shards, tiny configs, run_pretraining argument lists

SEQ, PRED, VOCAB = 32, 5, 100
CLS, SEP, MASK = 2, 3, 4


def make_shards(
    folder: Path,
    n_shards: int = 3,
    n: int = 40,
    seq: int = SEQ,
    pred: int = PRED,
    vocab: int = VOCAB,
    seed: int = 0,
    tag: bool = False,
    unmasked: bool = False,
    short_rows: int = 0,
) -> Path:
    """Shards with random tokens: [CLS] ... [SEP] then padding, `pred` masked positions per row (sorted, never 0;
    the last `short_rows` rows use only 2 of them, the rest of the slots 0 as in real shards). tag=True writes
    the sample's identity (shard * n + row) at position 1, which is never masked. unmasked=True writes
    create_pretraining_data's --no_static_masking layout (zero masked_lm_* and attrs masking=dynamic)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s in range(n_shards):
        lengths = rng.integers(seq // 2, seq + 1, n)
        mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int8)
        ids = rng.integers(5, vocab, (n, seq)).astype(np.int32)
        ids[:, 0] = CLS
        ids[np.arange(n), lengths - 1] = SEP
        ids[mask == 0] = 0
        if tag:
            ids[:, 1] = s * n + np.arange(n)
        segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int8)
        positions = np.stack(
            [np.sort(rng.choice(np.arange(2, length - 1), pred, replace=False)) for length in lengths]
        ).astype(np.int32)
        if short_rows:
            positions[-short_rows:, 2:] = 0
        originals = np.where(positions > 0, np.take_along_axis(ids, positions, 1), 0).astype(np.int32)
        if unmasked:
            positions[:] = 0
            originals[:] = 0
        else:
            rows, slots = np.nonzero(positions)
            ids[rows, positions[rows, slots]] = MASK
        with h5py.File(folder / f"shard_{s:02d}.hdf5", "w") as f:
            f["input_ids"], f["input_mask"], f["segment_ids"] = ids, mask, segments
            f["masked_lm_positions"], f["masked_lm_ids"] = positions, originals
            f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int8)
            if unmasked:
                f.attrs["masking"] = "dynamic"
    return folder


def write_config(path: Path, dropout: float = 0.1, vocab: int = VOCAB, hidden: int = 32) -> Path:

    BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    ).to_json_file(path)
    return path


def bert_config(**fields):
    """A small modeling.BertConfig for tests: 2 layers, 4 heads, no dropout (exact comparisons), then `fields`."""
    return BertConfig(
        **{
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            **fields,
        }
    )


def args_for(data: Path, config: Path, out: Path, *extra: str, seq: int = SEQ, pred: int = PRED) -> list[str]:
    return [
        "--input_dir",
        str(data),
        "--config_file",
        str(config),
        "--output_dir",
        str(out),
        "--do_train",
        "--max_seq_length",
        str(seq),
        "--max_predictions_per_seq",
        str(pred),
        "--train_batch_size",
        "8",
        "--learning_rate",
        "1e-2",
        "--warmup_proportion",
        "0.2",
        "--num_workers",
        "0",
        "--disable_progress_bar",
        "--json-summary",
        str(out / "log.json"),
        *extra,
    ]


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def shard_stream(folder: Path, micro: int, rank: int = 0, world: int = 1, state: dict | None = None, **options):
    """The pretraining_data stream over `folder`'s shards of 40 rows each, of rank `rank` of `world`, continued from
    `state` (a state_dict()) when given; `options` go to PretrainingData (seed: 7 unless given)."""
    unmasked = options.get("masker") is not None  # dynamic masking reads shards written unmasked
    shards = [ShardInfo(p, 40, unmasked) for p in sorted(folder.glob("*.hdf5"))]
    data = PretrainingData(shards, options.pop("seed", 7), micro, DistEnv(rank, world), **options)
    if state is not None:
        data.load_state_dict(state)
    return data


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


def help_of(main) -> str:
    """An entry script's `--help` text, from its main(argv) in this process: what the script prints when started on
    its own (only the line wrapping can follow this terminal's width), without a second interpreter importing torch
    (about 2 s). Its __main__ blocks run as files in tests/test_launchers.py::test_entry_scripts_run_as_files."""
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    return text.getvalue()


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch's intra-op threads set to `n` for the block (None: unchanged), then put back."""
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------------------------
# Faults and tripwires


def disk_full_for_large_writes(monkeypatch, limit: int = 4096) -> None:
    """Binary files opened for writing through os.fdopen (atomic_io.atomic_open's temporary files) fail every write
    of more than `limit` bytes with ENOSPC, while small buffered writes and the final flush succeed: what a real
    full tmpfs did to torch.save (measured: its large record writes fail, close() succeeds, and torch.save raises
    'RuntimeError: [enforce fail at inline_container.cc] unexpected pos' chained to the OSError)."""
    import errno
    import io

    class RawFull(io.FileIO):
        def write(self, b):
            if len(b) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(b)

    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        if "w" in mode and "b" in mode:
            return io.BufferedWriter(RawFull(fd, "w"))
        return real_fdopen(fd, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)


def no_training(monkeypatch, launchers, seeds) -> None:
    """Any attempt to train in the bench studies fails the test: the `launchers` modules' subprocesses (the
    studies that start run_cpu_demo.sh and its kin) and the `seeds` module's run_seeds (bench.stability). For
    checking that a second call reuses every finished run; the tests of the studies pass the modules (this file
    imports no study)."""
    import types

    def refuse(*a, **k):
        raise AssertionError(f"nothing should run here: {a} {k}")

    for module in launchers:
        monkeypatch.setattr(module, "subprocess", types.SimpleNamespace(run=refuse, Popen=refuse))
    monkeypatch.setattr(seeds, "run_seeds", refuse)
