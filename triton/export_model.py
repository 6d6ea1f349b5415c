"""Export a fine-tuned BERT (question answering or sequence classification) to ONNX and TorchScript for Triton.

Run from the repository root with the root importable (the wrappers in triton/scripts/ set PYTHONPATH):

    PYTHONPATH=. .venv/bin/python triton/export_model.py --checkpoint results/squad/ckpt_final.pt \
        --task qa --output_dir results/triton_export [--input_dtype int32] [--format onnx torchscript]

Any checkpoint `checkpoint_io.from_pretrained` reads works: a Hugging Face directory, this project's ckpt_<step>.pt,
an NVIDIA DeepLearningExamples checkpoint (give --config_file when no config sits beside it).

The exported graph has one fixed signature whatever the checkpoint:
    inputs  input_ids, token_type_ids, attention_mask   [B, S] int64 (default) or int32 (--input_dtype int32)
    outputs qa:             start_logits [B, S], end_logits [B, S]   float32
            classification: logits [B, num_labels]                     float32
with B and S dynamic. int32 inputs are cast to int64 inside the graph (one Cast per input), which lets a client
send half the bytes; the results are identical.

The output directory receives model.onnx, model.pt (TorchScript), vocab.txt when one is found, and export.json
(what model_repository.py, client.py and perf.py need: task, input dtype, output names, limits, the parity check
run right after export). The parity check feeds a padded batch of random ids through PyTorch, ONNX Runtime and
TorchScript and fails the export if any output differs by more than --tolerance.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import nn

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open, atomic_write_json
from bert_recipe.io.checkpoint_io import canonical_state_dict, load_pretrained, read_state_dict
from bert_recipe.io.cli import InputError, check_output_path, describe_error, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.training.dist_env import set_seed
from modeling import BertForQuestionAnswering, BertForSequenceClassification

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
OUTPUT_NAMES = {"qa": ("start_logits", "end_logits"), "classification": ("logits",)}
INPUT_DTYPES = {"int64": torch.int64, "int32": torch.int32}


class ExportWrapper(nn.Module):
    """The model behind a fixed (input_ids, token_type_ids, attention_mask) signature with a tuple of float32
    outputs: (start_logits [B,S], end_logits [B,S]) for QA, (logits [B,num_labels],) for classification.

    The model's embeddings index with int64; int32 inputs are widened here, so the Cast lives in the graph and the
    wire format can be int32."""

    def __init__(self, model: nn.Module, task: str):
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor):
        out = self.model(input_ids.long(), token_type_ids.long(), attention_mask.long())
        if self.task == "qa":
            return out.start_logits, out.end_logits
        return (out.logits,)


@dataclass(frozen=True)
class Model:
    """The fine-tuned checkpoint and what to load it as."""

    checkpoint: str | None = flag(None, required=True)
    """Hugging Face directory, ckpt_<step>.pt, NVIDIA .pt, or a state-dict file"""
    task: Literal["qa", "classification"] = "qa"
    """the head: qa (start/end logits) or classification (logits)"""
    num_labels: int | None = None
    """classification only; default: read from the checkpoint's classifier weight"""
    config_file: str | None = None
    """bert_config.json when none is inside/beside the checkpoint"""
    vocab_file: str | None = None
    """copied into the export for the client; default: vocab.txt beside the checkpoint, if any"""
    do_lower_case: bool = flag(True, action=argparse.BooleanOptionalAction)
    """recorded in export.json for the client's tokenizer"""


@dataclass(frozen=True)
class Export:
    """What to write, and the parity check after it."""

    output_dir: str | None = flag(None, required=True)
    """where model.onnx, model.pt, vocab.txt and export.json go"""
    format: list[Literal["onnx", "torchscript"]] = flag(factory=lambda: ["onnx", "torchscript"])
    """the formats to write"""
    input_dtype: str = flag("int64", choices=tuple(INPUT_DTYPES))
    """the inputs' integer type on the wire (int32 is cast to int64 inside the graph)"""
    opset: int = 17
    """ONNX opset (>= 17: LayerNormalization is one op)"""
    max_seq_length: int = 384
    """longest sequence the server accepts (recorded; the graph itself is dynamic)"""
    allow_fresh_head: bool = False
    """export even if the task head is not in the checkpoint (initialised randomly with --seed); only for tests and
    benchmarks"""
    seed: int = 42
    """seeds a fresh head (--allow_fresh_head) and the parity check's inputs"""
    tolerance: float = 1e-4
    """largest |export - PyTorch| the parity check allows"""
    no_verify: bool = False
    """skip the parity check after export"""


@dataclass(frozen=True)
class ExportConfig(flags.Config):
    """Every flag of export_model.py."""

    model: Model = field(default_factory=Model)
    export: Export = field(default_factory=Export)

    ungrouped: ClassVar[tuple[str, ...]] = ("model", "export")

    def rules(self) -> list[tuple[bool, str]]:
        opset, num_labels = self.export.opset, self.model.num_labels
        return [
            (opset < 17, f"--opset {opset}: use 17 or later (LayerNormalization as one op)"),
            (num_labels is not None and num_labels < 1, f"--num_labels must be at least 1, got {num_labels}"),
        ]


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _num_labels_in(checkpoint: str) -> int | None:
    state, config = read_state_dict(checkpoint)
    weight = canonical_state_dict(state).get("classifier.weight")
    if weight is not None:
        return int(weight.shape[0])
    if config and isinstance(config.get("id2label"), dict):
        return len(config["id2label"])
    return config.get("num_labels") if config else None


