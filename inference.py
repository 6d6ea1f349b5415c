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
import dataclasses
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch

from bert_recipe.io import atomic_io, cli, flags
from bert_recipe.io.checkpoint_io import load_pretrained
from bert_recipe.io.flags import flag
from bert_recipe.prediction import predict
from bert_recipe.prediction.items import InputLimits, check_text, read_items
from bert_recipe.tasks import squad_answers
from bert_recipe.training import precision_policy
from modeling import BertForQuestionAnswering, BertForSequenceClassification
from tokenization import BertTokenizer, vocab_is_uncased

# ----------------------------------------------------------------------------------------------------------------
# The flags


@dataclass(frozen=True)
class Task:
    """What to do with the model."""

    mode: Literal["qa", "classify"] = "qa"
    """qa: span answers (BertForQuestionAnswering); classify: labels (BertForSequenceClassification)"""


@dataclass(frozen=True)
class Model:
    """The fine-tuned model and its vocabulary."""

    init_checkpoint: str | None = flag(None, required=True)
    """a fine-tuned model.pt, an NVIDIA checkpoint or a Hugging Face directory"""
    config_file: str | None = None
    """bert_config.json; default: the checkpoint's own"""
    vocab_file: str | None = None
    """vocab.txt; default: vocab.txt in or beside the checkpoint (or in the hf_model/ beside it)"""
    do_lower_case: bool | None = flag(None, action=argparse.BooleanOptionalAction)
    """lower-case the input; default: yes when the vocabulary has no capital letters"""


@dataclass(frozen=True)
class Inputs:
    """The texts, from the command line or a file."""

    question: str | None = None
    """qa: the question"""
    context: str | None = None
    """qa: the text that holds the answer (any length)"""
    text_a: str | None = None
    """classify: the sentence (or the first of a pair)"""
    text_b: str | None = None
    """classify: the second sentence of a pair"""
    input_file: str | None = None
    """a JSON list, JSON lines, or (qa) a SQuAD file"""
    output_file: str | None = None
    """also write the JSON here"""


@dataclass(frozen=True)
class Windows(squad_answers.QASettings):
    """QASettings, with a max_seq_length that depends on the task."""

    max_seq_length: int | None = None
    """tokens per window (default 384 qa, 128 classify, at most the model's positions)"""


@dataclass(frozen=True)
class Classification:
    """The labels of a classifier."""

    labels: str | None = None
    """comma-separated class names; default: those the checkpoint records, else 0, 1, ..."""


@dataclass(frozen=True)
class InferenceConfig(flags.Config):
    """Every flag of inference.py."""

    task: Task = field(default_factory=Task)
    model: Model = field(default_factory=Model)
    """model"""
    inputs: Inputs = field(default_factory=Inputs)
    """input"""
    limits: InputLimits = field(default_factory=InputLimits)
    """limits (checked before any model work; 0 = no limit)"""
    windows: Windows = field(default_factory=Windows)
    """question answering"""
    classification: Classification = field(default_factory=Classification)
    """classification"""
    runtime: predict.ReadRuntime = field(default_factory=predict.ReadRuntime)
    """runtime"""

    ungrouped: ClassVar[tuple[str, ...]] = ("task",)

    def rules(self) -> list[tuple[bool, str]]:
        """Sizes that must be positive, limits that must not be negative (0 turns a limit off)."""
        sizes = {
            "batch_size": self.runtime.batch_size,
            "doc_stride": self.windows.doc_stride,
            "n_best_size": self.windows.n_best_size,
            "max_answer_length": self.windows.max_answer_length,
        }
        return [
            *[(value < 1, f"--{name} must be positive, got {value}") for name, value in sizes.items()],
            *[
                (value < 0, f"--{name} must be >= 0 (0: no limit), got {value}")
                for name, value in dataclasses.asdict(self.limits).items()
            ],
        ]


# ----------------------------------------------------------------------------------------------------------------
# Loading models and inputs


def load_model(cfg: InferenceConfig, log):
    """The task model; a checkpoint without the task's head is refused (its answers would be random)."""
    config = cfg.model.config_file
    if cfg.task.mode == "qa":
        model, report = load_pretrained(BertForQuestionAnswering, cfg.model.init_checkpoint, config=config)
        head = "qa_outputs"
    else:
        num_labels, names = predict.checkpoint_labels(cfg.model.init_checkpoint)
        if num_labels is None:
            raise cli.InputError(
                f"{cfg.model.init_checkpoint} has no classifier head: fine-tune it with run_glue.py first"
            )
        model, report = load_pretrained(
            BertForSequenceClassification, cfg.model.init_checkpoint, config=config, num_labels=num_labels
        )
        model.label_names = names
        head = "classifier"
    for line in report.lines():
        log(f"from_pretrained({type(model).__name__}, {cfg.model.init_checkpoint}): {line}")
    if report.fresh_head(f"{head}."):
        task = "run_squad.py" if cfg.task.mode == "qa" else "run_glue.py"
        raise cli.InputError(
            f"{cfg.model.init_checkpoint} has no {head} head (it would answer at random): "
            f"fine-tune it with {task} first"
        )
    return model


