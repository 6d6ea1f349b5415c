"""SWAG (Situations With Adversarial Generations): the CSV reader and the multiple-choice encoding for BERT.

The files are those of the SWAG release (github.com/rowanz/swagaf, data/train.csv, val.csv, test.csv): comma-
separated with standard CSV quoting, a header row

    ,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label

(the first column, unnamed, is the row index; test.csv has no label column). `sent1` is the context, `sent2` the
first words of the next sentence, `ending0..3` the four ways it may go on, `label` the index of the right one.
Columns are picked by header name, so files with fewer or reordered columns (or more endings) read the same.

Each choice j of an example becomes one sequence: [CLS] sent1 [SEP] sent2 ending_j [SEP], token types 0 for
[CLS] sent1 [SEP] and 1 for the rest; a pair longer than max_seq_length loses tokens from the end of its longer
part (GLUE's truncate_seq_pair), as in Google's and NVIDIA's run_swag.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bert_recipe.io.cli import InputError
from bert_recipe.tasks.glue import EncodedExamples, truncate_seq_pair

SPLIT_FILES = {"train": "train.csv", "val": "val.csv", "test": "test.csv"}
_ENDING = re.compile(r"^ending(\d+)$")


@dataclass(frozen=True)
class SwagExample:
    """One row: guid `<split>-<index>` (the file's unnamed index column, else the row number), the context
    (sent1), the start of the next sentence (sent2), the endings, and the right ending's index (None in test)."""

    guid: str
    context: str
    start_ending: str
    endings: tuple[str, ...]
    label: int | None


class SwagDataError(InputError):
    """A missing or malformed SWAG file; the one-line message names the file and what to do."""


def read_swag_examples(path: str | Path, split: str | None = None, require_labels: bool = True) -> list[SwagExample]:
    """Every row of a SWAG csv file. `require_labels`: a file without a label column (test.csv) is an error."""
    path = Path(path)
    split = split or path.stem
    if not path.is_file():
        raise SwagDataError(f"SWAG file {path} not found; is --data_dir the folder with SWAG's train.csv and val.csv?")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as e:
        raise SwagDataError(f"{path} is not UTF-8 text (byte {e.start}): give SWAG's csv files") from None
    if not rows:
        raise SwagDataError(f"{path} is empty; expected a header row (sent1, sent2, ending0, ...) and data rows")
    header = [h.strip() for h in rows[0]]
    endings = sorted((int(m.group(1)), i) for i, h in enumerate(header) if (m := _ENDING.match(h)))
    missing = [name for name in ("sent1", "sent2") if name not in header]
    if missing or len(endings) < 2 or [n for n, _ in endings] != list(range(len(endings))):
        raise SwagDataError(
            f"{path}: the header {header} needs sent1, sent2 and ending0, ending1, ... columns; is it a SWAG csv file?"
        )
    if require_labels and "label" not in header:
        raise SwagDataError(f"{path}: no label column (a test file?); training and evaluation need labelled rows")
    col = {name: header.index(name) for name in ("sent1", "sent2")}
    label_col = header.index("label") if "label" in header else None
    index_col = 0 if header[0] == "" else None  # pandas' unnamed index column, as in the SWAG release
    width = max([*col.values(), *(i for _, i in endings), label_col or 0]) + 1
    examples = []
    for line, row in enumerate(rows[1:], 2):
        if not row or row == [""]:
            continue
        if len(row) < width:
            raise SwagDataError(f"{path}:{line}: {len(row)} fields, expected {len(header)}; is the file truncated?")
        label = None
        if label_col is not None:
            value = row[label_col].strip()
            if not value.isdigit() or int(value) >= len(endings):
                raise SwagDataError(f"{path}:{line}: label {value!r} is not an ending index 0..{len(endings) - 1}")
            label = int(value)
        row_id = row[index_col].strip() if index_col is not None and row[index_col].strip() else str(len(examples))
        examples.append(
            SwagExample(
                guid=f"{split}-{row_id}",
                context=row[col["sent1"]],
                start_ending=row[col["sent2"]],
                endings=tuple(row[i] for _, i in endings),
                label=label,
            )
        )
    return examples


def get_examples(data_dir: str | Path, split: str) -> list[SwagExample]:
    """train, val (labelled) or test (labels optional) from SWAG's folder."""
    return read_swag_examples(Path(data_dir) / SPLIT_FILES[split], split, require_labels=split != "test")


@dataclass
class EncodedChoices:
    """Every choice of every example as one unpadded sequence: sequences.example(i * num_choices + j) is the
    (input_ids, token_type_ids) of example i's choice j. labels: int64 [N], or None for unlabelled examples."""

    sequences: EncodedExamples
    num_choices: int
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(self.sequences) // self.num_choices

    @property
    def lengths(self) -> np.ndarray:
        """The longest choice of each example [N] (what a batch of the example is padded to)."""
        return self.sequences.lengths.reshape(-1, self.num_choices).max(axis=1)

    @property
    def truncated(self) -> int:
        return self.sequences.truncated

    def example(self, i: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.sequences.example(i * self.num_choices + j) for j in range(self.num_choices)]


def encode_examples(examples: Sequence[SwagExample], tokenizer, max_seq_length: int) -> EncodedChoices:
    """WordPiece every text in bulk calls; choice j is [CLS] context [SEP] start_ending ending_j [SEP]."""
    if max_seq_length < 3:
        raise ValueError(f"--max_seq_length must be at least 3 ([CLS] A [SEP] B [SEP]), got {max_seq_length}")
    if not examples:
        raise ValueError("no SWAG examples to encode")
    num_choices = len(examples[0].endings)
    if any(len(e.endings) != num_choices for e in examples):
        raise ValueError(f"every example needs the same number of endings ({num_choices})")
    cls_id, sep_id = tokenizer.token_id("[CLS]"), tokenizer.token_id("[SEP]")
    contexts = tokenizer.encode_batch([e.context for e in examples])
    starts = tokenizer.encode_batch([e.start_ending for e in examples])
    endings = tokenizer.encode_batch([ending for e in examples for ending in e.endings])
    pieces, len_a, truncated = [], [], 0
    for i in range(len(examples)):
        for j in range(num_choices):
            a, b = list(contexts[i]), starts[i] + endings[i * num_choices + j]
            before = len(a) + len(b)
            truncate_seq_pair(a, b, max_seq_length - 3)
            truncated += len(a) + len(b) < before
            len_a.append(len(a) + 2)
            pieces.append(np.asarray([cls_id, *a, sep_id, *b, sep_id], dtype=np.int32))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in pieces])
    sequences = EncodedExamples(np.concatenate(pieces), offsets, np.asarray(len_a, dtype=np.int32), None, truncated)
    labels = None
    if all(e.label is not None for e in examples):
        labels = np.array([e.label for e in examples], dtype=np.int64)
    return EncodedChoices(sequences, num_choices, labels)


def accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    """The share of examples whose highest-scoring choice is the right one (SWAG's metric)."""
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape:
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    return float((preds == labels).mean())
