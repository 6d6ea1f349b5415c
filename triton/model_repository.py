"""Write a Triton model repository for a model exported by triton/export_model.py.

    PYTHONPATH=. .venv/bin/python triton/model_repository.py --export_dir results/triton_export \
        --repository results/triton_repo [--backend onnxruntime|python] [--model_name bert_qa] \
        [--max_batch_size 32] [--preferred_batch_sizes 8 16 32] [--max_queue_delay_us 2000] [--text_model]

Backends:
  onnxruntime  config.pbtxt with platform "onnxruntime_onnx": what an NGC Triton container (GPU) runs natively;
               --instance_kind gpu (default for this backend) and, optionally, --tensorrt_fp16.
  python       the same model.onnx served by a Python-backend model (backend/onnx_model.py) through ONNX Runtime,
               for a Triton without the native ONNX backend, such as the `tritonserver` in the nvidia-pytriton
               wheel on a CPU machine. The stub interpreter does not see the virtual environment, so the
               environment's site-packages and the repository root are written to sys_path.json beside model.py.

Both configurations declare the same inputs and outputs (names, dtypes, [-1] dims after the batch dimension), so a
client works unchanged against either. --text_model adds `<model_name>_text` (Python backend), which takes raw
question/context strings, tokenizes, calls <model_name> (BLS) and post-processes the answer on the server, with
the functions inference.py uses; it refuses (HTTP 400) empty and non-UTF-8 text and requests over
--max_context_chars / --max_question_chars / --max_windows (written as config.pbtxt parameters; see README.md).
The python tensor model's ONNX Runtime arena shrinks back after every run and malloc is trimmed after each batch,
so a big batch leaves no memory held (--no_arena_shrinkage, --no_malloc_trim, --no_cpu_mem_arena change that).

Layout written:
    <repository>/<model_name>/config.pbtxt
    <repository>/<model_name>/1/model.onnx          (+ model.py, sys_path.json for --backend python)
    <repository>/<model_name>_text/config.pbtxt     (--text_model)
    <repository>/<model_name>_text/1/model.py, sys_path.json, vocab.txt, settings.json, qa_client.py
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open, atomic_write_json, atomic_write_text
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prediction.items import ServerLimits
from bert_recipe.tasks.squad_answers import QASettings

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
TRITON_DTYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32"}


@dataclass(frozen=True)
class Repository:
    """What to serve and where the repository goes."""

    export_dir: str | None = flag(None, required=True)
    """output_dir of export_model.py (export.json, model.onnx)"""
    repository: str | None = flag(None, required=True)
    """model repository folder to write (created if absent)"""
    model_name: str | None = None
    """default: bert_qa or bert_classifier by task"""
    backend: Literal["onnxruntime", "python"] = "onnxruntime"
    """onnxruntime: Triton's native ONNX backend (an NGC container); python: ONNX Runtime in a Python-backend model"""


@dataclass(frozen=True)
class TensorModel:
    """How the tensor model is served: batches, instances, ONNX Runtime's memory."""

    max_batch_size: int = 32
    """the most sequences one request (or one dynamic batch) may hold"""
    preferred_batch_sizes: list[int] | None = flag(None, nargs="*")
    """dynamic batcher's preferred sizes; default: powers of two up to max_batch_size from 4"""
    max_queue_delay_us: int = 2000
    """how long the dynamic batcher may hold a request to form a bigger batch"""
    dynamic_batching: bool = flag(False, exclusive="batching")
    """give the tensor model Triton's dynamic batcher (default for --backend onnxruntime)"""
    no_dynamic_batching: bool = flag(False, exclusive="batching")
    """no dynamic batcher (default for --backend python: on this CPU, Triton 2.51's batcher thread spins while
    requests wait for the busy instance; see README.md)"""
    instance_count: int = 1
    """model instances Triton runs side by side"""
    instance_kind: Literal["cpu", "gpu"] | None = None
    """default: gpu for onnxruntime (NGC container), cpu for python"""
    intra_op_num_threads: int = 0
    """python backend: ONNX Runtime threads per instance (0 = all cores)"""
    no_arena_shrinkage: bool = False
    """python backend: let ONNX Runtime's CPU arena keep what the largest batch ever served grew it to (by default
    it shrinks back after every run)"""
    no_malloc_trim: bool = False
    """python backend: do not hand glibc's free pages back to the system after each batch"""
    no_cpu_mem_arena: bool = False
    """python backend: run ONNX Runtime without its CPU arena (big batches were 1.4-2.2x slower)"""
    tensorrt_fp16: bool = False
    """onnxruntime backend on GPU: run through ONNX Runtime's TensorRT accelerator in FP16"""
    text_model: bool = False
    """also write <model_name>_text: raw question/context strings in, answers out (qa only)"""