LIMIT_HINT = "raise it with --{name} (0 = no limit)"


def items_from_args(cfg: InferenceConfig) -> list[dict]:
    """The items to answer or classify, each checked (UTF-8, not empty, within the character limits) before any
    model work; cli.InputError (one line) for the first that is not."""
    if cfg.inputs.input_file:
        try:
            items = read_items(cfg.inputs.input_file)
        except (OSError, ValueError) as e:  # a missing file, bad JSON, bytes that are not UTF-8
            raise cli.InputError(f"--input_file: {e}") from None
        labels = [f"item {i} of --input_file {cfg.inputs.input_file}: the {{}}" for i in range(len(items))]
    elif cfg.task.mode == "qa":
        if cfg.inputs.question is None or cfg.inputs.context is None:
            raise cli.InputError("give --question and --context, or --input_file")
        items, labels = [{"id": "0", "question": cfg.inputs.question, "context": cfg.inputs.context}], ["--{}"]
    else:
        if cfg.inputs.text_a is None:
            raise cli.InputError("give --text_a (and --text_b for pairs), or --input_file")
        items, labels = [{"id": "0", "text_a": cfg.inputs.text_a, "text_b": cfg.inputs.text_b}], ["--{}"]
    fields = (
        (
            ("question", cfg.limits.max_question_chars, "max_question_chars"),
            ("context", cfg.limits.max_context_chars, "max_context_chars"),
        )
        if cfg.task.mode == "qa"
        else (
            ("text_a", cfg.limits.max_context_chars, "max_context_chars"),
            ("text_b", cfg.limits.max_context_chars, "max_context_chars"),
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


def main(argv: list[str] | None = None) -> list[dict]:
    """Run inference.py; an expected error (bad input, an unusable checkpoint, an unwritable output) becomes
    SystemExit("inference.py: error: <one line>"), which Python prints to stderr with exit status 1 (--debug: the
    traceback), as every script's (cli.script_errors)."""
    with cli.script_errors("inference.py", argv):
        return run(flags.parse(InferenceConfig, "inference.py", __doc__, argv))


def run(cfg: InferenceConfig) -> list[dict]:
    # A missing checkpoint is named before the inputs; the vocabulary is looked for once they have passed their checks.
    predict.check_init_checkpoint(cfg.model)
    items = items_from_args(cfg)
    if cfg.inputs.output_file:
        check_output_file(cfg.inputs.output_file)
    vocab_file = predict.resolve_model_files(cfg.model)  # --vocab_file, or in or beside the checkpoint (its hf_model/)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  (stdout carries the JSON only)
    device = torch.device("cuda" if torch.cuda.is_available() and not cfg.runtime.no_cuda else "cpu")
    precision = precision_policy.setup(cfg.runtime.precision, device, "inference.py", precision_policy.READ).name
    tokenizer = BertTokenizer(vocab_file, do_lower_case=True)
    do_lower_case = vocab_is_uncased(tokenizer.vocab) if cfg.model.do_lower_case is None else cfg.model.do_lower_case
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case)
    model = load_model(cfg, log).to(device)
    default_length = 384 if cfg.task.mode == "qa" else 128
    max_seq_length = cfg.windows.max_seq_length or min(default_length, model.config.max_position_embeddings)
    predict.check_model_fits(model.config, len(tokenizer), vocab_file, max_seq_length)
    runtime = predict.Runtime(cfg.runtime.batch_size, device, precision, progress=not cfg.runtime.disable_progress_bar)
    if cfg.task.mode == "qa":
        if max_seq_length < cfg.windows.max_query_length + 4:
            raise cli.InputError(
                f"--max_seq_length {max_seq_length} must be at least --max_query_length "
                f"{cfg.windows.max_query_length} + 4"
            )
        out = predict.answer_questions(
            model,
            tokenizer,
            items,
            dataclasses.replace(cfg.windows, max_seq_length=max_seq_length),
            runtime,
            max_windows=cfg.limits.max_windows,
            how_to_raise=LIMIT_HINT,
        )
    else:
        labels = cfg.classification.labels.split(",") if cfg.classification.labels else model.label_names
        out = predict.classify(model, tokenizer, items, runtime, max_seq_length=max_seq_length, labels=labels)
    text = json.dumps(out, indent=2, ensure_ascii=False)
    if cfg.inputs.output_file:
        atomic_io.atomic_write_text(cfg.inputs.output_file, text + "\n")
    print(text, flush=True)
    return out


if __name__ == "__main__":
    main()
