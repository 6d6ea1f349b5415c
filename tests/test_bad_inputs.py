"""The bad-input matrix of issue 17, --debug, and the disk-full faults.

Every entry script and launcher is fed missing, empty, unreadable, binary, malformed, contradictory or hostile input.
Each case asserts: a non-zero exit; stderr's last non-empty line starts with the script's name, names the file or
flag (the case's expected words) and says what to do; no traceback; nothing left behind that looks complete (a
final-named shard, checkpoint, model, prediction, export, or a stray temporary file); and that it stopped BEFORE the
expensive work: for every in-process case the script's training, prediction, export, instance-making or
checkpoint-reading function is replaced by a tripwire that fails the test if reached.

The scripts run in this process (main(argv), SystemExit and stderr captured), the launchers as bash subprocesses.
Fixtures (a 100-token vocabulary, a 2-layer hidden-32 config and checkpoint, shards, corpora, SQuAD, GLUE and SWAG
files, malicious pickles) are built once for the module.

Unreadable files: as a normal user chmod 000 is enough. Root reads any file whatever its mode, so under root the
call runs with the effective user and group of `nobody` (os.seteuid, put back right after), where chmod 000 and a
read-only folder bite as they do for a user; the fixture folder is made traversable for that user. Either way the
case runs: nothing is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import h5py
import numpy as np
import pytest
import torch
from helpers import REPO_ROOT, args_for, disk_full_for_large_writes, make_shards, subprocess_env, write_config

import convert_checkpoint
import create_pretraining_data
import extract_features
import run_glue
import run_pretraining
import run_squad
import run_swag
from bert_recipe.finetuning import recipe
from bert_recipe.io import atomic_io, cli, triton_scripts
from bert_recipe.prep import vocab as create_vocab
from bert_recipe.pretraining import shard_writer, trainer, validation
from data import bertPrep
from modeling import BertConfig, BertForPreTraining

export_model = triton_scripts.load_triton_script("export_model")

NOBODY = 65534
PROGS = {
    "cpd": "create_pretraining_data.py",
    "rp": "run_pretraining.py",
    "squad": "run_squad.py",
    "glue": "run_glue.py",
    "swag": "run_swag.py",
    "extract": "extract_features.py",
    "convert": "convert_checkpoint.py",
    "bertprep": "bertPrep.py",
    "export": "export_model.py",
    "vocab": "create_vocab.py",
}
MAINS = {
    "cpd": create_pretraining_data.main,
    "rp": run_pretraining.main,
    "squad": run_squad.main,
    "glue": run_glue.main,
    "swag": run_swag.main,
    "extract": extract_features.main,
    "convert": convert_checkpoint.main,
    "bertprep": bertPrep.main,
    "export": export_model.main,
    "vocab": create_vocab.main,
}
# The expensive step of each script: reaching it in a bad-input case is a failure (validation comes first).
TRIPWIRES = {
    "cpd": [(shard_writer, "make_units"), (shard_writer, "write_hdf5")],
    "cpd-tokenizing": [(shard_writer, "process_corpus")],
    "rp": [(trainer.Trainer, "fit"), (validation.Validator, "__call__")],
    "squad": [(recipe, "train"), (recipe, "predict"), (run_squad, "build_features")],
    "glue": [(recipe, "train"), (recipe, "predict"), (run_glue, "encode_examples")],
    "swag": [(recipe, "train"), (recipe, "predict"), (run_swag, "encode_examples")],
    "extract": [(extract_features, "extract")],
    "convert": [(convert_checkpoint, "save_hf_directory"), (convert_checkpoint, "atomic_torch_save")],
    "bertprep": [],  # its stages are the work; each case fails on its inputs before a stage writes anything
    "export": [(export_model, "export_onnx"), (export_model, "export_torchscript")],
    "vocab": [(create_vocab, "write_vocab")],
    "vocab-learning": [(create_vocab, "learn_pieces")],
}
# Outputs that look complete, and leftovers of an interrupted write: none may exist after a refused case.
LOOKS_COMPLETE = (
    "*.hdf5",
    "ckpt_*.pt",
    "model.pt",
    "model.onnx",
    "model.safetensors",
    "export.json",
    "results.json",
    "predictions.json",
    "eval_results.json",
    "nbest_predictions.json",
    "*.npz",
    "features.*",
    "converted.pt",
    "*_one_article_per_line.txt",
    "*_training_*.txt",
    "*.tmp",
    "vocab.txt",
    ".*.work.*",
    ".formatting_*",
)
# Words of a message that says what to do (or what the value must be).
ADVICE = (
    "pass",
    "give",
    "use",
    "name",
    "choose",
    "check",
    "remove",
    "move",
    "write",
    "convert",
    "free",
    "lower",
    "restore",
    "run ",
    "set ",
    "must",
    "need",
    "expected",
    "is --",
    "separate",
    "download",
    "re-save",
    "make",
    "not found",
    "rerun",
    "is a folder",
    "is a file",
    "is it a",
    "is this a",
    "divisible",
    "not one of",
    "is not an",
    "see -h",
    "see --help",
    "not allowed with",
    "choose from",
    "required",
)  # the last three: argparse's own


# ---------------------------------------------------------------------------------------------------------------
# Fixtures, built once

VOCAB_TOKENS = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + list("abcdefghijklmnopqrstuvwxyz")
    + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    + list("0123456789")
    + list(".,!?'-")
    + "the an is of and to in it was he she cat dog sat on mat ran fast big red blue quick brown fox "
    "jumps over lazy".split()
)
assert len(VOCAB_TOKENS) == len(set(VOCAB_TOKENS)) == 100

SENTENCES = [
    "the cat sat on the mat .",
    "the dog ran fast .",
    "a big red fox jumps over the lazy dog .",
    "she was in it .",
    "he ran to the blue mat .",
    "the quick brown fox is fast .",
]


class Evil:
    """A pickle that runs os.mkdir(path) when loaded without weights_only: the payload must never run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _tiny_checkpoint(path: Path, hidden: int = 32) -> Path:
    config = BertConfig(
        vocab_size=100,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    torch.save({"model": model.state_dict(), "config": config.to_dict()}, path)
    return path


def _squad(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _glue_dir(root: Path, name: str, train: str | bytes | None, dev: str | None) -> Path:
    folder = root / name
    folder.mkdir()
    for file, text in (("train.tsv", train), ("dev.tsv", dev)):
        if isinstance(text, bytes):
            (folder / file).write_bytes(text)
        elif text is not None:
            (folder / file).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def W():
    """Every fixture file, in a folder any user may traverse (see the module docstring on root)."""
    root = Path(tempfile.mkdtemp(prefix="bad_inputs_"))
    root.chmod(0o755)
    w = SimpleNamespace(root=root, marker=root / "PAYLOAD_RAN")
    w.vocab = root / "vocab.txt"
    w.vocab.write_text("\n".join(VOCAB_TOKENS) + "\n", encoding="utf-8")
    w.vocab_latin1 = root / "vocab_latin1.txt"
    w.vocab_latin1.write_bytes("\n".join(VOCAB_TOKENS + ["caf\xe9", "na\xefve"] * 20).encode("latin-1"))
    w.vocab_small = root / "vocab_small.txt"
    w.vocab_small.write_text("\n".join(VOCAB_TOKENS[:50]) + "\n", encoding="utf-8")
    w.vocab_big = root / "vocab_big.txt"  # 200 tokens for a model of 100
    w.vocab_big.write_text("\n".join(VOCAB_TOKENS + [f"word{i}" for i in range(100)]) + "\n", encoding="utf-8")
    w.vocab_nospecial = root / "vocab_nospecial.txt"
    w.vocab_nospecial.write_text("\n".join(VOCAB_TOKENS[5:]) + "\n", encoding="utf-8")
    w.config = write_config(root / "bert_config.json")
    w.config_other = write_config(root / "bert_config_48.json", hidden=48)
    w.config_notjson = root / "not_json.json"
    w.config_notjson.write_text("vocab_size = 100\nhidden_size = 32\n")
    w.config_list = root / "list.json"
    w.config_list.write_text("[100, 32]")
    w.ckpt = _tiny_checkpoint(root / "ckpt.pt")
    w.ckpt_other = _tiny_checkpoint(root / "ckpt_48.pt", hidden=48)
    w.ckpt_truncated = root / "truncated.pt"
    w.ckpt_truncated.write_bytes(w.ckpt.read_bytes()[:4000])
    w.evil_pt = root / "evil.pt"  # torch.save's zip format with a pickled object in it
    torch.save({"model": {"bert.embeddings.word_embeddings.weight": Evil(str(w.marker))}}, w.evil_pt)
    w.evil_bin = root / "evil.bin"  # a plain pickle stream
    w.evil_bin.write_bytes(pickle.dumps(Evil(str(w.marker))))
    w.evil_hf = root / "evil_hf"
    w.evil_hf.mkdir()
    shutil.copy(w.config, w.evil_hf / "config.json")
    shutil.copy(w.evil_bin, w.evil_hf / "pytorch_model.bin")
    shutil.copy(w.vocab, w.evil_hf / "vocab.txt")
    w.not_a_checkpoint = root / "notes.pt"
    w.not_a_checkpoint.write_text("these are notes, not tensors\n")

    # Corpora (one sentence a line, blank line between documents)
    w.corpus = root / "corpus.txt"
    w.corpus.write_text("\n\n".join("\n".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(4)) + "\n")
    w.empty = root / "empty.txt"
    w.empty.write_text("")
    w.blank = root / "blank.txt"
    w.blank.write_text("\n  \n\n")
    w.one_sentence = root / "one_sentence.txt"
    w.one_sentence.write_text("the cat sat on the mat .\n")
    w.binary = root / "binary.txt"
    w.binary.write_bytes(bytes(range(256)) * 64)
    w.latin1 = root / "latin1.txt"
    w.latin1.write_bytes(("le caf\xe9 \xe9tait tr\xe8s bon . " * 200 + "\n").encode("latin-1"))
    w.text_dir = root / "text_dir"  # a folder without .txt files
    w.text_dir.mkdir()
    (w.text_dir / "notes.md").write_text("not a corpus")
    w.corpus_truncated_gz = root / "corpus.txt.gz"  # gzip cut in half: a download that stopped early
    whole = gzip.compress(w.corpus.read_bytes() * 50)
    w.corpus_truncated_gz.write_bytes(whole[: len(whole) // 2])
    w.a_file = root / "a_file"  # a regular file where a folder is needed
    w.a_file.write_text("I am a file")

    # Shards: one good folder, and one folder per kind of damage
    w.shards = make_shards(root / "shards", n_shards=1, n=16)
    good = w.shards / "shard_00.hdf5"

    def shard_folder(name: str, edit: Callable[[h5py.File], None] | None = None, data: bytes | None = None) -> Path:
        folder = root / f"shards_{name}"
        folder.mkdir()
        if data is not None:
            (folder / "shard_00.hdf5").write_bytes(data)
            return folder
        shutil.copy(good, folder / "shard_00.hdf5")
        with h5py.File(folder / "shard_00.hdf5", "r+") as f:
            edit(f)
        return folder

    def float_ids(f):
        ids = f["input_ids"][()].astype(np.float32)
        del f["input_ids"]
        f["input_ids"] = ids

    def short_mask(f):
        mask = f["input_mask"][()][:-3]
        del f["input_mask"]
        f["input_mask"] = mask

    def flat_ids(f):
        ids = f["input_ids"][()].reshape(-1)
        del f["input_ids"]
        f["input_ids"] = ids

    def zero_rows(f):
        for key in list(f.keys()):
            empty = f[key][()][:0]
            del f[key]
            f[key] = empty

    w.shards_truncated = shard_folder("truncated", data=good.read_bytes()[: good.stat().st_size // 2])
    w.shards_text = shard_folder("text", data=b"input_ids,input_mask\n1,2\n")
    w.shards_missing = shard_folder("missing", lambda f: f.__delitem__("next_sentence_labels"))
    w.shards_float = shard_folder("float", float_ids)
    w.shards_rows = shard_folder("rows", short_mask)
    w.shards_flat = shard_folder("flat", flat_ids)
    w.shards_zero = shard_folder("zero", zero_rows)
    w.shards_seq64 = make_shards(root / "shards_seq64", n_shards=1, n=16, seq=64)
    w.shards_seq128 = make_shards(root / "shards_seq128", n_shards=1, n=16, seq=128)
    w.shards_unmasked = make_shards(root / "shards_unmasked", n_shards=1, n=16, unmasked=True)
    w.shards_empty = root / "shards_empty"
    w.shards_empty.mkdir()

    # SQuAD
    context = "the quick brown fox jumps over the lazy dog ."
    qa = {"id": "q1", "question": "what jumps ?", "answers": [{"text": "brown fox", "answer_start": 10}]}
    w.squad = _squad(
        root / "squad.json",
        {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}]},
    )
    w.squad_malformed = root / "squad_malformed.json"
    w.squad_malformed.write_text('{"data": [ {"paragraphs": [ {"context": "the cat", "qas": [')
    w.squad_list = _squad(root / "squad_list.json", [{"question": "q", "context": "c"}])
    w.squad_no_paragraphs = _squad(root / "squad_noparas.json", {"data": [{"title": "t"}]})
    w.squad_no_answer = _squad(
        root / "squad_noanswer.json",
        {
            "data": [
                {
                    "title": "t",
                    "paragraphs": [{"context": context, "qas": [{"id": "q1", "question": "what ?", "answers": []}]}],
                }
            ]
        },
    )
    w.squad_latin1 = root / "squad_latin1.json"
    w.squad_latin1.write_bytes(json.dumps({"data": []}).replace("[]", '["caf\xe9"]').encode("latin-1"))

    # GLUE (MRPC layout) and SWAG
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    rows = "".join(f"{i % 2}\t{i}\t{i + 100}\t{SENTENCES[i]}\t{SENTENCES[i + 1]}\n" for i in range(4))
    glue = root / "glue"
    glue.mkdir()
    w.glue = _glue_dir(glue, "good", header + rows, header + rows)
    w.glue_columns = _glue_dir(glue, "columns", "label\tsentence\n1\tthe cat\n", header + rows)
    w.glue_label = _glue_dir(glue, "label", header + "7\t1\t2\tthe cat\tthe dog\n", header + rows)
    w.glue_short = _glue_dir(glue, "short", header + "1\t1\tthe cat\n", header + rows)
    w.glue_latin1 = _glue_dir(
        glue, "latin1", (header + "1\t1\t2\tle caf\xe9\tna\xefve\n").encode("latin-1"), header + rows
    )
    w.glue_header_only = _glue_dir(glue, "header_only", header, header + rows)
    w.glue_nodev = _glue_dir(glue, "nodev", header + rows, None)
    w.glue_empty = _glue_dir(glue, "empty", "", header + rows)
    swag_header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
    w.swag = root / "swag"
    w.swag.mkdir()
    (w.swag / "train.csv").write_text(swag_header + "v,0,s,the cat,sat,gold,on,in,of,to,0\n")
    w.swag_label = root / "swag_label"
    w.swag_label.mkdir()
    (w.swag_label / "train.csv").write_text(swag_header + "v,0,s,the cat,sat,gold,on,in,of,to,9\n")
    w.swag_latin1 = root / "swag_latin1"
    w.swag_latin1.mkdir()
    (w.swag_latin1 / "train.csv").write_bytes((swag_header + "v,0,s,le caf\xe9,a,g,b,c,d,e,0\n").encode("latin-1"))

    # extract_features and bertPrep inputs
    w.lines = root / "lines.txt"
    w.lines.write_text("the cat sat on the mat .\nthe dog ran ||| the fox jumps\n")
    w.custom_binary = root / "custom_binary"
    w.custom_binary.mkdir()
    (w.custom_binary / "book.txt").write_text("the cat sat on the mat .\n")
    (w.custom_binary / "image.txt").write_bytes(bytes(range(256)) * 8)
    w.custom_unreadable = root / "custom_unreadable"
    w.custom_unreadable.mkdir()
    (w.custom_unreadable / "book.txt").write_text("the cat sat on the mat .\n")
    yield w
    with contextlib.suppress(OSError):
        shutil.rmtree(root)


# ---------------------------------------------------------------------------------------------------------------
# Unreadable and unwritable files, whoever runs the tests


@contextlib.contextmanager
def as_a_user():
    """Run the block with permission checks that bite: as root, with the effective ids of `nobody`."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def unreadable(path: Path) -> Path:
    path.chmod(0)
    return path


def read_only_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o555)
    return path


def unreadable_in(folder: Path, name: str) -> Path:
    """`folder`, with its file `name` made unreadable."""
    unreadable(folder / name)
    return folder


def place(source: Path, target: Path) -> Path:
    """A copy of `source` at `target` (its folder created)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(source, target))


def copy_to(case_dir: Path, source: Path) -> Path:
    """A copy of a fixture file or folder in the case's own input folder (for cases that change its mode)."""
    target = case_dir / "in" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    return target


# ---------------------------------------------------------------------------------------------------------------
# The cases


@dataclass
class Case:
    id: str
    script: str  # a key of PROGS
    argv: Callable[[SimpleNamespace, Path], list[str]]  # (fixtures, the case's folder) -> command line
    expect: tuple[str, ...]  # words the last stderr line must hold (the file or flag, the kind of problem)
    as_user: bool = False  # run with permission checks that bite (unreadable / read-only cases)
    payload: bool = False  # a malicious pickle: its payload must not have run
    tokenizes: bool = False  # create_pretraining_data: the corpus must be read to find the problem (else not even
    #                          tokenizing may start: flags, vocabulary, outputs and the files' bytes come first);
    #                          create_vocab: the problem shows only once it learns (else learning may not start)


def cpd(w, d, *extra):
    return [
        "--vocab_file",
        str(w.vocab),
        "--num_workers",
        "1",
        "--no_progress",
        "--max_seq_length",
        "32",
        "--max_predictions_per_seq",
        "5",
        "--dupe_factor",
        "1",
        *extra,
    ]


def cpd_in(w, d, path, *extra):
    return ["--input_file", str(path), "--output_file", str(d / "out" / "shard.hdf5"), *cpd(w, d, *extra)]


def rp(w, d, data, *extra, config=None, seq=32):
    return args_for(data, config or w.config, d / "out", "--max_steps", "2", *extra, seq=seq)


def squad(w, d, *extra, ckpt=None):
    return [
        "--init_checkpoint",
        str(ckpt or w.ckpt),
        "--vocab_file",
        str(w.vocab),
        "--output_dir",
        str(d / "out"),
        "--max_seq_length",
        "32",
        "--max_query_length",
        "8",
        "--doc_stride",
        "8",
        "--disable_progress_bar",
        "--skip_cache",
        *extra,
    ]


def glue(w, d, data_dir, *extra, ckpt=None):
    return [
        "--task_name",
        "mrpc",
        "--data_dir",
        str(data_dir),
        "--init_checkpoint",
        str(ckpt or w.ckpt),
        "--vocab_file",
        str(w.vocab),
        "--output_dir",
        str(d / "out"),
        "--max_seq_length",
        "32",
        "--disable_progress_bar",
        *extra,
    ]


def swag(w, d, data_dir, *extra, ckpt=None):
    return [
        "--data_dir",
        str(data_dir),
        "--init_checkpoint",
        str(ckpt or w.ckpt),
        "--vocab_file",
        str(w.vocab),
        "--output_dir",
        str(d / "out"),
        "--max_seq_length",
        "16",
        "--disable_progress_bar",
        *extra,
    ]


def extract(w, d, *extra, input_file=None, output=None, ckpt=None):
    return [
        "--input_file",
        str(input_file or w.lines),
        "--output_file",
        str(output or d / "out" / "features.jsonl"),
        "--init_checkpoint",
        str(ckpt or w.ckpt),
        "--vocab_file",
        str(w.vocab),
        "--max_seq_length",
        "16",
        "--disable_progress_bar",
        *extra,
    ]


def convert(w, d, *extra, source=None, output=None):
    return ["--input", str(source or w.ckpt), "--output", str(output or d / "out" / "hf"), *extra]


def export(w, d, *extra, ckpt=None):
    return [
        "--checkpoint",
        str(ckpt or w.ckpt),
        "--output_dir",
        str(d / "out"),
        "--allow_fresh_head",
        "--max_seq_length",
        "32",
        "--no_verify",
        *extra,
    ]


def vocab(w, d, *inputs, size="300", extra=()):
    return [
        *(a for path in inputs for a in ("--input", str(path))),
        "--output_file",
        str(d / "out" / "vocab.txt"),
        "--vocab_size",
        size,
        "--no_progress",
        *extra,
    ]


def prep(w, d, action, *extra):
    return ["--action", action, "--working_dir", str(d / "out"), "--no_progress", "--n_processes", "1", *extra]


CASES = [
    # ---- create_pretraining_data.py -------------------------------------------------------------------------
    Case("cpd-input-missing", "cpd", lambda w, d: cpd_in(w, d, d / "nowhere.txt"), ("--input_file", "does not exist")),
    Case(
        "cpd-input-empty",
        "cpd",
        lambda w, d: cpd_in(w, d, w.empty),
        ("empty.txt", "no text", "one sentence per line"),
        tokenizes=True,
    ),
    Case("cpd-input-blank-lines", "cpd", lambda w, d: cpd_in(w, d, w.blank), ("blank.txt", "no text"), tokenizes=True),
    Case(
        "cpd-input-one-sentence",
        "cpd",
        lambda w, d: cpd_in(w, d, w.one_sentence),
        ("one_sentence.txt", "single sentence"),
        tokenizes=True,
    ),
    Case("cpd-input-binary", "cpd", lambda w, d: cpd_in(w, d, w.binary), ("--input_file", "binary.txt", "not text")),
    Case("cpd-input-not-utf8", "cpd", lambda w, d: cpd_in(w, d, w.latin1), ("latin1.txt", "not UTF-8", "convert")),
    Case(
        "cpd-input-unreadable",
        "cpd",
        lambda w, d: cpd_in(w, d, unreadable(copy_to(d, w.corpus))),
        ("--input_file", "corpus.txt", "cannot be read"),
        as_user=True,
    ),
    Case(
        "cpd-input-folder-without-text",
        "cpd",
        lambda w, d: cpd_in(w, d, w.text_dir),
        ("--input_file", "text_dir", "without .txt"),
    ),
    Case(
        "cpd-vocab-missing",
        "cpd",
        lambda w, d: [
            "--input_file",
            str(w.corpus),
            "--output_file",
            str(d / "out" / "s.hdf5"),
            *cpd(w, d, "--vocab_file", str(d / "no_vocab.txt")),
        ],
        ("--vocab_file", "does not exist"),
    ),
    Case(
        "cpd-vocab-folder",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--vocab_file", str(w.root)),
        ("--vocab_file", "is a folder"),
    ),
    Case(
        "cpd-vocab-not-utf8",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--vocab_file", str(w.vocab_latin1)),
        ("--vocab_file", "vocab_latin1.txt", "not UTF-8"),
    ),
    Case(
        "cpd-vocab-empty",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--vocab_file", str(w.empty)),
        ("--vocab_file", "empty"),
    ),
    Case(
        "cpd-vocab-no-special-tokens",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--vocab_file", str(w.vocab_nospecial)),
        ("--vocab_file", "[CLS]", "BERT vocab.txt"),
    ),
    Case(
        "cpd-output-is-folder",
        "cpd",
        lambda w, d: ["--input_file", str(w.corpus), "--output_file", str(w.root), *cpd(w, d)],
        ("--output_file", "is a folder"),
    ),
    Case(
        "cpd-output-under-a-file",
        "cpd",
        lambda w, d: ["--input_file", str(w.corpus), "--output_file", str(w.a_file / "s.hdf5"), *cpd(w, d)],
        ("--output_file", "cannot create the folder"),
    ),
    Case(
        "cpd-output-read-only-folder",
        "cpd",
        lambda w, d: [
            "--input_file",
            str(w.corpus),
            "--output_file",
            str(read_only_folder(d / "out") / "s.hdf5"),
            *cpd(w, d),
        ],
        ("--output_file", "cannot write in"),
        as_user=True,
    ),
    Case(
        "cpd-output-dir-is-file",
        "cpd",
        lambda w, d: ["--input_file", str(w.corpus), "--output_dir", str(w.a_file), *cpd(w, d)],
        ("--output_dir", "a_file", "is a file"),
    ),
    Case(
        "cpd-seq-too-short",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--max_seq_length", "4"),
        ("--max_seq_length 4", "at least 5"),
    ),
    Case(
        "cpd-predictions-above-seq",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--max_predictions_per_seq", "40"),
        ("--max_predictions_per_seq 40", "max_seq_length=32"),
    ),
    Case(
        "cpd-masked-lm-prob-zero",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--masked_lm_prob", "0"),
        ("--masked_lm_prob 0",),
    ),
    Case(
        "cpd-short-seq-prob-above-1",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--short_seq_prob", "1.5"),
        ("--short_seq_prob 1.5",),
    ),
    Case(
        "cpd-dupe-factor-zero", "cpd", lambda w, d: cpd_in(w, d, w.corpus, "--dupe_factor", "0"), ("--dupe_factor 0",)
    ),
    Case("cpd-workers-zero", "cpd", lambda w, d: cpd_in(w, d, w.corpus, "--num_workers", "0"), ("--num_workers 0",)),
    Case(
        "cpd-output-file-and-dir",
        "cpd",
        lambda w, d: cpd_in(w, d, w.corpus, "--output_dir", str(d / "out")),
        ("--output_dir", "not allowed with", "--output_file"),
    ),
    # ---- run_pretraining.py ---------------------------------------------------------------------------------
    Case("rp-input-dir-missing", "rp", lambda w, d: rp(w, d, d / "nowhere"), ("--input_dir", "is not a folder")),
    Case("rp-input-dir-is-file", "rp", lambda w, d: rp(w, d, w.a_file), ("--input_dir", "a_file", "not a folder")),
    Case("rp-input-dir-empty", "rp", lambda w, d: rp(w, d, w.shards_empty), ("--input_dir", "no .hdf5 shards")),
    Case(
        "rp-shard-truncated",
        "rp",
        lambda w, d: rp(w, d, w.shards_truncated),
        ("shard_00.hdf5", "cannot be read as HDF5"),
    ),
    Case("rp-shard-not-hdf5", "rp", lambda w, d: rp(w, d, w.shards_text), ("shards_text", "cannot be read as HDF5")),
    Case(
        "rp-shard-unreadable",
        "rp",
        lambda w, d: rp(w, d, unreadable_in(copy_to(d, w.shards), "shard_00.hdf5")),
        ("shard_00.hdf5", "cannot be read"),
        as_user=True,
    ),
    Case("rp-shard-missing-dataset", "rp", lambda w, d: rp(w, d, w.shards_missing), ("next_sentence_labels", "lacks")),
    Case("rp-shard-float-ids", "rp", lambda w, d: rp(w, d, w.shards_float), ("input_ids", "must be integers")),
    Case("rp-shard-rows-differ", "rp", lambda w, d: rp(w, d, w.shards_rows), ("shards_rows", "mismatched shapes")),
    Case("rp-shard-flat-ids", "rp", lambda w, d: rp(w, d, w.shards_flat), ("shards_flat", "mismatched shapes")),
    Case("rp-shard-zero-rows", "rp", lambda w, d: rp(w, d, w.shards_zero), ("shards_zero", "no samples")),
    Case(
        "rp-shard-other-seq-length",
        "rp",
        lambda w, d: rp(w, d, w.shards_seq64),
        ("length 64", "--max_seq_length is 32"),
    ),
    Case(
        "rp-shard-unmasked-without-dynamic",
        "rp",
        lambda w, d: rp(w, d, w.shards_unmasked),
        ("--no_static_masking", "--dynamic_masking"),
    ),
    Case(
        "rp-config-missing",
        "rp",
        lambda w, d: rp(w, d, w.shards, config=d / "none.json"),
        ("--config_file", "not found"),
    ),
    Case(
        "rp-config-not-json",
        "rp",
        lambda w, d: rp(w, d, w.shards, config=w.config_notjson),
        ("--config_file", "not_json.json", "not valid JSON"),
    ),
    Case(
        "rp-config-a-list", "rp", lambda w, d: rp(w, d, w.shards, config=w.config_list), ("list.json", "not an object")
    ),
    Case("rp-config-is-folder", "rp", lambda w, d: rp(w, d, w.shards, config=w.root), ("--config_file", "not found")),
    Case(
        "rp-vocab-size-differs",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--vocab_file", str(w.vocab_small)),
        ("--vocab_file", "50 tokens", "vocab_size is 100"),
    ),
    Case(
        "rp-vocab-not-utf8",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--vocab_file", str(w.vocab_latin1)),
        ("--vocab_file", "not UTF-8"),
    ),
    Case(
        "rp-seq-above-positions",
        "rp",
        lambda w, d: rp(w, d, w.shards_seq128, seq=128),
        ("--max_seq_length 128", "max_position_embeddings 64"),
    ),
    Case(
        "rp-init-checkpoint-other-config",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--init_checkpoint", str(w.ckpt_other)),
        ("ckpt_48.pt", "does not fit", "wrong shape"),
    ),
    Case(
        "rp-init-checkpoint-missing",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--init_checkpoint", str(d / "x.pt")),
        ("--init_checkpoint", "not found"),
    ),
    Case(
        "rp-init-checkpoint-truncated",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--init_checkpoint", str(w.ckpt_truncated)),
        ("truncated.pt", "cannot be read"),
    ),
    Case(
        "rp-init-checkpoint-malicious",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--init_checkpoint", str(w.evil_pt)),
        ("evil.pt", "refused"),
        payload=True,
    ),
    Case(
        "rp-init-checkpoint-malicious-pickle",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--init_checkpoint", str(w.evil_bin)),
        ("evil.bin", "refused"),
        payload=True,
    ),
    Case(
        "rp-resume-malicious-checkpoint",
        "rp",
        lambda w, d: (
            rp(w, d, w.shards, "--resume_from_checkpoint") if place(w.evil_pt, d / "out" / "ckpt_1.pt") else []
        ),
        ("--resume_from_checkpoint", "ckpt_1.pt", "can be read"),
        payload=True,
    ),
    Case(
        "rp-output-holds-checkpoints",
        "rp",
        lambda w, d: rp(w, d, w.shards) if place(w.ckpt, d / "out" / "ckpt_1.pt") else [],
        ("--output_dir", "ckpt_1.pt", "--resume_from_checkpoint"),
    ),
    Case(
        "rp-output-dir-is-file",
        "rp",
        lambda w, d: args_for(w.shards, w.config, w.a_file, "--json-summary", str(d / "log.json")),
        ("--output_dir", "is a file"),
    ),
    Case(
        "rp-log-is-folder",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--json-summary", str(w.root)),
        ("--json-summary", "is a folder"),
    ),
    Case("rp-batch-zero", "rp", lambda w, d: rp(w, d, w.shards, "--train_batch_size", "0"), ("--train_batch_size 0",)),
    Case(
        "rp-batch-not-divisible",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--gradient_accumulation_steps", "3"),
        ("--train_batch_size 8", "--gradient_accumulation_steps 3"),
    ),
    Case(
        "rp-warmup-above-1",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--warmup_proportion", "2"),
        ("--warmup_proportion 2",),
    ),
    Case(
        "rp-learning-rate-negative",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--learning_rate", "-1"),
        ("--learning_rate -1",),
    ),
    Case(
        "rp-resume-step-without-resume",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--resume_step", "3"),
        ("--resume_step", "--resume_from_checkpoint"),
    ),
    Case(
        "rp-dynamic-masking-without-vocab",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--dynamic_masking"),
        ("--dynamic_masking", "--vocab_file"),
    ),
    Case(
        "rp-phase2-without-phase1",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--phase2", "--phase1_end_step", "5"),
        ("phase 2", "ckpt_5.pt", "--init_checkpoint"),
    ),
    Case(
        "rp-eval-dir-missing",
        "rp",
        lambda w, d: rp(w, d, w.shards, "--eval_dir", str(d / "none")),
        ("--eval_dir", "not a folder"),
    ),
    Case("rp-precision-unknown", "rp", lambda w, d: rp(w, d, w.shards, "--precision", "fp8"), ("--precision", "fp8")),
    # ---- run_squad.py ---------------------------------------------------------------------------------------
    Case(
        "squad-train-file-missing",
        "squad",
        lambda w, d: squad(w, d, "--do_train", "--train_file", str(d / "x.json")),
        ("--train_file", "not found"),
    ),
    Case(
        "squad-predict-malformed",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad_malformed)),
        ("squad_malformed.json", "not valid JSON"),
    ),
    Case(
        "squad-predict-malformed-after-training",
        "squad",
        lambda w, d: squad(
            w, d, "--do_train", "--train_file", str(w.squad), "--do_predict", "--predict_file", str(w.squad_malformed)
        ),
        ("squad_malformed.json", "not valid JSON"),
    ),
    Case(
        "squad-predict-not-squad",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad_list)),
        ("squad_list.json", "no 'data' list"),
    ),
    Case(
        "squad-predict-no-paragraphs",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad_no_paragraphs)),
        ("squad_noparas.json", "paragraphs"),
    ),
    Case(
        "squad-predict-not-utf8",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad_latin1)),
        ("squad_latin1.json", "not UTF-8"),
    ),
    Case(
        "squad-predict-empty",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.empty)),
        ("empty.txt", "not valid JSON"),
    ),
    Case(
        "squad-predict-unreadable",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(unreadable(copy_to(d, w.squad)))),
        ("squad.json", "Permission denied", "check its permissions"),
        as_user=True,
    ),
    Case(
        "squad-train-without-answers",
        "squad",
        lambda w, d: squad(w, d, "--do_train", "--train_file", str(w.squad_no_answer)),
        ("squad_noanswer.json", "no answer", "--version_2_with_negative"),
    ),
    Case(
        "squad-checkpoint-malicious",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad), ckpt=w.evil_pt),
        ("evil.pt", "refused"),
        payload=True,
    ),
    Case(
        "squad-checkpoint-other-config",
        "squad",
        lambda w, d: squad(
            w, d, "--do_predict", "--predict_file", str(w.squad), "--config_file", str(w.config), ckpt=w.ckpt_other
        ),
        ("ckpt_48.pt", "does not fit"),
    ),
    Case(
        "squad-config-not-json",
        "squad",
        lambda w, d: squad(
            w, d, "--do_predict", "--predict_file", str(w.squad), "--config_file", str(w.config_notjson)
        ),
        ("not_json.json", "not valid JSON"),
    ),
    Case(
        "squad-seq-above-positions",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad), "--max_seq_length", "128"),
        ("--max_seq_length 128", "max_position_embeddings 64"),
    ),
    Case(
        "squad-vocab-larger-than-model",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad), "--vocab_file", str(w.vocab_big)),
        ("--vocab_file", "200 tokens", "model only 100"),
    ),
    Case(
        "squad-doc-stride-zero",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad), "--doc_stride", "0"),
        ("--doc_stride", "positive"),
    ),
    Case(
        "squad-query-longer-than-window",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad), "--max_query_length", "30"),
        ("--max_seq_length 32", "--max_query_length 30"),
    ),
    Case("squad-nothing-to-do", "squad", lambda w, d: squad(w, d), ("nothing to do", "--do_train")),
    Case(
        "squad-output-dir-is-file",
        "squad",
        lambda w, d: squad(w, d, "--do_predict", "--predict_file", str(w.squad), "--output_dir", str(w.a_file)),
        ("--output_dir", "is a file"),
    ),
    # ---- run_glue.py ----------------------------------------------------------------------------------------
    Case(
        "glue-data-dir-missing",
        "glue",
        lambda w, d: glue(w, d, d / "none", "--do_train"),
        ("--data_dir", "not a directory"),
    ),
    Case(
        "glue-train-columns", "glue", lambda w, d: glue(w, d, w.glue_columns, "--do_train"), ("train.tsv", "no column")
    ),
    Case(
        "glue-train-bad-label",
        "glue",
        lambda w, d: glue(w, d, w.glue_label, "--do_train"),
        ("train.tsv:2", "label '7'"),
    ),
    Case(
        "glue-train-short-row", "glue", lambda w, d: glue(w, d, w.glue_short, "--do_train"), ("train.tsv:2", "fields")
    ),
    Case(
        "glue-train-not-utf8", "glue", lambda w, d: glue(w, d, w.glue_latin1, "--do_train"), ("train.tsv", "not UTF-8")
    ),
    Case(
        "glue-train-header-only",
        "glue",
        lambda w, d: glue(w, d, w.glue_header_only, "--do_train"),
        ("train set", "no examples"),
    ),
    Case("glue-train-empty", "glue", lambda w, d: glue(w, d, w.glue_empty, "--do_train"), ("train.tsv", "is empty")),
    Case(
        "glue-dev-missing",
        "glue",
        lambda w, d: glue(w, d, w.glue_nodev, "--do_train", "--do_eval"),
        ("dev set not found", "--data_dir"),
    ),
    Case(
        "glue-train-unreadable",
        "glue",
        lambda w, d: glue(w, d, unreadable_in(copy_to(d, w.glue), "train.tsv"), "--do_train"),
        ("train.tsv", "Permission denied"),
        as_user=True,
    ),
    Case(
        "glue-task-unknown",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", "--task_name", "mrcp"),
        ("--task_name 'mrcp'",),
    ),
    Case(
        "glue-checkpoint-malicious",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", ckpt=w.evil_pt),
        ("evil.pt", "refused"),
        payload=True,
    ),
    Case(
        "glue-checkpoint-malicious-hf-folder",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", ckpt=w.evil_hf),
        ("pytorch_model.bin", "refused"),
        payload=True,
    ),
    Case(
        "glue-checkpoint-truncated",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", ckpt=w.ckpt_truncated),
        ("truncated.pt", "cannot be read"),
    ),
    Case(
        "glue-checkpoint-not-tensors",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", ckpt=w.not_a_checkpoint),
        ("notes.pt",),
    ),
    Case(
        "glue-checkpoint-missing",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", ckpt=d / "x.pt"),
        ("--init_checkpoint", "not found"),
    ),
    Case(
        "glue-batch-not-divisible",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", "--train_batch_size", "8", "--gradient_accumulation_steps", "3"),
        ("--train_batch_size 8", "--gradient_accumulation_steps 3"),
    ),
    Case(
        "glue-vocab-larger-than-model",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", "--vocab_file", str(w.vocab_big)),
        ("--vocab_file", "200 tokens", "model only 100"),
    ),
    Case(
        "glue-seq-above-positions",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", "--max_seq_length", "128"),
        ("--max_seq_length 128", "max_position_embeddings 64"),
    ),
    Case(
        "glue-seq-zero",
        "glue",
        lambda w, d: glue(w, d, w.glue, "--do_train", "--max_seq_length", "0"),
        ("--max_seq_length", "positive"),
    ),
    # ---- run_swag.py ----------------------------------------------------------------------------------------
    Case(
        "swag-train-missing",
        "swag",
        lambda w, d: swag(w, d, d / "none", "--do_train"),
        ("train.csv not found", "--data_dir"),
    ),
    Case(
        "swag-train-bad-label",
        "swag",
        lambda w, d: swag(w, d, w.swag_label, "--do_train"),
        ("train.csv:2", "label '9'"),
    ),
    Case(
        "swag-train-not-utf8", "swag", lambda w, d: swag(w, d, w.swag_latin1, "--do_train"), ("train.csv", "not UTF-8")
    ),
    Case(
        "swag-checkpoint-malicious",
        "swag",
        lambda w, d: swag(w, d, w.swag, "--do_train", ckpt=w.evil_bin),
        ("evil.bin", "refused"),
        payload=True,
    ),
    Case(
        "swag-seq-above-positions",
        "swag",
        lambda w, d: swag(w, d, w.swag, "--do_train", "--max_seq_length", "100"),
        ("--max_seq_length 100", "max_position_embeddings 64"),
    ),
    Case(
        "swag-seq-too-short",
        "swag",
        lambda w, d: swag(w, d, w.swag, "--do_train", "--max_seq_length", "2"),
        ("--max_seq_length", "at least 3"),
    ),
    # ---- extract_features.py --------------------------------------------------------------------------------
    Case(
        "extract-input-missing",
        "extract",
        lambda w, d: extract(w, d, input_file=d / "none.txt"),
        ("--input_file", "not found"),
    ),
    Case(
        "extract-input-empty", "extract", lambda w, d: extract(w, d, input_file=w.empty), ("--input_file", "is empty")
    ),
    Case(
        "extract-input-binary", "extract", lambda w, d: extract(w, d, input_file=w.binary), ("binary.txt", "not UTF-8")
    ),
    Case(
        "extract-input-not-utf8",
        "extract",
        lambda w, d: extract(w, d, input_file=w.latin1),
        ("latin1.txt", "not UTF-8"),
    ),
    Case(
        "extract-input-folder",
        "extract",
        lambda w, d: extract(w, d, input_file=w.root),
        ("--input_file", "is a folder"),
    ),
    Case(
        "extract-input-unreadable",
        "extract",
        lambda w, d: extract(w, d, input_file=unreadable(copy_to(d, w.lines))),
        ("lines.txt", "cannot be read"),
        as_user=True,
    ),
    Case(
        "extract-output-is-folder",
        "extract",
        lambda w, d: extract(w, d, output=_mkdir(d / "out" / "f.jsonl")),
        ("--output_file", "is a folder"),
    ),
    Case(
        "extract-output-read-only",
        "extract",
        lambda w, d: extract(w, d, output=read_only_folder(d / "out") / "f.jsonl"),
        ("--output_file", "cannot write"),
        as_user=True,
    ),
    Case(
        "extract-output-suffix",
        "extract",
        lambda w, d: extract(w, d, output=d / "out" / "f.txt"),
        ("--output_file", "cannot tell the format"),
    ),
    Case(
        "extract-checkpoint-malicious",
        "extract",
        lambda w, d: extract(w, d, ckpt=w.evil_pt),
        ("evil.pt", "refused"),
        payload=True,
    ),
    Case(
        "extract-layers-out-of-range",
        "extract",
        lambda w, d: extract(w, d, "--layers", "-3"),
        ("--layers [-3]", "out of range"),
    ),
    Case(
        "extract-vocab-larger-than-model",
        "extract",
        lambda w, d: extract(w, d, "--vocab_file", str(w.vocab_big)),
        ("--vocab_file", "200 tokens", "model only 100"),
    ),
    Case(
        "extract-seq-above-positions",
        "extract",
        lambda w, d: extract(w, d, "--max_seq_length", "100"),
        ("--max_seq_length 100", "max_position_embeddings"),
    ),
    # ---- convert_checkpoint.py ------------------------------------------------------------------------------
    Case("convert-input-missing", "convert", lambda w, d: convert(w, d, source=d / "x.pt"), ("--input", "not found")),
    Case(
        "convert-input-malicious",
        "convert",
        lambda w, d: convert(w, d, source=w.evil_pt),
        ("evil.pt", "refused"),
        payload=True,
    ),
    Case(
        "convert-input-malicious-pickle",
        "convert",
        lambda w, d: convert(w, d, source=w.evil_bin),
        ("evil.bin", "refused"),
        payload=True,
    ),
    Case(
        "convert-input-truncated",
        "convert",
        lambda w, d: convert(w, d, source=w.ckpt_truncated),
        ("truncated.pt", "cannot be read"),
    ),
    Case(
        "convert-input-unreadable",
        "convert",
        lambda w, d: convert(w, d, source=unreadable(copy_to(d, w.ckpt))),
        ("ckpt.pt", "cannot be read"),
        as_user=True,
    ),
    Case(
        "convert-other-config",
        "convert",
        lambda w, d: convert(w, d, "--config_file", str(w.config), source=w.ckpt_other),
        ("ckpt_48.pt", "does not fit"),
    ),
    Case(
        "convert-config-not-json",
        "convert",
        lambda w, d: convert(w, d, "--config_file", str(w.config_notjson)),
        ("not_json.json", "not valid JSON"),
    ),
    Case(
        "convert-output-hf-is-file", "convert", lambda w, d: convert(w, d, output=w.a_file), ("--output", "is a file")
    ),
    Case(
        "convert-output-nvidia-is-folder",
        "convert",
        lambda w, d: convert(w, d, "--format", "nvidia", output=_mkdir(d / "out" / "converted.pt")),
        ("--output", "is a folder"),
    ),
    Case(
        "convert-vocab-missing",
        "convert",
        lambda w, d: convert(w, d, "--vocab_file", str(d / "vocab.txt")),
        ("--vocab_file", "not found"),
    ),
    Case(
        "convert-vocab-with-nvidia",
        "convert",
        lambda w, d: convert(
            w, d, "--format", "nvidia", "--vocab_file", str(w.vocab), output=d / "out" / "converted.pt"
        ),
        ("--vocab_file", "--format hf"),
    ),
    Case(
        "convert-num-labels-zero",
        "convert",
        lambda w, d: convert(w, d, "--model", "classification", "--num_labels", "0"),
        ("--num_labels", "at least 1"),
    ),
    # ---- data/bertPrep.py -----------------------------------------------------------------------------------
    Case(
        "bertprep-no-working-dir",
        "bertprep",
        lambda w, d: ["--action", "sharding", "--dataset", "custom"],
        ("--working_dir", "BERT_PREP_WORKING_DIR"),
    ),
    Case(
        "bertprep-working-dir-is-file",
        "bertprep",
        lambda w, d: prep(w, d, "sharding", "--dataset", "custom", "--working_dir", str(w.a_file)),
        ("--working_dir", "is a file"),
    ),
    Case(
        "bertprep-processes-zero",
        "bertprep",
        lambda w, d: prep(w, d, "sharding", "--dataset", "custom", "--n_processes", "0"),
        ("--n_processes",),
    ),
    Case(
        "bertprep-custom-input-missing",
        "bertprep",
        lambda w, d: prep(w, d, "text_formatting", "--dataset", "custom", "--input_dir", str(d / "none")),
        ("--input_dir", "not a folder"),
    ),
    Case(
        "bertprep-custom-binary-file",
        "bertprep",
        lambda w, d: prep(w, d, "text_formatting", "--dataset", "custom", "--input_dir", str(w.custom_binary)),
        ("image.txt", "not text"),
    ),
    Case(
        "bertprep-custom-unreadable-file",
        "bertprep",
        lambda w, d: prep(
            w,
            d,
            "text_formatting",
            "--dataset",
            "custom",
            "--input_dir",
            str(unreadable_in(copy_to(d, w.custom_unreadable), "book.txt")),
        ),
        ("book.txt", "cannot be read"),
        as_user=True,
    ),
    Case(
        "bertprep-sharding-input-missing",
        "bertprep",
        lambda w, d: prep(w, d, "sharding", "--dataset", "custom", "--input_files", str(d / "none.txt")),
        ("none.txt", "does not exist"),
    ),
    Case(
        "bertprep-shards-zero",
        "bertprep",
        lambda w, d: prep(
            w, d, "sharding", "--dataset", "custom", "--input_files", str(w.corpus), "--n_training_shards", "0"
        ),
        ("--n_training_shards",),
    ),
    Case(
        "bertprep-hdf5-vocab-missing",
        "bertprep",
        lambda w, d: prep(w, d, "create_hdf5_files", "--dataset", "custom", "--vocab_file", str(d / "vocab.txt")),
        ("--vocab_file", "does not exist"),
    ),
    Case(
        "bertprep-hdf5-no-shards",
        "bertprep",
        lambda w, d: prep(w, d, "create_hdf5_files", "--dataset", "custom", "--vocab_file", str(w.vocab)),
        ("no shards", "--action sharding"),
    ),
    Case(
        "bertprep-working-dir-under-a-file",
        "bertprep",
        lambda w, d: prep(w, d, "sharding", "--dataset", "custom", "--working_dir", str(w.a_file / "work")),
        ("a_file/work", "Not a directory", "not a folder"),
    ),
    Case(
        "bertprep-vocab-without-formatted-text",
        "bertprep",
        lambda w, d: prep(w, d, "create_vocab", "--dataset", "custom", "--vocab_size", "300"),
        ("custom_one_article_per_line", "does not exist", "text_formatting"),
    ),
    Case(
        "bertprep-vocab-size-missing",
        "bertprep",
        lambda w, d: prep(w, d, "create_vocab", "--dataset", "custom", "--input_files", str(w.corpus)),
        ("create_vocab", "needs --vocab_size"),
    ),
    Case(
        "bertprep-vocab-output-is-folder",
        "bertprep",
        lambda w, d: prep(
            w,
            d,
            "create_vocab",
            "--dataset",
            "custom",
            "--input_files",
            str(w.corpus),
            "--vocab_size",
            "300",
            "--vocab_file",
            str(w.root),
        ),
        ("--vocab_file", "is a folder"),
    ),
    # ---- data/create_vocab.py -------------------------------------------------------------------------------
    Case(
        "vocab-input-missing",
        "vocab",
        lambda w, d: vocab(w, d, d / "none.txt"),
        ("--input", "none.txt", "does not exist"),
    ),
    Case("vocab-input-none", "vocab", lambda w, d: vocab(w, d), ("--input", "required")),
    Case("vocab-input-empty", "vocab", lambda w, d: vocab(w, d, w.empty), ("empty.txt", "no text to learn from")),
    Case(
        "vocab-input-blank-lines",
        "vocab",
        lambda w, d: vocab(w, d, w.blank, w.empty),
        ("blank.txt", "empty.txt", "no text to learn from"),
    ),
    Case(
        "vocab-input-binary",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, w.binary),
        ("--input", "binary.txt", "not text"),
    ),
    Case("vocab-input-not-utf8", "vocab", lambda w, d: vocab(w, d, w.latin1), ("latin1.txt", "not UTF-8", "convert")),
    Case(
        "vocab-input-truncated-gzip",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus_truncated_gz),
        ("corpus.txt.gz", "truncated gzip"),
    ),
    Case(
        "vocab-input-folder-without-text",
        "vocab",
        lambda w, d: vocab(w, d, w.text_dir),
        ("--input", "text_dir", "without text files"),
    ),
    Case(
        "vocab-input-unreadable",
        "vocab",
        lambda w, d: vocab(w, d, unreadable(copy_to(d, w.corpus))),
        ("--input", "corpus.txt", "cannot be read"),
        as_user=True,
    ),
    Case(
        "vocab-size-below-the-specials",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, size="3"),
        ("--vocab_size 3", "at least 6"),
    ),
    Case(
        "vocab-size-too-small-for-the-alphabet",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, size="40"),
        ("--vocab_size 40", "too small", "alphabet entries"),
    ),
    Case(
        "vocab-size-too-small-for-the-slots",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, size="100", extra=("--unused_slots", "99")),
        ("--vocab_size 100", "99 [unused] slots", "--unused_slots"),
    ),
    Case(
        "vocab-size-too-large-for-the-corpus",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, size="5000"),
        ("--vocab_size 5000", "too large for this corpus", "or less"),
        tokenizes=True,
    ),
    Case(
        "vocab-unused-slots-negative",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, extra=("--unused_slots", "-1")),
        ("--unused_slots -1", "0 or more"),
    ),
    Case(
        "vocab-limit-alphabet-zero",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, extra=("--limit_alphabet", "0")),
        ("--limit_alphabet 0", "at least 1"),
    ),
    Case(
        "vocab-cased-and-lowercase",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus, extra=("--cased", "--do_lower_case")),
        ("--do_lower_case", "not allowed with", "--cased"),
    ),
    Case(
        "vocab-output-is-folder",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus)[:2] + ["--output_file", str(w.root), "--vocab_size", "300"],
        ("--output_file", "is a folder"),
    ),
    Case(
        "vocab-output-under-a-file",
        "vocab",
        lambda w, d: vocab(w, d, w.corpus)[:2] + ["--output_file", str(w.a_file / "vocab.txt"), "--vocab_size", "300"],
        ("--output_file", "cannot create the folder"),
    ),
    Case(
        "vocab-output-read-only-folder",
        "vocab",
        lambda w, d: (
            vocab(w, d, w.corpus)[:2]
            + ["--output_file", str(read_only_folder(d / "out") / "vocab.txt"), "--vocab_size", "300"]
        ),
        ("--output_file", "cannot write"),
        as_user=True,
    ),
    # ---- triton/export_model.py -----------------------------------------------------------------------------
    Case(
        "export-checkpoint-missing", "export", lambda w, d: export(w, d, ckpt=d / "x.pt"), ("--checkpoint", "not found")
    ),
    Case(
        "export-checkpoint-malicious",
        "export",
        lambda w, d: export(w, d, ckpt=w.evil_pt),
        ("evil.pt", "refused"),
        payload=True,
    ),
    Case(
        "export-classification-malicious",
        "export",
        lambda w, d: export(w, d, "--task", "classification", ckpt=w.evil_bin),
        ("evil.bin", "refused"),
        payload=True,
    ),
    Case(
        "export-checkpoint-truncated",
        "export",
        lambda w, d: export(w, d, ckpt=w.ckpt_truncated),
        ("truncated.pt", "cannot be read"),
    ),
    Case(
        "export-no-head",
        "export",
        lambda w, d: [a for a in export(w, d) if a != "--allow_fresh_head"],
        ("no qa head", "--allow_fresh_head"),
    ),
    Case("export-opset-old", "export", lambda w, d: export(w, d, "--opset", "11"), ("--opset 11", "17")),
    Case(
        "export-seq-above-positions",
        "export",
        lambda w, d: export(w, d, "--max_seq_length", "100"),
        ("--max_seq_length 100", "max_position_embeddings"),
    ),
    Case(
        "export-num-labels-zero",
        "export",
        lambda w, d: export(w, d, "--task", "classification", "--num_labels", "0"),
        ("--num_labels", "at least 1"),
    ),
    Case(
        "export-output-is-file",
        "export",
        lambda w, d: [*export(w, d)[:2], "--output_dir", str(w.a_file), *export(w, d)[4:]],
        ("--output_dir", "is a file"),
    ),
    Case(
        "export-vocab-missing",
        "export",
        lambda w, d: export(w, d, "--vocab_file", str(d / "vocab.txt")),
        ("--vocab_file", "not found"),
    ),
    Case(
        "export-config-other",
        "export",
        lambda w, d: export(w, d, "--config_file", str(w.config_other)),
        ("ckpt.pt", "does not fit"),
    ),
]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def tripwires(monkeypatch):
    """Replace every script's expensive step by a failure: the cases must stop before any of them."""

    def arm(script: str) -> None:
        for module, name in TRIPWIRES[script]:

            def tripped(*args, _name=f"{module.__name__}.{name}", **kwargs):
                raise AssertionError(f"{_name} ran: the bad input was not refused before the work")

            monkeypatch.setattr(module, name, tripped)

    return arm