@dataclass(frozen=True)
class TextModelWindows(QASettings):
    """The text model's windows and answers (its max_seq_length is the export's)."""

    omitted: ClassVar[tuple[str, ...]] = ("max_seq_length",)
    help_prefix: ClassVar[str] = "text model: "


@dataclass(frozen=True)
class TextModelLimits(ServerLimits):
    """The text model's refusals."""

    help_prefix: ClassVar[str] = "text model (a 400; 0: no limit): "


@dataclass(frozen=True)
class Files:
    """How the model file gets into the repository."""

    link: bool = False
    """symlink model.onnx instead of copying it"""


@dataclass(frozen=True)
class RepositoryConfig(flags.Config):
    """Every flag of model_repository.py."""

    repository: Repository = field(default_factory=Repository)
    tensor_model: TensorModel = field(default_factory=TensorModel)
    windows: TextModelWindows = field(default_factory=TextModelWindows)
    limits: TextModelLimits = field(default_factory=TextModelLimits)
    files: Files = field(default_factory=Files)

    ungrouped: ClassVar[tuple[str, ...]] = ("repository", "tensor_model", "windows", "limits", "files")
    has_debug: ClassVar[bool] = False

    def rules(self) -> list[tuple[bool, str]]:
        """A batch of at least one, limits that are not negative (0 turns one off)."""
        batch = self.tensor_model.max_batch_size
        return [
            (batch < 1, f"--max_batch_size {batch} must be >= 1"),
            *[
                (value < 0, f"--{name} {value} must be >= 0 (0: no limit)")
                for name, value in dataclasses.asdict(self.limits).items()
            ],
        ]


def read_export(export_dir: str | Path) -> dict:
    path = Path(export_dir) / "export.json"
    if not path.is_file():
        raise InputError(f"--export_dir {export_dir} has no export.json: run triton/export_model.py first")
    info = json.loads(path.read_text(encoding="utf-8"))
    if "onnx" not in info.get("files", {}):
        raise InputError(f"--export_dir {export_dir} has no ONNX model: export with --format onnx")
    return info


# ----------------------------------------------------------------------------------------------------------------
# config.pbtxt (protobuf text format, written by hand: no dependency on Triton's protobuf classes)


def _tensor(name: str, dtype: str, dims: list[int]) -> str:
    return f'  {{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ] }}'


def _parameters(params: dict[str, object]) -> str:
    return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items())


