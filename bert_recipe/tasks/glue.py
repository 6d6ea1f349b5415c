"""GLUE: readers for the nine tasks' tsv files, pair encoding for BERT, and the official metrics.

Read top to bottom: the file layouts -> the task table (TASKS) -> reading a split -> encoding -> metrics.

The readers take the files exactly as GLUE's download_glue_data.py writes them:
- tab-separated, no quoting at all (csv.QUOTE_NONE): strings contain unbalanced `"` characters (MRPC, SST-2);
- a UTF-8 byte-order mark on some files (MRPC train/dev), removed by the utf-8-sig codec, and stray `\\ufeff`
  removed from header cells for copies where the mark sits elsewhere;
- a header row on every file except CoLA's train/dev (source, label, original notation, sentence); columns are
  picked by header name, so the extra columns of MNLI (parses, label1..label5) and STS-B (genre, year, ...) do
  not matter, and MNLI's gold label is the column named gold_label (train has one annotator column, dev five).
CoLA is also accepted as the raw public release (in_domain_train.tsv, in_domain_dev.tsv + out_of_domain_dev.tsv,
which together are GLUE's CoLA dev set of 1,043 rows).

Every example gets a guid `<split>-<id>`, the id being the file's own index/id column where it has one (so test
predictions map back to GLUE's submission index), else the row number.
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from bert_recipe.io.cli import InputError

# ----------------------------------------------------------------------------------------------------------------
# Examples and task descriptions


@dataclass(frozen=True)
class InputExample:
    """One row: guid, the text (or the two texts of a pair), and the label as written in the file
    (a class name such as "1" or "entailment"; for STS-B the score as a string; None in test files)."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | None


@dataclass(frozen=True)
class FileLayout:
    """Which columns of a file hold what. `names` gives column names to a file without a header row."""

    text_a: str
    text_b: str | None
    label: str | None
    guid: str | None = None
    names: tuple[str, ...] | None = None  # None: the first row is the header


@dataclass(frozen=True)
class GlueTaskSpec:
    """A GLUE task's description: label names (None for regression), the metric, and where each split lives.

    `train`, each entry of `dev` and `test` are lists of alternatives; an alternative is a list of files read one
    after the other (raw CoLA's dev set is two files). The first alternative whose files all exist is used.
    """

    name: str
    labels: tuple[str, ...] | None
    metric: str  # "mcc", "acc", "acc_f1", "pearson_spearman"
    layout: FileLayout
    test_layout: FileLayout
    train: tuple[tuple[str, ...], ...] = (("train.tsv",),)
    dev: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=lambda: {"dev": (("dev.tsv",),)})
    test: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=lambda: {"test": (("test.tsv",),)})
    skip_short_rows: bool = False  # QQP: the public train file has a few rows with missing fields

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def display_name(self) -> str:
        return DISPLAY_NAMES[self.name]


_COLA_COLUMNS = ("source", "label", "original_notation", "sentence")

TASKS: dict[str, GlueTaskSpec] = {
    "cola": GlueTaskSpec(
        "cola",
        ("0", "1"),
        "mcc",
        FileLayout("sentence", None, "label", names=_COLA_COLUMNS),
        FileLayout("sentence", None, None, guid="index"),
        train=(("train.tsv",), ("in_domain_train.tsv",)),
        dev={"dev": (("dev.tsv",), ("in_domain_dev.tsv", "out_of_domain_dev.tsv"))},
    ),
    "sst-2": GlueTaskSpec(
        "sst-2",
        ("0", "1"),
        "acc",
        FileLayout("sentence", None, "label"),
        FileLayout("sentence", None, None, guid="index"),
    ),
    "mrpc": GlueTaskSpec(
        "mrpc",
        ("0", "1"),
        "acc_f1",
        FileLayout("#1 String", "#2 String", "Quality"),
        FileLayout("#1 String", "#2 String", None, guid="index"),
    ),
    "sts-b": GlueTaskSpec(
        "sts-b",
        None,
        "pearson_spearman",
        FileLayout("sentence1", "sentence2", "score", guid="index"),
        FileLayout("sentence1", "sentence2", None, guid="index"),
    ),
    "qqp": GlueTaskSpec(
        "qqp",
        ("0", "1"),
        "acc_f1",
        FileLayout("question1", "question2", "is_duplicate", guid="id"),
        FileLayout("question1", "question2", None, guid="id"),
        skip_short_rows=True,
    ),
    "mnli": GlueTaskSpec(
        "mnli",
        ("contradiction", "entailment", "neutral"),
        "acc",
        FileLayout("sentence1", "sentence2", "gold_label", guid="index"),
        FileLayout("sentence1", "sentence2", None, guid="index"),
        dev={"dev_matched": (("dev_matched.tsv",),), "dev_mismatched": (("dev_mismatched.tsv",),)},
        test={"test_matched": (("test_matched.tsv",),), "test_mismatched": (("test_mismatched.tsv",),)},
    ),
    "qnli": GlueTaskSpec(
        "qnli",
        ("entailment", "not_entailment"),
        "acc",
        FileLayout("question", "sentence", "label", guid="index"),
        FileLayout("question", "sentence", None, guid="index"),
    ),
    "rte": GlueTaskSpec(
        "rte",
        ("entailment", "not_entailment"),
        "acc",
        FileLayout("sentence1", "sentence2", "label", guid="index"),
        FileLayout("sentence1", "sentence2", None, guid="index"),
    ),
    "wnli": GlueTaskSpec(
        "wnli",
        ("0", "1"),
        "acc",
        FileLayout("sentence1", "sentence2", "label", guid="index"),
        FileLayout("sentence1", "sentence2", None, guid="index"),
    ),
}

