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

This file is the command: its flags, the checks of its inputs, the model it loads. What it runs is
bert_recipe/prediction/predict.py's `answer_questions` and `classify` (Python callers use them directly), whose
batches are consecutive, so windows and sentences reach the model in input order; the one-line errors are every
script's (cli.script_errors).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from bert_recipe.io import atomic_io, cli
from bert_recipe.io.checkpoint_io import load_pretrained
from bert_recipe.prediction import predict
from bert_recipe.prediction.items import CLI_LIMITS, check_text, read_items
from bert_recipe.tasks import squad_answers
from bert_recipe.training import precision_policy
from modeling import BertForQuestionAnswering, BertForSequenceClassification
from tokenization import BertTokenizer, vocab_is_uncased

# ----------------------------------------------------------------------------------------------------------------
# The two tasks, as functions


# ----------------------------------------------------------------------------------------------------------------
# Loading models and inputs


def load_model(args, log):
    """The task model; a checkpoint without the task's head is refused (its answers would be random)."""
    config = args.config_file
    if args.mode == "qa":
        model, report = load_pretrained(BertForQuestionAnswering, args.init_checkpoint, config=config)
        head = "qa_outputs"
    else:
        num_labels, names = predict.checkpoint_labels(args.init_checkpoint)
        if num_labels is None:
            raise cli.InputError(f"{args.init_checkpoint} has no classifier head: fine-tune it with run_glue.py first")
        model, report = load_pretrained(
            BertForSequenceClassification, args.init_checkpoint, config=config, num_labels=num_labels
        )
        model.label_names = names
        head = "classifier"
    for line in report.lines():
        log(f"from_pretrained({type(model).__name__}, {args.init_checkpoint}): {line}")
    if report.fresh_head(f"{head}."):
        task = "run_squad.py" if args.mode == "qa" else "run_glue.py"
        raise cli.InputError(
            f"{args.init_checkpoint} has no {head} head (it would answer at random): fine-tune it with {task} first"
        )
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
    fields = (
        (
            ("question", args.max_question_chars, "max_question_chars"),
            ("context", args.max_context_chars, "max_context_chars"),
        )
        if args.mode == "qa"
        else (
            ("text_a", args.max_context_chars, "max_context_chars"),
            ("text_b", args.max_context_chars, "max_context_chars"),
        )
    )
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
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--mode",
        choices=("qa", "classify"),
        default="qa",
        help="qa: span answers (BertForQuestionAnswering); classify: labels (BertForSequenceClassification)",
    )
    g = p.add_argument_group("model")
    g.add_argument(
        "--init_checkpoint",
        required=True,
        help="a fine-tuned model.pt, an NVIDIA checkpoint or a Hugging Face directory",
    )
    g.add_argument("--config_file", default=None, help="bert_config.json; default: the checkpoint's own")
    g.add_argument(
        "--vocab_file",
        default=None,
        help="vocab.txt; default: vocab.txt in or beside the checkpoint (or in the hf_model/ beside it)",
    )
    g.add_argument(
        "--do_lower_case",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower-case the input; default: yes when the vocabulary has no capital letters",
    )
    g = p.add_argument_group("input")
    g.add_argument("--question", default=None, help="qa: the question")
    g.add_argument("--context", default=None, help="qa: the text that holds the answer (any length)")
    g.add_argument("--text_a", default=None, help="classify: the sentence (or the first of a pair)")
    g.add_argument("--text_b", default=None, help="classify: the second sentence of a pair")
    g.add_argument("--input_file", default=None, help="a JSON list, JSON lines, or (qa) a SQuAD file")
    g.add_argument("--output_file", default=None, help="also write the JSON here")
    CLI_LIMITS.add_arguments(p.add_argument_group("limits (checked before any model work; 0 = no limit)"))
    g = p.add_argument_group("question answering")
    g.add_argument(
        "--max_seq_length",
        type=int,
        default=None,
        help="tokens per window (default 384 qa, 128 classify, at most the model's positions)",
    )
    squad_answers.QASettings.add_arguments(g)
    g = p.add_argument_group("classification")
    g.add_argument(
        "--labels",
        default=None,
        help="comma-separated class names; default: those the checkpoint records, else 0, 1, ...",
    )
    predict.add_runtime_arguments(p, 8, "windows (or sentences) per forward pass", "no progress bar for long inputs")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    """Run inference.py; an expected error (bad input, an unusable checkpoint, an unwritable output) becomes
    SystemExit("inference.py: error: <one line>"), which Python prints to stderr with exit status 1 (--debug: the
    traceback), as every script's (cli.script_errors)."""
    with cli.script_errors("inference.py", argv):
        return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> list[dict]:
    # A missing checkpoint is named first; the vocabulary is looked for once the inputs have passed their checks.
    predict.check_init_checkpoint(args)
    for name in ("batch_size", "doc_stride", "n_best_size", "max_answer_length"):
        if getattr(args, name) < 1:
            raise cli.InputError(f"--{name} must be positive, got {getattr(args, name)}")
    for name in ("max_context_chars", "max_question_chars", "max_windows"):
        if getattr(args, name) < 0:
            raise cli.InputError(f"--{name} must be >= 0 (0: no limit), got {getattr(args, name)}")
    items = items_from_args(args)
    if args.output_file:
        check_output_file(args.output_file)
    vocab_file = predict.resolve_model_files(args)  # --vocab_file, or in or beside the checkpoint (its hf_model/)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  (stdout carries the JSON only)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.no_cuda else "cpu")
    precision = precision_policy.setup(args.precision, device, "inference.py", precision_policy.READ).name
    tokenizer = BertTokenizer(vocab_file, do_lower_case=True)
    do_lower_case = vocab_is_uncased(tokenizer.vocab) if args.do_lower_case is None else args.do_lower_case
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case)
    model = load_model(args, log).to(device)
    default_length = 384 if args.mode == "qa" else 128
    max_seq_length = args.max_seq_length or min(default_length, model.config.max_position_embeddings)
    predict.check_model_fits(model.config, len(tokenizer), vocab_file, max_seq_length)
    runtime = predict.Runtime(args.batch_size, device, precision, progress=not args.disable_progress_bar)
    if args.mode == "qa":
        if max_seq_length < args.max_query_length + 4:
            raise cli.InputError(
                f"--max_seq_length {max_seq_length} must be at least --max_query_length {args.max_query_length} + 4"
            )
        out = predict.answer_questions(
            model,
            tokenizer,
            items,
            squad_answers.QASettings.from_args(args, max_seq_length=max_seq_length),
            runtime,
            max_windows=args.max_windows,
            how_to_raise=LIMIT_HINT,
        )
    else:
        labels = args.labels.split(",") if args.labels else model.label_names
        out = predict.classify(model, tokenizer, items, runtime, max_seq_length=max_seq_length, labels=labels)
    text = json.dumps(out, indent=2, ensure_ascii=False)
    if args.output_file:
        atomic_io.atomic_write_text(args.output_file, text + "\n")
    print(text, flush=True)
    return out


if __name__ == "__main__":
    main()