def call(script: str, argv: list[str], capsys) -> tuple[int, str]:
    """Run a script's main(argv) here: (exit status, stderr as the user would see it)."""
    capsys.readouterr()
    code, message = 0, ""
    try:
        result = MAINS[script](argv)
        code = result if isinstance(result, int) else 0
    except SystemExit as e:  # what Python does with it at the top level: print a string, exit 1
        if isinstance(e.code, str):
            code, message = 1, e.code + "\n"
        else:
            code = e.code or 0
    return code, capsys.readouterr().err + message


def assert_one_line(code: int, stderr: str, prog: str, expect: tuple[str, ...]) -> str:
    assert code != 0, f"exit status 0; stderr:\n{stderr}"
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(f"{prog}:"), last
    for word in expect:
        assert word in last, f"{word!r} not in the last line: {last}"
    assert any(word in last for word in ADVICE), f"says nothing about what to do: {last}"
    # Never PyTorch's advice for a refused checkpoint (re-run with weights_only=False, allowlist its globals).
    assert "weights_only" not in stderr and "safe_globals" not in stderr, stderr
    return last


def complete_looking(folder: Path) -> dict[str, int]:
    """Files under `folder` (its input copies in in/ aside) that look like finished outputs or interrupted writes,
    with their modification times."""
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns
        for pattern in LOOKS_COMPLETE
        for p in folder.rglob(pattern)
        if p.relative_to(folder).parts[0] != "in"
    }


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line(case: Case, W, tripwires, capsys, tmp_path_factory):
    folder = W.root / "cases" / case.id
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    argv = case.argv(W, folder)
    if case.as_user:
        for p in [folder, *folder.rglob("*")]:
            if p.is_dir() and stat.S_IMODE(p.stat().st_mode) not in (0o555, 0):
                p.chmod(0o777)  # the user may write where the case did not forbid it
    tripwires(case.script)
    if case.script == "cpd" and not case.tokenizes:
        tripwires("cpd-tokenizing")
    if case.script == "vocab" and not case.tokenizes:
        tripwires("vocab-learning")
    before = complete_looking(folder)  # a case's own inputs (a checkpoint already in the output folder)
    with as_a_user() if case.as_user else contextlib.nullcontext():
        code, stderr = call(case.script, argv, capsys)
    last = assert_one_line(code, stderr, PROGS[case.script], case.expect)
    if os.environ.get("BAD_INPUTS_REPORT"):  # a file to collect every case's message in, for reading them all
        with open(os.environ["BAD_INPUTS_REPORT"], "a", encoding="utf-8") as f:
            f.write(f"{case.id}\t{last}\n")
    assert complete_looking(folder) == before, "something was left behind (or an input was changed)"
    if case.payload:
        assert not W.marker.exists(), "the malicious pickle's payload ran"


