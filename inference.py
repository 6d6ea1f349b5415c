"""Answer questions about a context, or classify sentences, with a fine-tuned BERT; prints JSON.

    python inference.py --init_checkpoint results/SQuAD/hf_model --question "Who ..." --context "..."
    python inference.py --init_checkpoint results/SQuAD/model.pt --vocab_file vocab.txt --input_file q.jsonl
    python inference.py --mode classify --init_checkpoint results/MRPC/hf_model --text_a "..." --text_b "..."

Question answering (--mode qa, the default) covers a context of any length with overlapping windows
(--max_seq_length / --doc_stride; the original truncated it), returns the n-best answers with probabilities and,
for SQuAD 2.0 models (--version_2_with_negative), the empty answer when the null score wins. Classification
(--mode classify) runs a GLUE model (run_glue.py's model.pt or hf_model/) on single sentences or pairs and prints
the label with its probability (or the score of a regression model such as STS-B).

--input_file: a JSON list or a JSON-lines file of {"id"?, "question", "context"} (qa) or {"id"?, "text_a",
"text_b"?} (classify) objects, or, for qa, a SQuAD file. The device is the GPU when there is one (--no_cuda to
stay on the CPU); --fp16/--bf16 run the model under autocast.

Checked before any model work, each refusal one line `inference.py: error: ...` and exit 1 (--debug: the
traceback): an empty or blank question, context, text_a or text_b; text that is not UTF-8 (an --input_file names
its byte offset and line, a command-line argument its byte offset); a context (or text_a/text_b) over
--max_context_chars, a question over --max_question_chars, a question whose context needs more than --max_windows
windows (0 turns a limit off); an --output_file that is a folder or cannot be written. Long inputs show a progress
bar on stderr (--disable_progress_bar hides it).

Python callers use `answer_questions(model, tokenizer, items, settings, runtime)` (settings: tasks.squad's
QASettings) and `classify(model, tokenizer, items, runtime, ...)`, which return the same JSON-ready lists.

What is the fine-tuning recipe's is taken from it (finetuning/recipe.py): the model files (`check_init_checkpoint`,
`resolve_model_files`, `check_model_fits`), the padding of a batch (`pad_sequences`) and the forward pass of
prediction (`forward_batches`); the one-line errors are every script's (cli.script_errors). Unlike run_squad.py's
length-sorted prediction, the batches here are consecutive, so windows and sentences reach the model in input order.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from bert_recipe.training import precision_policy
from bert_recipe.io import atomic_io
from bert_recipe.io import cli
from bert_recipe.finetuning import recipe
from bert_recipe.io.checkpoint_io import load_pretrained, load_pt, read_state_dict
from modeling import BertForQuestionAnswering, BertForSequenceClassification
from bert_recipe.finetuning.tasks import squad
from bert_recipe.finetuning.tasks.items import (CLI_MAX_CONTEXT_CHARS, CLI_MAX_QUESTION_CHARS, CLI_MAX_WINDOWS,
    check_text, check_windows, read_items)
from tokenization import BertTokenizer, vocab_is_uncased

# ----------------------------------------------------------------------------------------------------------------
# The two tasks, as functions


@dataclass(frozen=True)
class Runtime:
    """How the model runs over the inputs: `batch_size` windows (or sentences) per forward pass, on `device`
    (None: where the model's parameters are), under `precision`'s autocast; `progress` shows a bar on stderr when
    there are more than four batches."""

    batch_size: int = 8
    device: torch.device | str | None = None
    precision: str = "fp32"
    progress: bool = False


def add_runtime_arguments(parser: argparse.ArgumentParser, batch_size: int, batch_help: str,
                          progress_help: str) -> None:
    """The "runtime" flags of the commands that only read a model (this script, extract_features.py): what a
    Runtime is made of, plus --no_cuda and --debug. Precision defaults to fp32 there (precision.READ): the same
    command gives the same outputs on every machine."""
    g = parser.add_argument_group("runtime")
    g.add_argument("--batch_size", type=int, default=batch_size, help=batch_help)
    precision_policy.add_arguments(g, help_text=precision_policy.HELP[precision_policy.READ])
    g.add_argument("--no_cuda", action="store_true", help="run on the CPU even when a GPU is present")
    g.add_argument("--disable_progress_bar", action="store_true", help=progress_help)
    cli.add_debug_argument(g)


def answer_questions(model, tokenizer: BertTokenizer, items: Sequence[Mapping[str, Any]],
                     settings: squad.QASettings = squad.QASettings(), runtime: Runtime = Runtime(), *,
                     max_windows: int = 0, how_to_raise: str = "raise max_windows (0: no limit)"
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
        check_windows(int(windows[worst]), max_windows, f"item {worst} (id {examples[worst].qas_id!r}, context of "
                      f"{len(items[worst]['context']):,} characters at max_seq_length {settings.max_seq_length}, "
                      f"doc_stride {settings.doc_stride})", how_to_raise)
    lengths = [sum(f.input_mask) for f in features]  # a window's real tokens; features are padded to S
    logits = _predict(model, [(f.input_ids[:n], f.segment_ids[:n]) for f, n in zip(features, lengths)],
                      _start_and_end, runtime, "windows")
    results = {f.unique_id: squad.RawResult(f.unique_id, out[0], out[1]) for f, out in zip(features, logits)}
    return settings.answers(examples, features, results, tokenizer.do_lower_case)


def _start_and_end(output) -> torch.Tensor:
    """[B, 2, S]: the start and end logits of a QA model's output (a QuestionAnsweringOutput or a plain pair)."""
    return torch.stack([output[0], output[1]], dim=1)


def _predict(model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], head: Callable[[Any], torch.Tensor],
             runtime: Runtime, unit: str) -> list[np.ndarray]:
    """The head's output for every unpadded (input_ids [L], token_type_ids [L]) sequence, in input order:
    consecutive batches of runtime.batch_size, each padded to its longest (finetuning.pad_sequences), through the
    fine-tuning recipe's forward pass (finetuning.forward_batches)."""
    device = next(model.parameters()).device if runtime.device is None else torch.device(runtime.device)
    size = runtime.batch_size
    chunks = (sequences[lo:lo + size] for lo in range(0, len(sequences), size))
    batches = (recipe.pad_sequences(chunk, (len(chunk),)) for chunk in chunks)
    outputs: list[np.ndarray] = []
    with _progress_bar(len(sequences), size, runtime.progress, unit) as bar:
        for out, _ in recipe.forward_batches(model, batches, head, runtime.precision, device):
            outputs.extend(out)
            bar.update(len(out))
    return outputs