def _dynamic_batching(cfg: RepositoryConfig) -> str:
    """The dynamic_batching block, or "" where there is none: --no_dynamic_batching, or --backend python without
    --dynamic_batching. Measured on the 2-core CPU (triton/README.md, "Serving soak"): with the batcher, Triton 2.51's
    batcher thread busy-waits while requests queue for the one busy Python-backend instance, taking CPU from the
    model itself: in the soak the server process used 3 CPU-seconds at load 4.6 and 25 to 57 at load 7 to 9,
    against 0.1 without the batcher, and back-to-back soaks took 1.4 times as long with it."""
    if cfg.tensor_model.no_dynamic_batching or (
        cfg.repository.backend == "python" and not cfg.tensor_model.dynamic_batching
    ):
        return ""
    sizes = cfg.tensor_model.preferred_batch_sizes
    if sizes is None:
        sizes = [b for b in (4, 8, 16, 32, 64, 128, 256) if b <= cfg.tensor_model.max_batch_size] or [
            cfg.tensor_model.max_batch_size
        ]
    return (
        f"dynamic_batching {{\n  preferred_batch_size: [ {', '.join(map(str, sizes))} ]\n"
        f"  max_queue_delay_microseconds: {cfg.tensor_model.max_queue_delay_us}\n}}\n"
    )


def model_config(info: dict, cfg: RepositoryConfig, name: str) -> str:
    """The config.pbtxt of the tensor model: same inputs/outputs for both backends."""
    dtype = TRITON_DTYPES[info["input_dtype"]]
    out_dims = [-1] if info["task"] == "qa" else [info["num_labels"]]
    kind = cfg.tensor_model.instance_kind or ("gpu" if cfg.repository.backend == "onnxruntime" else "cpu")
    lines = [f'name: "{name}"']
    lines.append('platform: "onnxruntime_onnx"' if cfg.repository.backend == "onnxruntime" else 'backend: "python"')
    lines.append(f"max_batch_size: {cfg.tensor_model.max_batch_size}")
    lines.append("input [\n" + ",\n".join(_tensor(n, dtype, [-1]) for n in info["input_names"]) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor(n, "TYPE_FP32", out_dims) for n in info["output_names"]) + "\n]")
    text = "\n".join(lines) + "\n" + _dynamic_batching(cfg)
    text += f"instance_group [ {{ count: {cfg.tensor_model.instance_count} kind: KIND_{kind.upper()} }} ]\n"
    if cfg.repository.backend == "onnxruntime" and cfg.tensor_model.tensorrt_fp16:
        text += (
            'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
            'parameters { key: "precision_mode" value: "FP16" } } ] } }\n'
        )
    # Read by the Python backend to refuse bad requests early; harmless for the native backend.
    text += _parameters(
        {
            "max_seq_length": info["max_seq_length"],
            "vocab_size": info["vocab_size"],
            "type_vocab_size": info["type_vocab_size"],
            "intra_op_num_threads": cfg.tensor_model.intra_op_num_threads,
            "cpu_mem_arena": str(not cfg.tensor_model.no_cpu_mem_arena).lower(),
            "arena_shrinkage": str(not cfg.tensor_model.no_arena_shrinkage).lower(),
            "malloc_trim": str(not cfg.tensor_model.no_malloc_trim).lower(),
        }
    )
    return text


def text_model_config(name: str, cfg: RepositoryConfig) -> str:
    """Strings in, strings out: question and context [1] per request row; answer, probability, nbest (JSON)."""
    kind = cfg.tensor_model.instance_kind if cfg.tensor_model.instance_kind == "gpu" else "cpu"
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {cfg.tensor_model.max_batch_size}\n'
        "input [\n"
        + _tensor("question", "TYPE_STRING", [1])
        + ",\n"
        + _tensor("context", "TYPE_STRING", [1])
        + "\n]\noutput [\n"
        + _tensor("answer", "TYPE_STRING", [1])
        + ",\n"
        + _tensor("probability", "TYPE_FP32", [1])
        + ",\n"
        + _tensor("nbest_json", "TYPE_STRING", [1])
        + "\n]\n"
        + f"instance_group [ {{ count: 1 kind: KIND_{kind.upper()} }} ]\n"
        + _parameters(
            {
                "max_context_chars": cfg.limits.max_context_chars,
                "max_question_chars": cfg.limits.max_question_chars,
                "max_windows": cfg.limits.max_windows,
            }
        )
    )