# ---------------------------------------------------------------------------------------------------------------
# The launchers: bash subprocesses (each stops in its own checks, before Python starts, but one)


def pretraining_sh(w, d, **changed: str) -> list[str]:
    """run_pretraining.sh's 25 positional arguments for a tiny run (phase 1 only: PHASES=1), with `changed`
    (argument number -> value) applied."""
    args = [
        "8",
        "1e-3",
        "fp32",
        "1",
        "0.5",
        "2",
        "1",
        "false",
        "true",
        "true",
        "1",
        "7",
        "tiny",
        "false",
        "false",
        "8",
        "1e-3",
        "0.5",
        "1",
        "1",
        str(w.shards),
        str(w.shards),
        str(REPO_ROOT),
        "None",
        str(w.config),
    ]
    for number, value in changed.items():
        args[int(number.lstrip("a")) - 1] = value
    return args


def squad_sh(w, d, **changed: str) -> list[str]:
    args = [
        str(w.ckpt),
        "1",
        "2",
        "3e-5",
        "fp32",
        "1",
        "1",
        str(w.root),
        str(w.vocab),
        str(d / "out"),
        "prediction",
        str(w.config),
        "-1",
    ]
    for number, value in changed.items():
        args[int(number.lstrip("a")) - 1] = value
    return args