def _progress_bar(total: int, batch_size: int, enabled: bool, unit: str):
    """A tqdm bar on stderr for more than four batches of work, else one that shows nothing."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc="inference.py", file=sys.stderr, mininterval=1.0,
                disable=not enabled or total <= 4 * batch_size)


def encode_pairs(tokenizer: BertTokenizer, items: Sequence[Mapping[str, Any]], max_seq_length: int
                 ) -> list[tuple[list[int], list[int]]]:
    """[CLS] A [SEP] (B [SEP]) ids and token types per item, pairs cut longest-first to max_seq_length."""
    from bert_recipe.finetuning.tasks.glue import truncate_seq_pair

    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    ids_a = tokenizer.encode_batch([item["text_a"] for item in items])
    with_b = [i for i, item in enumerate(items) if item.get("text_b") is not None]
    ids_b = dict(zip(with_b, tokenizer.encode_batch([items[i]["text_b"] for i in with_b])))
    encoded = []
    for i, a in enumerate(ids_a):
        b = ids_b.get(i)
        if b is None:
            a = a[:max_seq_length - 2]
            encoded.append(([cls_id, *a, sep_id], [0] * (len(a) + 2)))
            continue
        truncate_seq_pair(a, b, max_seq_length - 3)
        encoded.append(([cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)))
    return encoded


def classify(model, tokenizer: BertTokenizer, items: Sequence[Mapping[str, Any]], runtime: Runtime = Runtime(), *,
             max_seq_length: int = 128, labels: Sequence[str] | None = None) -> list[dict[str, Any]]:
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
    return [_classification_record(item, i, torch.from_numpy(row), labels)
            for i, (item, row) in enumerate(zip(items, logits))]


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
    record.update(label=labels[best], probability=probs[best],
                  probabilities={name: p for name, p in zip(labels, probs)})
    return record


# ----------------------------------------------------------------------------------------------------------------
# Loading models and inputs


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


def load_model(args, log):
    """The task model; a checkpoint without the task's head is refused (its answers would be random)."""
    config = args.config_file
    if args.mode == "qa":
        model, report = load_pretrained(BertForQuestionAnswering, args.init_checkpoint, config=config)
        head = "qa_outputs"
    else:
        num_labels, names = checkpoint_labels(args.init_checkpoint)
        if num_labels is None:
            raise cli.InputError(f"{args.init_checkpoint} has no classifier head: fine-tune it with "
                             "run_glue.py first")
        model, report = load_pretrained(BertForSequenceClassification, args.init_checkpoint, config=config,
                                        num_labels=num_labels)
        model.label_names = names
        head = "classifier"
    for line in report.lines():
        log(f"from_pretrained({type(model).__name__}, {args.init_checkpoint}): {line}")
    if report.fresh_head(f"{head}."):
        task = "run_squad.py" if args.mode == "qa" else "run_glue.py"
        raise cli.InputError(f"{args.init_checkpoint} has no {head} head (it would answer at random): "
                         f"fine-tune it with {task} first")
    return model