DISPLAY_NAMES = {
    "cola": "CoLA",
    "sst-2": "SST-2",
    "mrpc": "MRPC",
    "sts-b": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}

# Other spellings people use for --task_name (GLUE folder names, Hugging Face's names, the original's mnli-mm).
ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "mnli-mm": "mnli", "mnli_mismatched": "mnli", "mnli-m": "mnli"}


def get_task(name: str) -> GlueTaskSpec:
    """The task for a --task_name, case-insensitive; a GlueDataError listing the known names otherwise."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in TASKS:
        raise GlueDataError(f"unknown --task_name {name!r}: choose one of {', '.join(TASKS)} (case does not matter)")
    return TASKS[key]


# ----------------------------------------------------------------------------------------------------------------
# Reading


class GlueDataError(InputError):
    """An unknown task, or a missing or malformed GLUE file; the message names the file and what to do."""


def _resolve(data_dir: Path, task: GlueTaskSpec, split: str, alternatives: Sequence[Sequence[str]]) -> list[Path]:
    for files in alternatives:
        paths = [data_dir / f for f in files]
        if all(p.is_file() for p in paths):
            return paths
    tried = " or ".join("+".join(str(data_dir / f) for f in files) for files in alternatives)
    hint = f"is --data_dir the task's folder from GLUE's download_glue_data.py (e.g. glue_data/{task.display_name})?"
    if not data_dir.is_dir():
        raise GlueDataError(f"--data_dir {data_dir} is not a directory; {hint}")
    raise GlueDataError(f"{task.display_name} {split} set not found: no {tried}; {hint}")


def read_tsv(path: Path) -> list[list[str]]:
    """All rows of a GLUE tsv file: utf-8-sig (drops a leading BOM), tab-separated, no quoting."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            # Without quoting a field never spans lines, but one malformed line can still exceed csv's 128 KiB
            # field limit; reading it whole lets the column check below report the line, not a csv internal error.
            csv.field_size_limit(2**31 - 1)
            return [row for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    except UnicodeDecodeError as e:
        raise GlueDataError(
            f"{path} is not UTF-8 text (byte {e.start}): give the GLUE tsv files as download_glue_data.py writes them"
        ) from None


def _column_indices(path: Path, header: Sequence[str], layout: FileLayout) -> dict[str, int]:
    header = [h.replace("\ufeff", "").strip() for h in header]
    wanted = {"text_a": layout.text_a, "text_b": layout.text_b, "label": layout.label, "guid": layout.guid}
    out = {}
    for role, column in wanted.items():
        if column is None:
            continue
        if column not in header:
            raise GlueDataError(
                f"{path}: no column {column!r} in the header {header}; is it a GLUE file of this "
                "task (or a test file given as train/dev)?"
            )
        out[role] = header.index(column)
    return out


def read_examples(paths: Sequence[Path], task: GlueTaskSpec, split: str, layout: FileLayout) -> list[InputExample]:
    """Read one split from one or more files (read in order), validating labels against the task's list."""
    examples: list[InputExample] = []
    skipped = 0
    for path in paths:
        rows = read_tsv(path)
        if layout.names is None:
            if not rows:
                raise GlueDataError(f"{path} is empty; expected a header row and data rows")
            header, rows, first_line = rows[0], rows[1:], 2
        else:
            header, first_line = list(layout.names), 1
        cols = _column_indices(path, header, layout)
        width = max(cols.values()) + 1
        for offset, row in enumerate(rows):
            line = first_line + offset
            if not row or row == [""]:
                continue  # blank line (a trailing newline)
            if len(row) < width:
                if task.skip_short_rows:
                    skipped += 1
                    continue
                raise GlueDataError(
                    f"{path}:{line}: {len(row)} tab-separated fields, expected at least {width}; "
                    "is the file truncated or not a GLUE tsv?"
                )
            examples.append(_make_example(path, line, row, cols, task, split, len(examples)))
    if skipped:
        print(
            f"{task.display_name} {split}: skipped {skipped} rows with missing fields "
            f"(known in the public {task.display_name} files)",
            file=sys.stderr,
        )
    return examples


def _make_example(
    path: Path, line: int, row: list[str], cols: dict[str, int], task: GlueTaskSpec, split: str, ordinal: int
) -> InputExample:
    label = row[cols["label"]].strip() if "label" in cols else None
    if label is not None:
        _check_label(path, line, label, task)
    row_id = row[cols["guid"]].strip() if "guid" in cols else str(ordinal)
    text_b = row[cols["text_b"]] if "text_b" in cols else None
    return InputExample(guid=f"{split}-{row_id}", text_a=row[cols["text_a"]], text_b=text_b, label=label)


def _check_label(path: Path, line: int, label: str, task: GlueTaskSpec) -> None:
    if task.is_regression:
        try:
            value = float(label)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise GlueDataError(f"{path}:{line}: score {label!r} is not a number")
    elif label not in task.labels:
        raise GlueDataError(f"{path}:{line}: label {label!r} is not one of {list(task.labels)} for {task.display_name}")


def get_train_examples(data_dir: str | Path, task: GlueTaskSpec) -> list[InputExample]:
    paths = _resolve(Path(data_dir), task, "train", task.train)
    return read_examples(paths, task, "train", task.layout)


def get_dev_examples(data_dir: str | Path, task: GlueTaskSpec) -> dict[str, list[InputExample]]:
    """{eval set name: examples}: one set ("dev"), or MNLI's two ("dev_matched", "dev_mismatched")."""
    return {
        name: read_examples(_resolve(Path(data_dir), task, name, alts), task, name, task.layout)
        for name, alts in task.dev.items()
    }


def get_test_examples(data_dir: str | Path, task: GlueTaskSpec) -> dict[str, list[InputExample]]:
    """{test set name: unlabeled examples}, guids carrying GLUE's submission index."""
    return {
        name: read_examples(_resolve(Path(data_dir), task, name, alts), task, name, task.test_layout)
        for name, alts in task.test.items()
    }


# ----------------------------------------------------------------------------------------------------------------
# Encoding: [CLS] A [SEP] (B [SEP]), token types 0 for [CLS] A [SEP] and 1 for B [SEP].


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Shorten the pair in place to max_length tokens in total, one token at a time from the end of the longer
    one (Google's rule: a long sentence loses more than a short one; on a tie B loses)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


@dataclass
class EncodedExamples:
    """Token ids of every example, unpadded, in one flat int32 array (a list of Python lists for MNLI's 393k
    pairs would take gigabytes).

    ids[offsets[i]:offsets[i+1]] is example i: [CLS] A [SEP] (B [SEP]); its first `len_a[i]` tokens ([CLS] A [SEP])
    have token type 0, the rest 1. labels: int64 class indices, float32 scores (regression), or None.
    """

    ids: np.ndarray
    offsets: np.ndarray
    len_a: np.ndarray
    labels: np.ndarray | None
    truncated: int  # how many examples lost tokens to max_seq_length

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids [L], token_type_ids [L]) of example i."""
        ids = self.ids[self.offsets[i] : self.offsets[i + 1]]
        types = np.zeros_like(ids)
        types[self.len_a[i] :] = 1
        return ids, types


def label_ids(examples: Sequence[InputExample], task: GlueTaskSpec) -> np.ndarray | None:
    """Class indices (int64) in the order of task.labels, or float32 scores for regression; None for test."""
    if any(e.label is None for e in examples):
        return None
    if task.is_regression:
        return np.array([float(e.label) for e in examples], dtype=np.float32)
    index = {name: i for i, name in enumerate(task.labels)}
    return np.array([index[e.label] for e in examples], dtype=np.int64)


def encode_examples(
    examples: Sequence[InputExample], tokenizer, max_seq_length: int, task: GlueTaskSpec
) -> EncodedExamples:
    """WordPiece every text in one bulk call, truncate each pair with truncate_seq_pair, add [CLS]/[SEP]."""
    if max_seq_length < 3:
        raise ValueError(f"--max_seq_length must be at least 3 ([CLS] A [SEP]), got {max_seq_length}")
    cls_id, sep_id = tokenizer.token_id("[CLS]"), tokenizer.token_id("[SEP]")
    ids_a = tokenizer.encode_batch([e.text_a for e in examples])
    is_pair = [e.text_b is not None for e in examples]
    ids_b_list = tokenizer.encode_batch([e.text_b for e in examples if e.text_b is not None])
    ids_b_iter = iter(ids_b_list)
    pieces, len_a, truncated = [], np.empty(len(examples), dtype=np.int32), 0
    for i, (a, pair) in enumerate(zip(ids_a, is_pair)):
        b = next(ids_b_iter) if pair else None
        before = len(a) + (len(b) if b else 0)
        if b is None:
            a = a[: max_seq_length - 2]
            seq = [cls_id, *a, sep_id]
        else:
            truncate_seq_pair(a, b, max_seq_length - 3)
            seq = [cls_id, *a, sep_id, *b, sep_id]
        truncated += len(a) + (len(b) if b else 0) < before
        len_a[i] = len(a) + 2
        pieces.append(np.asarray(seq, dtype=np.int32))
    offsets = np.zeros(len(examples) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in pieces])
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return EncodedExamples(ids, offsets, len_a, label_ids(examples, task), truncated)


# ----------------------------------------------------------------------------------------------------------------
# Metrics: GLUE's (its evaluation uses scikit-learn and scipy), written out in numpy: importing those two costs more
# than a short fine-tuning's evaluation (2-4 s a run_glue.py process); tests/test_glue.py compares them with both.


def compute_metrics(task: GlueTaskSpec, preds: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    """GLUE's metric(s) for a task. preds: class indices [N] (or scores [N] for STS-B); labels: same form.

    CoLA: Matthews correlation (mcc). STS-B: Pearson and Spearman correlation and their mean (corr); None where
    a correlation is undefined (constant predictions). MRPC, QQP: accuracy, F1 of the positive class "1" and their
    mean. Others: accuracy.
    """
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape:
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    if task.metric == "pearson_spearman":
        return pearson_and_spearman(preds, labels)
    acc = float((preds == labels).mean())
    if task.metric == "mcc":
        return {"mcc": matthews_corrcoef(labels, preds), "acc": acc}
    if task.metric == "acc_f1":
        f1 = f1_of_positive(labels, preds)
        return {"acc": acc, "f1": f1, "acc_and_f1": (acc + f1) / 2}
    return {"acc": acc}


def matthews_corrcoef(labels: np.ndarray, preds: np.ndarray) -> float:
    """Matthews' correlation of any number of classes (Gorodkin's R_K, as scikit-learn): from the confusion
    matrix C, (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)) with t, p the true and predicted counts per class, c the
    correct ones and s all; 0 where a factor of the denominator is 0 (one class only)."""
    classes, codes = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    true, pred = codes[: len(labels)], codes[len(labels) :]
    confusion = np.zeros((len(classes), len(classes)))
    np.add.at(confusion, (true, pred), 1)
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)
    c, s = np.trace(confusion), confusion.sum()
    denominator = (s * s - p @ p) * (s * s - t @ t)
    return float((c * s - t @ p) / np.sqrt(denominator)) if denominator > 0 else 0.0


def f1_of_positive(labels: np.ndarray, preds: np.ndarray) -> float:
    """F1 of class 1: 2 TP / (2 TP + FP + FN), 0 where class 1 is neither predicted nor true."""
    tp = float(((preds == 1) & (labels == 1)).sum())
    wrong = float(((preds == 1) != (labels == 1)).sum())  # FP + FN
    return 2 * tp / (2 * tp + wrong) if tp + wrong else 0.0


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of the ranks they span (Spearman's rule for ties)."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]  # where a run of equal values starts
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = ((starts + ends + 1) / 2)[np.cumsum(first) - 1]
    return ranks


def pearson_and_spearman(preds: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    if np.ptp(preds) == 0 or np.ptp(labels) == 0:  # correlation with a constant is undefined
        return {"pearson": None, "spearmanr": None, "corr": None}
    pearson = _pearson(preds.astype(np.float64), labels.astype(np.float64))
    spearman = _pearson(average_ranks(preds), average_ranks(labels))
    return {"pearson": pearson, "spearmanr": spearman, "corr": (pearson + spearman) / 2}


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x @ y) / np.sqrt((x @ x) * (y @ y)))