def glue_sh(w, d, **changed: str) -> list[str]:
    args = [
        str(w.ckpt),
        str(w.glue),
        str(w.vocab),
        str(w.config),
        str(d / "out"),
        "mrpc",
        "1",
        "8",
        "1",
        "2e-5",
        "0.1",
        "1",
        "-1",
        "fp32",
        "2",
        "train eval",
    ]
    for number, value in changed.items():
        args[int(number.lstrip("a")) - 1] = value
    return args


def swag_sh(w, d, **changed: str) -> list[str]:
    args = [
        str(w.ckpt),
        str(w.swag),
        str(w.vocab),
        str(w.config),
        str(d / "out"),
        "1",
        "2",
        "1",
        "2e-5",
        "0.1",
        "1",
        "-1",
        "fp32",
        "42",
        "train",
    ]
    for number, value in changed.items():
        args[int(number.lstrip("a")) - 1] = value
    return args


LAUNCHER_CASES = [
    (
        "pretraining-precision",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a3="fp8"),
        ("argument 3 (precision)", "fp8"),
    ),
    (
        "pretraining-batch-not-a-number",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a1="many"),
        ("argument 1 (train_batch_size)", "integer"),
    ),
    (
        "pretraining-flag-not-boolean",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a8="yes"),
        ("argument 8 (resume_training)", "true or false"),
    ),
    (
        "pretraining-data-missing",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a21=str(d / "none")),
        ("phase 1 data folder", "not found", "argument 21"),
    ),
    (
        "pretraining-config-missing",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a25=str(d / "none.json")),
        ("none.json", "not found", "argument 25"),
    ),
    (
        "pretraining-batch-not-divisible",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a1="10", a11="3"),
        ("train_batch_size 10", "not divisible", "gradient_accumulation_steps 3"),
    ),
    (
        "pretraining-python-refuses",
        "run_pretraining.sh",
        lambda w, d: pretraining_sh(w, d, a21=str(w.shards_empty)),
        ("phase 1 failed", "run_pretraining.py: error: --input_dir", "no .hdf5 shards"),
    ),
    (
        "squad-checkpoint-missing",
        "run_squad.sh",
        lambda w, d: squad_sh(w, d, a1=str(d / "none.pt")),
        ("none.pt", "not found", "argument 1"),
    ),
    ("squad-mode", "run_squad.sh", lambda w, d: squad_sh(w, d, a11="fly"), ("argument 11 (mode)", "fly")),
    (
        "squad-predict-file-missing",
        "run_squad.sh",
        lambda w, d: squad_sh(w, d, a8=str(d / "none")),
        ("dev-v1.1.json", "not found", "argument 8"),
    ),
    (
        "glue-data-missing",
        "run_glue.sh",
        lambda w, d: glue_sh(w, d, a2=str(d / "none")),
        ("GLUE folder", "not found", "argument 2"),
    ),
    (
        "glue-batch-not-divisible",
        "run_glue.sh",
        lambda w, d: glue_sh(w, d, a9="3"),
        ("argument 8 (batch_size 8)", "divisible", "argument 9"),
    ),
    (
        "swag-batch-not-divisible",
        "run_swag.sh",
        lambda w, d: swag_sh(w, d, a7="3", a8="2"),
        ("argument 7 (batch_size 3)", "divisible"),
    ),
    (
        "cpu-demo-corpus-missing",
        "run_cpu_demo.sh",
        lambda w, d: ["--corpus", str(d / "none.txt"), "--out", str(d / "out")],
        ("none.txt", "not found", "--corpus"),
    ),
    (
        "cpu-demo-vocab-missing",
        "run_cpu_demo.sh",
        lambda w, d: ["--corpus", str(w.corpus), "--vocab", str(d / "none.txt"), "--out", str(d / "out")],
        ("none.txt", "not found", "--vocab"),
    ),
    ("cpu-demo-batch-zero", "run_cpu_demo.sh", lambda w, d: ["--batch", "0"], ("--batch", "positive integer")),
    (
        "cpu-demo-config-folder",
        "run_cpu_demo.sh",
        lambda w, d: ["--config", str(w.root)],
        ("--config", "existing BERT config JSON file"),
    ),
    ("cpu-demo-unknown-option", "run_cpu_demo.sh", lambda w, d: ["--phases", "3"], ("unknown option '--phases'",)),
    (
        "cpu-demo-optimizer-unknown",
        "run_cpu_demo.sh",
        lambda w, d: ["--optimizer", "sgd"],
        ("--optimizer", "adamw or nvlamb"),
    ),
    (
        "cpu-demo-config-not-json",
        "run_cpu_demo.sh",
        lambda w, d: [
            "--corpus",
            str(w.corpus),
            "--vocab",
            str(w.vocab),
            "--config",
            str(w.config_notjson),
            "--out",
            str(d / "out"),
        ],
        ("--config", "not_json.json", "not a BERT config"),
    ),
    (
        "cpu-demo-vocab-size-zero",
        "run_cpu_demo.sh",
        lambda w, d: ["--vocab_size", "0"],
        ("--vocab_size", "positive integer"),
    ),
    (
        "cpu-demo-init-checkpoint-missing",
        "run_cpu_demo.sh",
        lambda w, d: [
            "--corpus",
            str(w.corpus),
            "--vocab",
            str(w.vocab),
            "--init_checkpoint",
            str(d / "none.pt"),
            "--out",
            str(d / "out"),
        ],
        ("none.pt", "not found", "--init_checkpoint"),
    ),
]