LIMIT_HINT = "raise it with --{name} (0 = no limit)"


def items_from_args(args) -> list[dict]:
    """The items to answer or classify, each checked (UTF-8, not empty, within the character limits) before any
    model work; cli.InputError (one line) for the first that is not."""
    if args.input_file:
        try:
            items = read_items(args.input_file)
        except (OSError, ValueError) as e:  # a missing file, bad JSON, bytes that are not UTF-8
            raise cli.InputError(f"--input_file: {e}") from None
        labels = [f"item {i} of --input_file {args.input_file}: the {{}}" for i in range(len(items))]
    elif args.mode == "qa":
        if args.question is None or args.context is None:
            raise cli.InputError("give --question and --context, or --input_file")
        items, labels = [{"id": "0", "question": args.question, "context": args.context}], ["--{}"]
    else:
        if args.text_a is None:
            raise cli.InputError("give --text_a (and --text_b for pairs), or --input_file")
        items, labels = [{"id": "0", "text_a": args.text_a, "text_b": args.text_b}], ["--{}"]
    fields = (("question", args.max_question_chars, "max_question_chars"),
              ("context", args.max_context_chars, "max_context_chars")) if args.mode == "qa" else \
        (("text_a", args.max_context_chars, "max_context_chars"), ("text_b", args.max_context_chars,
                                                                   "max_context_chars"))
    try:
        for item, label in zip(items, labels):
            for name, limit, limit_name in fields:
                check_text(item.get(name), label.format(name), limit, limit_name, LIMIT_HINT)
    except ValueError as e:
        raise cli.InputError(str(e)) from None
    return items


def check_output_file(path: str) -> None:
    """Refuse, before any work, an --output_file that is a folder or whose folder cannot take a new file (the
    JSON is written to a temporary file there and renamed)."""
    target = Path(path)
    if target.is_dir():
        raise cli.InputError(f"--output_file {path} is a folder: name a file")
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise cli.InputError(f"--output_file {path}: {folder} {what}")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{target.name}.", suffix=".check"):
            pass
    except OSError as e:
        raise cli.InputError(f"--output_file {path}: cannot write in {folder} ({e.strerror})") from None