def load_model(cfg: ExportConfig) -> nn.Module:
    """The checkpoint in the task's class, eval mode, float32. A head the checkpoint lacks is an error unless
    --allow_fresh_head: serving a randomly initialised head is almost always a mistake."""
    set_seed(cfg.export.seed)  # a fresh head (tests, benchmarks) is then reproducible
    kwargs = {}
    cls = BertForQuestionAnswering
    if cfg.model.task == "classification":
        cls = BertForSequenceClassification
        try:
            kwargs["num_labels"] = cfg.model.num_labels or _num_labels_in(cfg.model.checkpoint)
        except (FileNotFoundError, ValueError) as e:
            raise InputError(f"--checkpoint {cfg.model.checkpoint}: {describe_error(e)}") from e
        if not kwargs["num_labels"]:
            raise InputError(f"--checkpoint {cfg.model.checkpoint} has no classifier: pass --num_labels")
    try:
        model, report = load_pretrained(cls, cfg.model.checkpoint, config=cfg.model.config_file, **kwargs)
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"--checkpoint {cfg.model.checkpoint}: {describe_error(e)}") from e
    head_keys = ("qa_outputs.",) if cfg.model.task == "qa" else ("classifier.", "bert.pooler.")
    head_missing = report.fresh_head(*head_keys)
    if head_missing and not cfg.export.allow_fresh_head:
        raise InputError(
            f"--checkpoint {cfg.model.checkpoint} has no {cfg.model.task} head (initialised fresh: "
            f"{', '.join(head_missing)}); export a fine-tuned checkpoint, or pass --allow_fresh_head "
            "for a test model"
        )
    for line in report.lines():
        print(f"from_pretrained({cls.__name__}, {cfg.model.checkpoint}): {line}", file=sys.stderr)
    return model.float().eval()