@pytest.mark.parametrize("name, script, argv, expect", LAUNCHER_CASES, ids=[c[0] for c in LAUNCHER_CASES])
def test_launcher_bad_input_is_one_line(name, script, argv, expect, W):
    folder = W.root / "launchers" / name
    folder.mkdir(parents=True)
    env = {
        **subprocess_env(),
        "PYTHON": sys.executable,
        "RESULTS_DIR": str(folder / "results"),
        "CHECKPOINTS_DIR": str(folder / "checkpoints"),
        "PHASES": "1",
        "EXTRA_ARGS": "--num_workers 0 --disable_progress_bar",
    }
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / script), *argv(W, folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
    )
    assert_one_line(done.returncode, done.stderr, script, expect)
    assert not complete_looking(folder), "something was left behind"


def test_the_matrix_covers_every_script_and_launcher():
    per_script: dict[str, int] = {}
    for case in CASES:
        per_script[PROGS[case.script]] = per_script.get(PROGS[case.script], 0) + 1
    for _, script, _, _ in LAUNCHER_CASES:
        per_script[script] = per_script.get(script, 0) + 1
    assert len(CASES) + len(LAUNCHER_CASES) >= 60
    assert set(per_script) >= {
        *PROGS.values(),
        "run_pretraining.sh",
        "run_squad.sh",
        "run_glue.sh",
        "run_cpu_demo.sh",
    }, per_script
    assert {c.script for c in CASES if c.payload} >= {"rp", "squad", "glue", "swag", "extract", "convert", "export"}
    assert {c.script for c in CASES if c.as_user} >= {"cpd", "rp", "squad", "glue", "extract", "convert", "bertprep"}