# ----------------------------------------------------------------------------------------------------------------
# Main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=("qa", "classify"), default="qa",
                   help="qa: span answers (BertForQuestionAnswering); classify: labels (BertForSequenceClassification)")
    g = p.add_argument_group("model")
    g.add_argument("--init_checkpoint", required=True,
                   help="a fine-tuned model.pt, an NVIDIA checkpoint or a Hugging Face directory")
    g.add_argument("--config_file", default=None, help="bert_config.json; default: the checkpoint's own")
    g.add_argument("--vocab_file", default=None,
                   help="vocab.txt; default: vocab.txt in or beside the checkpoint (or in the hf_model/ beside it)")
    g.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction, default=None,
                   help="lower-case the input; default: yes when the vocabulary has no capital letters")
    g = p.add_argument_group("input")
    g.add_argument("--question", default=None, help="qa: the question")
    g.add_argument("--context", default=None, help="qa: the text that holds the answer (any length)")
    g.add_argument("--text_a", default=None, help="classify: the sentence (or the first of a pair)")
    g.add_argument("--text_b", default=None, help="classify: the second sentence of a pair")
    g.add_argument("--input_file", default=None, help="a JSON list, JSON lines, or (qa) a SQuAD file")
    g.add_argument("--output_file", default=None, help="also write the JSON here")
    g = p.add_argument_group("limits (checked before any model work; 0 = no limit)")
    g.add_argument("--max_context_chars", type=int, default=CLI_MAX_CONTEXT_CHARS,
                   help="refuse a context (qa) or text_a/text_b (classify) longer than this many characters")
    g.add_argument("--max_question_chars", type=int, default=CLI_MAX_QUESTION_CHARS,
                   help="qa: refuse a question longer than this many characters")
    g.add_argument("--max_windows", type=int, default=CLI_MAX_WINDOWS,
                   help="qa: refuse a question whose context needs more windows than this")
    g = p.add_argument_group("question answering")
    g.add_argument("--max_seq_length", type=int, default=None,
                   help="tokens per window (default 384 qa, 128 classify, at most the model's positions)")
    g.add_argument("--doc_stride", type=int, default=128, help="tokens between the starts of consecutive windows")
    g.add_argument("--max_query_length", type=int, default=64, help="questions are cut to this many tokens")
    g.add_argument("--n_best_size", type=int, default=20, help="answers listed per question")
    g.add_argument("--max_answer_length", type=int, default=30, help="longest answer, in WordPiece tokens")
    g.add_argument("--version_2_with_negative", action="store_true", help="the model may answer \"\" (SQuAD 2.0)")
    g.add_argument("--null_score_diff_threshold", type=float, default=0.0,
                   help="v2.0: answer \"\" when null score - best span score exceeds this")
    g = p.add_argument_group("classification")
    g.add_argument("--labels", default=None,
                   help="comma-separated class names; default: those the checkpoint records, else 0, 1, ...")
    add_runtime_arguments(p, 8, "windows (or sentences) per forward pass", "no progress bar for long inputs")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    """Run inference.py; an expected error (bad input, an unusable checkpoint, an unwritable output) becomes
    SystemExit("inference.py: error: <one line>"), which Python prints to stderr with exit status 1 (--debug: the
    traceback), as every script's (cli.script_errors)."""
    with cli.script_errors("inference.py", argv):
        return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> list[dict]:
    # A missing checkpoint is named first; the vocabulary is looked for once the inputs have passed their checks.
    recipe.check_init_checkpoint(args)
    for name in ("batch_size", "doc_stride", "n_best_size", "max_answer_length"):
        if getattr(args, name) < 1:
            raise cli.InputError(f"--{name} must be positive, got {getattr(args, name)}")
    for name in ("max_context_chars", "max_question_chars", "max_windows"):
        if getattr(args, name) < 0:
            raise cli.InputError(f"--{name} must be >= 0 (0: no limit), got {getattr(args, name)}")
    items = items_from_args(args)
    if args.output_file:
        check_output_file(args.output_file)
    vocab_file = recipe.resolve_model_files(args)  # --vocab_file, or in or beside the checkpoint (its hf_model/)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  (stdout carries the JSON only)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.no_cuda else "cpu")
    precision = precision_policy.setup(args.precision, device, "inference.py", precision_policy.READ).name
    tokenizer = BertTokenizer(vocab_file, do_lower_case=True)
    do_lower_case = vocab_is_uncased(tokenizer.vocab) if args.do_lower_case is None else args.do_lower_case
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case)
    model = load_model(args, log).to(device)
    default_length = 384 if args.mode == "qa" else 128
    max_seq_length = args.max_seq_length or min(default_length, model.config.max_position_embeddings)
    recipe.check_model_fits(model.config, len(tokenizer), vocab_file, max_seq_length)
    runtime = Runtime(args.batch_size, device, precision, progress=not args.disable_progress_bar)
    if args.mode == "qa":
        if max_seq_length < args.max_query_length + 4:
            raise cli.InputError(f"--max_seq_length {max_seq_length} must be at least --max_query_length "
                                 f"{args.max_query_length} + 4")
        out = answer_questions(model, tokenizer, items, squad.QASettings.from_args(args, max_seq_length=max_seq_length),
                               runtime, max_windows=args.max_windows, how_to_raise=LIMIT_HINT)
    else:
        labels = args.labels.split(",") if args.labels else model.label_names
        out = classify(model, tokenizer, items, runtime, max_seq_length=max_seq_length, labels=labels)
    text = json.dumps(out, indent=2, ensure_ascii=False)
    if args.output_file:
        atomic_io.atomic_write_text(args.output_file, text + "\n")
    print(text, flush=True)
    return out


if __name__ == "__main__":
    main()