def example_inputs(
    batch: int, seq_len: int, vocab_size: int, dtype: torch.dtype, seed: int = 0, lengths: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A padded batch: random ids after [CLS]-like position 0, segment B in the second half of each row, padding
    (id 0, mask 0) after each row's length. Default lengths go from seq_len down, so rows really differ."""
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = [max(2, seq_len - i * max(1, seq_len // (batch + 1))) for i in range(batch)]
    input_ids = (
        torch.randint(1000, vocab_size, (batch, seq_len), generator=g)
        if vocab_size > 1000
        else torch.randint(1, vocab_size, (batch, seq_len), generator=g)
    )
    token_type_ids = torch.zeros(batch, seq_len, dtype=torch.long)
    attention_mask = torch.zeros(batch, seq_len, dtype=torch.long)
    for row, n in enumerate(lengths):
        attention_mask[row, :n] = 1
        token_type_ids[row, n // 2 : n] = 1
        input_ids[row, n:] = 0
    return input_ids.to(dtype), token_type_ids.to(dtype), attention_mask.to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# Export


def export_onnx(wrapper: ExportWrapper, inputs: tuple[torch.Tensor, ...], path: Path, opset: int) -> None:
    """torch.onnx.export with dynamic batch and sequence axes.

    The TorchScript-based exporter (dynamo=False) is used on purpose: the torch.export-based one needs the
    `onnxscript` package, and this graph (no data-dependent control flow) converts exactly either way.
    """
    output_names = OUTPUT_NAMES[wrapper.task]
    dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    for name in output_names:
        dynamic_axes[name] = {0: "batch", 1: "sequence"} if wrapper.task == "qa" else {0: "batch"}
    with warnings.catch_warnings(), atomic_open(path, "wb") as f:
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice and tracer warnings
        torch.onnx.export(
            wrapper,
            inputs,
            f,
            input_names=list(INPUT_NAMES),
            output_names=list(output_names),
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )


def export_torchscript(wrapper: ExportWrapper, inputs: tuple[torch.Tensor, ...], path: Path) -> None:
    """torch.jit.trace: the forward has no data-dependent control flow, and shapes are read with size ops, so the
    traced graph accepts any batch and sequence length. (torch.jit is deprecated in PyTorch 2.13, but TorchScript
    is still what Triton's PyTorch backend and the original recipe serve.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(wrapper, inputs, check_trace=False)
        with atomic_open(path, "wb") as f:
            torch.jit.save(traced, f)


# ----------------------------------------------------------------------------------------------------------------
# Parity


def run_onnx(path: str | Path, inputs: tuple[torch.Tensor, ...], threads: int = 0) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {name: t.numpy() for name, t in zip(INPUT_NAMES, inputs)})


def run_torchscript(path: str | Path, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated, still what Triton's
        module = torch.jit.load(str(path), map_location="cpu")  # PyTorch backend loads
    with torch.no_grad():
        return [t.numpy() for t in module(*inputs)]


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def verify(
    wrapper: ExportWrapper, files: dict[str, Path], dtype: torch.dtype, vocab_size: int, seq_len: int
) -> dict[str, float]:
    """Max |export - PyTorch| per format on a padded batch of another shape than the one traced (3 x seq_len)."""
    inputs = example_inputs(3, seq_len, vocab_size, dtype, seed=1)
    with torch.no_grad():
        reference = [t.numpy() for t in wrapper(*inputs)]
    diffs = {}
    if "onnx" in files:
        diffs["onnx"] = max_abs_diff(run_onnx(files["onnx"], inputs), reference)
    if "torchscript" in files:
        diffs["torchscript"] = max_abs_diff(run_torchscript(files["torchscript"], inputs), reference)
    return diffs


def find_vocab(cfg: ExportConfig) -> Path | None:
    if cfg.model.vocab_file:
        if not Path(cfg.model.vocab_file).is_file():
            raise InputError(f"--vocab_file {cfg.model.vocab_file} not found")
        return Path(cfg.model.vocab_file)
    checkpoint = Path(cfg.model.checkpoint)
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    return folder / "vocab.txt" if (folder / "vocab.txt").is_file() else None


def main(argv=None) -> int:
    """0 when the export (and its parity check) succeeded; bad input, a checkpoint that cannot be read safely, a
    failed parity check or a full disk: one line on stderr and exit status 1 (--debug: the traceback)."""
    with script_errors("export_model.py", argv):
        return _main(argv)


def _main(argv) -> int:
    cfg = flags.parse(ExportConfig, "export_model.py", __doc__, argv)
    if not Path(cfg.model.checkpoint).exists():
        raise InputError(
            f"--checkpoint {cfg.model.checkpoint} not found: give a fine-tuned checkpoint (.pt, .bin, "
            ".safetensors or a Hugging Face folder)"
        )
    if cfg.model.config_file is not None and not Path(cfg.model.config_file).is_file():
        raise InputError(f"--config_file {cfg.model.config_file} not found")
    vocab = find_vocab(cfg)  # before the export, not after it
    check_output_path(cfg.export.output_dir, "--output_dir", folder=True)
    model = load_model(cfg)
    config = model.config
    if not 1 <= cfg.export.max_seq_length <= config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length {cfg.export.max_seq_length} must be in [1, {config.max_position_embeddings}] "
            f"(the model's max_position_embeddings)"
        )
    out = Path(cfg.export.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = INPUT_DTYPES[cfg.export.input_dtype]
    wrapper = ExportWrapper(model, cfg.model.task).eval()  # eval on the wrapper too: the exporter traces its mode
    # Trace with a padded batch of 2 and a short sequence: the axes are dynamic, a small trace is fast.
    trace_inputs = example_inputs(2, min(16, cfg.export.max_seq_length), config.vocab_size, dtype)

    files: dict[str, Path] = {}
    timings = {}
    for fmt in cfg.export.format:
        start = time.perf_counter()
        if fmt == "onnx":
            files[fmt] = out / "model.onnx"
            export_onnx(wrapper, trace_inputs, files[fmt], cfg.export.opset)
        else:
            files[fmt] = out / "model.pt"
            export_torchscript(wrapper, trace_inputs, files[fmt])
        timings[fmt] = round(time.perf_counter() - start, 2)
        print(f"exported {fmt}: {files[fmt]} ({timings[fmt]} s)", file=sys.stderr)

    diffs = {}
    if not cfg.export.no_verify:
        diffs = verify(wrapper, files, dtype, config.vocab_size, min(64, cfg.export.max_seq_length))
        print(f"parity (max |export - PyTorch|): {diffs}", file=sys.stderr)
        bad = {k: v for k, v in diffs.items() if not v <= cfg.export.tolerance}
        if bad:
            raise InputError(f"export parity failed: {bad} > --tolerance {cfg.export.tolerance}")

    if vocab is not None:
        with atomic_open(out / "vocab.txt", "wb") as f:
            f.write(vocab.read_bytes())
    info = {
        "task": cfg.model.task,
        "checkpoint": str(cfg.model.checkpoint),
        "files": {fmt: path.name for fmt, path in files.items()},
        "input_names": list(INPUT_NAMES),
        "input_dtype": cfg.export.input_dtype,
        "output_names": list(OUTPUT_NAMES[cfg.model.task]),
        "num_labels": getattr(model, "num_labels", None),
        "vocab_size": config.vocab_size,
        "type_vocab_size": config.type_vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "max_seq_length": cfg.export.max_seq_length,
        "vocab_file": "vocab.txt" if vocab is not None else None,
        "do_lower_case": cfg.model.do_lower_case,
        "opset": cfg.export.opset,
        "parity_max_abs_diff": diffs,
        "export_seconds": timings,
        "torch_version": torch.__version__,
    }
    atomic_write_json(out / "export.json", info)
    print(f"wrote {out / 'export.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