# ----------------------------------------------------------------------------------------------------------------
# Writing


def interpreter_paths() -> list[str]:
    """Where this interpreter finds its packages, then the repository root (modeling.py, bert_recipe/, ...):
    the Python-backend stub adds these to its own sys.path (see backend/onnx_model.py)."""
    paths = list(site.getsitepackages()) + [sysconfig.get_paths()["purelib"], str(REPO_ROOT)]
    return list(dict.fromkeys(p for p in paths if Path(p).is_dir()))


def copy_file(src: Path, dst: Path, link: bool = False) -> None:
    if link:
        tmp = dst.with_name(f".{dst.name}.link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(src.resolve())
        tmp.replace(dst)
        return
    with open(src, "rb") as fin, atomic_open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 16 << 20)


def write_python_model(folder: Path, source: Path) -> None:
    """model.py (from triton/backend/) and sys_path.json into a version folder."""
    with atomic_open(folder / "model.py", "w", encoding="utf-8") as f:
        f.write(source.read_text(encoding="utf-8"))
    atomic_write_json(folder / "sys_path.json", interpreter_paths())


def main(argv=None) -> int:
    """0 when the repository is written; bad input: one line on stderr, exit status 1."""
    with script_errors("model_repository.py", argv):
        return _main(argv)


def _main(argv) -> int:
    cfg = flags.parse(RepositoryConfig, "model_repository.py", __doc__, argv)
    info = read_export(cfg.repository.export_dir)
    export_dir = Path(cfg.repository.export_dir)
    if cfg.tensor_model.text_model and info["task"] != "qa":
        raise InputError(
            "--text_model serves question answering only; the export is a classification model: "
            "export a question-answering model"
        )
    if cfg.tensor_model.text_model and not info.get("vocab_file"):
        raise InputError(f"--text_model needs a vocabulary: re-export with --vocab_file ({export_dir} has none)")
    name = cfg.repository.model_name or ("bert_qa" if info["task"] == "qa" else "bert_classifier")
    repository = Path(cfg.repository.repository)
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    copy_file(export_dir / info["files"]["onnx"], version / "model.onnx", link=cfg.files.link)
    if cfg.repository.backend == "python":
        write_python_model(version, HERE / "backend" / "onnx_model.py")
    else:  # a leftover Python wrapper would not be loaded, but would confuse a reader
        for stale in ("model.py", "sys_path.json"):
            (version / stale).unlink(missing_ok=True)
    atomic_write_text(repository / name / "config.pbtxt", model_config(info, cfg, name))
    written = [name]

    if cfg.tensor_model.text_model:
        text_name = f"{name}_text"
        text_version = repository / text_name / "1"
        text_version.mkdir(parents=True, exist_ok=True)
        write_python_model(text_version, HERE / "backend" / "qa_text_model.py")
        copy_file(export_dir / info["vocab_file"], text_version / "vocab.txt")
        copy_file(HERE / "client.py", text_version / "qa_client.py")
        atomic_write_json(
            text_version / "settings.json",
            {
                "tensor_model": name,
                "input_dtype": info["input_dtype"],
                "do_lower_case": info["do_lower_case"],
                "max_seq_length": info["max_seq_length"],
                "doc_stride": cfg.windows.doc_stride,
                "max_query_length": cfg.windows.max_query_length,
                "n_best_size": cfg.windows.n_best_size,
                "max_answer_length": cfg.windows.max_answer_length,
                "batch_size": cfg.tensor_model.max_batch_size,
                "version_2_with_negative": cfg.windows.version_2_with_negative,
                "null_score_diff_threshold": cfg.windows.null_score_diff_threshold,
            },
        )
        atomic_write_text(repository / text_name / "config.pbtxt", text_model_config(text_name, cfg))
        written.append(text_name)
    print(json.dumps({"repository": str(repository), "models": written, "backend": cfg.repository.backend}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