# ---------------------------------------------------------------------------------------------------------------
# --debug: the same errors with their traceback

DEBUG_CASES = {
    "cpd": "cpd-vocab-not-utf8",
    "rp": "rp-config-not-json",
    "squad": "squad-predict-malformed",
    "glue": "glue-checkpoint-malicious",
    "swag": "swag-checkpoint-malicious",
    "extract": "extract-checkpoint-malicious",
    "convert": "convert-input-malicious",
    "bertprep": "bertprep-working-dir-under-a-file",
    "export": "export-checkpoint-malicious",
    "vocab": "vocab-input-missing",
}


@pytest.mark.parametrize("script", sorted(DEBUG_CASES))
def test_debug_lets_the_error_through(script, W, tripwires, capsys):
    """With --debug the expected error is raised as itself (Python prints its traceback), not turned into a line."""
    case = next(c for c in CASES if c.id == DEBUG_CASES[script])
    folder = W.root / "debug" / case.id
    folder.mkdir(parents=True)
    tripwires(script)
    with pytest.raises(cli.EXPECTED_ERRORS) as raised:
        MAINS[script]([*case.argv(W, folder), "--debug"])
    assert not isinstance(raised.value, SystemExit)
    assert any(word in str(raised.value) for word in case.expect)
    assert not W.marker.exists()


