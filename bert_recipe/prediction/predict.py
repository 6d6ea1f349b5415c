"""Prediction with a fine-tuned BERT: what every command that reads a model shares (inference.py,
extract_features.py, run_squad.py's and run_glue.py's prediction through the recipe, the Triton export), read top to
bottom:
1. the model files: `check_init_checkpoint`, `resolve_model_files` (the vocabulary in or beside a checkpoint),
   `check_model_fits`, `checkpoint_labels`;
2. batches: `pad_sequences` (unpadded sequences -> the model's inputs, padded to the longest),
   `length_sorted_batches`, `forward_batches` (the forward pass of every prediction);
3. the runtime of a command that only reads a model (`Runtime`, its flags `ReadRuntime`) and its in-order loop;
4. the two tasks as functions: `answer_questions` (windows over any context, QASettings' rules) and `classify`
   (`encode_pairs`: [CLS] A [SEP] B [SEP]), which return JSON-ready lists.
Library code: bad input raises (ValueError, cli.InputError); a script's main() turns it into one line.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from bert_recipe.io import cli
from bert_recipe.io.checkpoint_io import load_pt, read_state_dict
from bert_recipe.prediction.items import check_windows
from bert_recipe.tasks import squad, squad_answers
from bert_recipe.tasks.glue import truncate_seq_pair
from bert_recipe.training import precision_policy, train_step
from tokenization import BertTokenizer

# --------------------------------------------------------------------------------------------------------------
# 1. The model files


def check_init_checkpoint(args) -> None:
    """--init_checkpoint must exist (where a script may start from random weights, None with a --config_file):
    the first check of `resolve_model_files`, on its own for a script that names a missing checkpoint before it
    checks its other inputs and only then looks for the vocabulary (inference.py). `args`: anything with
    init_checkpoint, config_file and vocab_file (a parsed namespace, a fine-tuning configuration's model section)."""
    ckpt = None if args.init_checkpoint is None else Path(args.init_checkpoint)
    if ckpt is None and args.config_file is None:
        raise cli.InputError("give --init_checkpoint, or --config_file to start from random weights")
    if ckpt is not None and not ckpt.exists():
        raise cli.InputError(
            f"--init_checkpoint {ckpt} not found: give a ckpt_<step>.pt, a model.pt or a Hugging Face directory"
        )


def resolve_model_files(args) -> str:
    """The vocabulary file of the run: --vocab_file, by default a vocab.txt inside a checkpoint directory or beside
    a checkpoint file (or in the hf_model/ a fine-tuning script wrote beside its model.pt); returned, the flags
    stay as parsed. --init_checkpoint must exist (`check_init_checkpoint`), and so must --config_file when given.
    Also used by extract_features.py and inference.py."""
    check_init_checkpoint(args)
    ckpt = None if args.init_checkpoint is None else Path(args.init_checkpoint)
    vocab_file = args.vocab_file
    if vocab_file is None:
        folder = None if ckpt is None else ckpt if ckpt.is_dir() else ckpt.parent
        found = (
            []
            if folder is None
            else [p for p in (folder / "vocab.txt", folder / "hf_model" / "vocab.txt") if p.is_file()]
        )
        if not found:
            raise cli.InputError(f"no vocab.txt in or beside {ckpt or '--init_checkpoint'}: pass --vocab_file")
        vocab_file = str(found[0])
    if not Path(vocab_file).is_file():
        raise cli.InputError(f"--vocab_file {vocab_file} not found")
    if args.config_file is not None and not Path(args.config_file).is_file():
        raise cli.InputError(f"--config_file {args.config_file} not found")
    return vocab_file


def check_model_fits(config, vocab_size: int, vocab_file: str, max_seq_length: int) -> None:
    """A one-line InputError, before any work, when the input cannot fit the model: a vocabulary with more tokens
    than the model's vocab_size (its ids would index past the embedding table, an IndexError mid-run), or a
    --max_seq_length beyond its max_position_embeddings (the same, for positions)."""
    if vocab_size > config.vocab_size:
        raise cli.InputError(
            f"--vocab_file {vocab_file} has {vocab_size} tokens but the model only "
            f"{config.vocab_size}: pass the vocabulary the model was trained with (or the right "
            "--config_file)"
        )
    if max_seq_length > config.max_position_embeddings:
        raise cli.InputError(
            f"--max_seq_length {max_seq_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}: pass at most that"
        )


def checkpoint_labels(path: str | Path) -> tuple[int | None, list[str] | None]:
    """(number of classes, label names) a classification checkpoint records: run_glue.py's model.pt keeps
    "num_labels"/"labels", a Hugging Face directory id2label; else the classifier's rows."""
    path = Path(path)
    names = None
    if path.is_file() and path.suffix in (".pt", ".bin"):
        obj = load_pt(path)
        if isinstance(obj, dict) and isinstance(obj.get("labels"), list):
            names = [str(x) for x in obj["labels"]]
    state, config = read_state_dict(path)
    if names is None and config and isinstance(config.get("id2label"), dict):
        id2label = config["id2label"]
        names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    weight = state.get("classifier.weight")
    if weight is None:
        return None, names
    return int(weight.shape[0]), names


# --------------------------------------------------------------------------------------------------------------
# 2. Batches

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")  # what the model reads; the rest of a batch: labels


def pad_sequences(
    sequences: Sequence[tuple[np.ndarray, np.ndarray]], shape: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids and attention_mask, int64 [*shape, S], from unpadded (input_ids [L],
    token_type_ids [L]) sequences: each is zero-padded ([PAD] is id 0) to S, the longest of the batch, so that a
    batch of short sentences costs what short sentences cost. `shape`: (B,), or (B, C) for C choices an example
    (then `sequences` holds example 0's C choices, then example 1's, ...)."""
    lengths = np.array([len(ids) for ids, _ in sequences])
    longest = int(lengths.max())
    real = np.arange(longest)[None, :] < lengths[:, None]  # [N, S]: the real tokens, which come first in a row
    input_ids = np.zeros(real.shape, dtype=np.int64)
    token_type_ids = np.zeros_like(input_ids)
    input_ids[real] = np.concatenate([ids for ids, _ in sequences])  # row by row, as the mask is read
    token_type_ids[real] = np.concatenate([types for _, types in sequences])
    arrays = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": real.astype(np.int64)}
    return {name: torch.from_numpy(a.reshape(*shape, longest)) for name, a in arrays.items()}


def length_sorted_batches(lengths, batch_size: int) -> list[list[int]]:
    """Prediction batches of examples with similar lengths (longest first), so padding costs next to nothing."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


@torch.inference_mode()
def forward_batches(
    model: torch.nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    head_outputs: Callable[[Any], torch.Tensor],
    precision: str,
    device: torch.device,
) -> Iterator[tuple[np.ndarray, float]]:
    """The forward pass of every prediction (`predict`, inference.py): per batch of the batch vocabulary, (the
    head's outputs [B, ...] as float32 on the host, the forward's wall time in ms). Only the model's inputs are
    passed (no labels), so the model returns its head's outputs, which `head_outputs` picks from its output."""
    model.eval()
    for batch in batches:
        inputs = train_step.to_device({k: batch[k] for k in INPUT_KEYS}, device)
        tic = time.perf_counter()
        with precision_policy.autocast(precision, device):
            out = head_outputs(model(**inputs))
        out = out.float().cpu().numpy()  # the copy to the host synchronises the device
        yield out, (time.perf_counter() - tic) * 1000


# --------------------------------------------------------------------------------------------------------------
# 3. The runtime of a command that only reads a model


@dataclass(frozen=True)
class Runtime:
    """How the model runs over the inputs: `batch_size` windows (or sentences) per forward pass, on `device`
    (None: where the model's parameters are), under `precision`'s autocast; `progress` shows a bar on stderr when
    there are more than four batches."""

    batch_size: int = 8
    device: torch.device | str | None = None
    precision: str = "fp32"
    progress: bool = False


@dataclass(frozen=True)
class ReadRuntime:
    """The "runtime" section of the commands that only read a model (inference.py, extract_features.py): what a
    Runtime is made of, plus --no_cuda. Precision defaults to fp32 there (precision_policy.READ): the same command
    gives the same outputs on every machine. A command's section derives from it for its own batch size and help."""

    batch_size: int = 8
    """windows (or sentences) per forward pass"""
    precision: str = precision_policy.flag(precision_policy.HELP[precision_policy.READ])
    no_cuda: bool = False
    """run on the CPU even when a GPU is present"""
    disable_progress_bar: bool = False
    """no progress bar for long inputs"""


def _predict(
    model,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    head: Callable[[Any], torch.Tensor],
    runtime: Runtime,
    unit: str,
) -> list[np.ndarray]:
    """The head's output for every unpadded (input_ids [L], token_type_ids [L]) sequence, in input order:
    consecutive batches of runtime.batch_size, each padded to its longest (pad_sequences), through the
    fine-tuning recipe's forward pass (forward_batches)."""
    device = next(model.parameters()).device if runtime.device is None else torch.device(runtime.device)
    size = runtime.batch_size
    chunks = (sequences[lo : lo + size] for lo in range(0, len(sequences), size))
    batches = (pad_sequences(chunk, (len(chunk),)) for chunk in chunks)
    outputs: list[np.ndarray] = []
    with _progress_bar(len(sequences), size, runtime.progress, unit) as bar:
        for out, _ in forward_batches(model, batches, head, runtime.precision, device):
            outputs.extend(out)
            bar.update(len(out))
    return outputs


def _progress_bar(total: int, batch_size: int, enabled: bool, unit: str):
    """A tqdm bar on stderr for more than four batches of work, else one that shows nothing."""
    return tqdm(
        total=total,
        unit=unit,
        desc="inference.py",
        file=sys.stderr,
        mininterval=1.0,
        disable=not enabled or total <= 4 * batch_size,
    )


# --------------------------------------------------------------------------------------------------------------
# 4. The two tasks, as functions


def answer_questions(
    model,
    tokenizer: BertTokenizer,
    items: Sequence[Mapping[str, Any]],
    settings: squad_answers.QASettings = squad_answers.QASettings(),
    runtime: Runtime = Runtime(),
    *,
    max_windows: int = 0,
    how_to_raise: str = "raise max_windows (0: no limit)",
) -> list[dict[str, Any]]:
    """Answer [{"id"?, "question", "context"}, ...] with a BertForQuestionAnswering (or any module with the same
    forward(input_ids, token_type_ids, attention_mask) -> (start [B,S], end [B,S])), cutting each context into
    windows and reading the answers back as `settings` say.

    Returns one dict per item: {"id", "question", "answer", "probability", "nbest": [{text, probability,
    start_logit, end_logit}, ...]}, plus "null_score_diff" for v2.0 (the answer is "" when it exceeds the
    threshold).

    max_windows > 0 refuses (ValueError, before any forward pass) an item whose context needs more windows;
    `how_to_raise` ends that message.
    """
    examples = squad.examples_from_qa_pairs(items)
    features = settings.features(examples, tokenizer)
    if max_windows:
        windows = np.bincount([f.example_index for f in features], minlength=len(examples))
        worst = int(windows.argmax())
        check_windows(
            int(windows[worst]),
            max_windows,
            f"item {worst} (id {examples[worst].qas_id!r}, context of "
            f"{len(items[worst]['context']):,} characters at max_seq_length {settings.max_seq_length}, "
            f"doc_stride {settings.doc_stride})",
            how_to_raise,
        )
    lengths = [sum(f.input_mask) for f in features]  # a window's real tokens; features are padded to S
    logits = _predict(
        model,
        [(f.input_ids[:n], f.segment_ids[:n]) for f, n in zip(features, lengths)],
        _start_and_end,
        runtime,
        "windows",
    )
    results = {f.unique_id: squad_answers.RawResult(f.unique_id, out[0], out[1]) for f, out in zip(features, logits)}
    return settings.answers(examples, features, results, tokenizer.do_lower_case)


def _start_and_end(output) -> torch.Tensor:
    """[B, 2, S]: the start and end logits of a QA model's output (a QuestionAnsweringOutput or a plain pair)."""
    return torch.stack([output[0], output[1]], dim=1)


def encode_pairs(
    tokenizer: BertTokenizer, items: Sequence[Mapping[str, Any]], max_seq_length: int
) -> list[tuple[list[int], list[int]]]:
    """[CLS] A [SEP] (B [SEP]) ids and token types per item, pairs cut longest-first to max_seq_length."""
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    ids_a = tokenizer.encode_batch([item["text_a"] for item in items])
    with_b = [i for i, item in enumerate(items) if item.get("text_b") is not None]
    ids_b = dict(zip(with_b, tokenizer.encode_batch([items[i]["text_b"] for i in with_b])))
    encoded = []
    for i, a in enumerate(ids_a):
        b = ids_b.get(i)
        if b is None:
            a = a[: max_seq_length - 2]
            encoded.append(([cls_id, *a, sep_id], [0] * (len(a) + 2)))
            continue
        truncate_seq_pair(a, b, max_seq_length - 3)
        encoded.append(([cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)))
    return encoded


def classify(
    model,
    tokenizer: BertTokenizer,
    items: Sequence[Mapping[str, Any]],
    runtime: Runtime = Runtime(),
    *,
    max_seq_length: int = 128,
    labels: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Classify [{"id"?, "text_a", "text_b"?}, ...] with a BertForSequenceClassification, each item cut to
    max_seq_length tokens.

    Returns {"id", "label", "probability", "probabilities": {label: p}} per item, or {"id", "score"} for a
    regression model (one output). `labels` names the classes (default "0", "1", ...).
    """
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("text_a"), str):
            raise ValueError(f"item {i} needs a string 'text_a' field (and optionally 'text_b'), got {item!r:.200}")
    num_labels = model.num_labels
    labels = list(labels) if labels else [str(i) for i in range(num_labels)]
    if num_labels > 1 and len(labels) != num_labels:
        raise ValueError(f"{len(labels)} label names for a model with {num_labels} outputs")
    logits = _predict(model, encode_pairs(tokenizer, items, max_seq_length), _class_logits, runtime, "items")
    return [
        _classification_record(item, i, torch.from_numpy(row), labels)
        for i, (item, row) in enumerate(zip(items, logits))
    ]


def _class_logits(output) -> torch.Tensor:
    """[B, num_labels]: the logits of a classification model's output."""
    return output[0]


def _classification_record(item: Mapping, index: int, logits: torch.Tensor, labels: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = {"id": str(item.get("id", index))}
    if logits.numel() == 1:
        record["score"] = float(logits[0])
        return record
    probs = torch.softmax(logits, dim=-1).tolist()
    best = int(np.argmax(probs))
    record.update(
        label=labels[best], probability=probs[best], probabilities={name: p for name, p in zip(labels, probs)}
    )
    return record