def test_debug_shows_the_traceback_in_a_real_process(W, tmp_path):
    argv = [
        sys.executable,
        str(REPO_ROOT / "create_pretraining_data.py"),
        "--input_file",
        str(W.corpus),
        "--output_file",
        str(tmp_path / "s.hdf5"),
        "--vocab_file",
        str(W.vocab_latin1),
        "--num_workers",
        "1",
    ]
    plain = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    assert plain.stderr.startswith("create_pretraining_data.py: error: --vocab_file")
    assert "Traceback" not in plain.stderr
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("bert_recipe.io.cli.InputError: --vocab_file"), debug.stderr
    assert not (tmp_path / "s.hdf5").exists()


def test_script_errors_puts_every_message_in_one_form(capsys):
    """The helper itself: a script's own SystemExit message, an OSError with only errno and file, and a multi-line
    message all become '<prog>: error: <one line>'; an unexpected exception (a bug) is never hidden."""

    def run(exc):
        with pytest.raises(SystemExit) as raised:
            with cli.script_errors("x.py", []):
                raise exc
        return raised.value.code

    assert run(SystemExit("error: --flag bad")) == "x.py: error: --flag bad"
    assert run(SystemExit("x.py: --flag bad")) == "x.py: error: --flag bad"
    assert run(SystemExit(2)) == 2  # argparse's usage errors keep their status
    assert (
        run(OSError(errno.ENOSPC, "No space left on device", "/d/f"))
        == "x.py: error: /d/f: No space left on device (free some space or write elsewhere, then run again)"
    )
    assert run(ValueError("two\nlines")) == "x.py: error: two lines"
    with pytest.raises(KeyError):
        with cli.script_errors("x.py", []):
            raise KeyError("a bug")
    with pytest.raises(OSError):
        with cli.script_errors("x.py", ["--debug"]):
            raise OSError(errno.EACCES, "Permission denied")


# ---------------------------------------------------------------------------------------------------------------
# Disk full: one line, exit 1, no crash, nothing partial under a final name. The kernel's own ENOSPC: the
# temporary file of the write is /dev/full.


def dev_full_for(monkeypatch, name: str) -> None:
    """atomic_io.atomic_open's temporary file for `name` writes to /dev/full: every write fails with ENOSPC."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, tmp = real(*args, **kwargs)
        if str(kwargs.get("prefix", "")).startswith(f".{name}."):
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, tmp

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def no_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_cpd_disk_full_during_the_shard_write(W, tmp_path, monkeypatch, capsys):
    dev_full_for(monkeypatch, "shard.hdf5")
    code, stderr = call("cpd", cpd_in(W, tmp_path, W.corpus), capsys)
    assert_one_line(code, stderr, "create_pretraining_data.py", ("shard.hdf5", "No space left on device", "free"))
    assert no_leftovers(tmp_path / "out") == []  # no shard, no temporary file, no work folder


def test_cpd_disk_full_refused_before_writing(W, tmp_path, monkeypatch, capsys):
    """The shard's exact size is checked against the free space before a byte is written."""
    free = shutil.disk_usage(tmp_path)._replace(free=10_000)
    monkeypatch.setattr(shard_writer.shutil, "disk_usage", lambda path: free)
    monkeypatch.setattr(atomic_io, "atomic_open", None)  # never reached
    code, stderr = call("cpd", cpd_in(W, tmp_path, W.corpus), capsys)
    assert_one_line(code, stderr, "create_pretraining_data.py", ("shard.hdf5", "needs", "0.0 MiB free", "free some"))
    assert no_leftovers(tmp_path / "out") == []


def test_cpd_large_shard_is_checked_against_its_uncompressed_size(W, tmp_path, monkeypatch, capsys):
    """Shards above IN_MEMORY_MAX_BYTES are written by HDF5 itself, after a check against the uncompressed size."""
    monkeypatch.setattr(shard_writer, "IN_MEMORY_MAX_BYTES", 0)
    assert create_pretraining_data.main(cpd_in(W, tmp_path / "a", W.corpus)) == 0  # that path writes a good shard
    with h5py.File(tmp_path / "a" / "out" / "shard.hdf5") as f:
        assert f["input_ids"].shape[1] == 32 and f["input_ids"].shape[0] > 0
    free = shutil.disk_usage(tmp_path)._replace(free=10_000)
    monkeypatch.setattr(shard_writer.shutil, "disk_usage", lambda path: free)
    code, stderr = call("cpd", cpd_in(W, tmp_path / "b", W.corpus), capsys)
    assert_one_line(code, stderr, "create_pretraining_data.py", ("shard.hdf5", "needs", "free some"))
    assert no_leftovers(tmp_path / "b" / "out") == []


def test_cpd_work_folder_fills(W, tmp_path, monkeypatch, capsys):
    """The token map of the work folder cannot be written: one line naming the work folder, which is removed."""
    real_init = shard_writer.CorpusBuilder.__init__

    def init(self, folder, vocab_size):
        real_init(self, folder, vocab_size)
        self.file.close()
        self.file = open("/dev/full", "wb", buffering=0)

    monkeypatch.setattr(shard_writer.CorpusBuilder, "__init__", init)
    code, stderr = call("cpd", cpd_in(W, tmp_path, W.corpus), capsys)
    assert_one_line(code, stderr, "create_pretraining_data.py", (".shard.hdf5.work.", "No space left on device"))
    assert no_leftovers(tmp_path / "out") == []


def test_checkpoint_write_on_a_full_disk_raises_the_oserror_alone(tmp_path, monkeypatch):
    """torch.save wraps a failed write in 'RuntimeError: [enforce fail at inline_container.cc] unexpected pos'
    chained to the OSError (issue 17's 27-line report, two chained tracebacks): atomic_io.atomic_torch_save raises the
    OSError itself, naming the file, and leaves nothing behind. (run_pretraining's whole path:
    tests/test_run_pretraining.py::test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint.)"""
    (tmp_path / "ckpt_1.pt").write_bytes(b"the previous checkpoint")
    disk_full_for_large_writes(monkeypatch)
    checkpoint = {"model": {"w": torch.zeros(1 << 18)}}
    with pytest.raises(RuntimeError, match="unexpected pos"):  # what a bare torch.save does on that disk
        with (
            open(os.open(tmp_path / "bare.pt", os.O_WRONLY | os.O_CREAT), "wb", closefd=True) as raw,
            os.fdopen(os.dup(raw.fileno()), "wb") as f,
        ):
            torch.save(checkpoint, f)
    (tmp_path / "bare.pt").unlink()
    with pytest.raises(OSError) as raised:
        atomic_io.atomic_torch_save(checkpoint, tmp_path / "ckpt_2.pt")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "ckpt_2.pt")
    assert cli.describe_error(raised.value) == (
        f"{tmp_path / 'ckpt_2.pt'}: No space left on device (free some space or write elsewhere, then run again)"
    )
    assert no_leftovers(tmp_path) == ["ckpt_1.pt"]
    assert (tmp_path / "ckpt_1.pt").read_bytes() == b"the previous checkpoint"
