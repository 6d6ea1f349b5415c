"""Checkpoints in and out of modeling.py's classes; modeling.py itself is the architecture alone.

Read top to bottom:
  1. reading   `read_state_dict`: a Hugging Face directory (config.json + model.safetensors or pytorch_model.bin),
               a .safetensors file, an NVIDIA DeepLearningExamples .pt ({"model": state_dict, ...}), this project's
               ckpt_<step>.pt ({"model", "config", "optimizer", ...}) or a plain state-dict file. .pt/.bin files go
               through torch.load(weights_only=True) only, so no pickled code ever runs.
  2. renaming  `CHECKPOINT_RENAMES`, the one table that maps every known layout onto modeling.py's (Hugging Face)
               parameter names, and `canonical_state_dict`, which applies it.
  3. loading   `load_checkpoint_state` copies renamed tensors into a model and raises CheckpointError listing every
               missing, unexpected or wrong-shape key; task heads started fresh or left out are reported, one line
               each. `from_pretrained(cls, path)` = read + build the class from the checkpoint's config + load.
  4. writing   `export_state_dict` (Hugging Face names, true vocabulary size), `save_hf_directory` (what
               transformers' from_pretrained reads), `nvidia_state_dict` (NVIDIA's names, vocabulary padded to a
               multiple of 8, as its run_pretraining.py / run_squad.py load them).

Layouts, by their key names for one encoder weight:
    ours / Hugging Face          bert.encoder.layer.0.intermediate.dense.weight  (HF's BertModel: no `bert.`)
    NVIDIA DeepLearningExamples  bert.encoder.layer.0.intermediate.dense_act.weight  (fused bias+GELU Linear),
                                 LayerNorm .weight/.bias (older checkpoints .gamma/.beta), vocabulary rows 30528
    saved from inside DDP / torch.compile: the same behind `module.` / `_orig_mod.`
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from bert_recipe.io import atomic_io, cli
from bert_recipe.io.atomic_io import atomic_open, atomic_path, atomic_write_json
from modeling import BertConfig, BertForSequenceClassification, BertModel

# ----------------------------------------------------------------------------------------------------------------
# Names

# (pattern, replacement) applied in order to every key of a checkpoint. Each line names the layout it serves.
CHECKPOINT_RENAMES: list[tuple[str, str]] = [
    (r"^module\.", ""),  # DistributedDataParallel wrapper
    (r"^_orig_mod\.", ""),  # torch.compile wrapper
    (r"\.gamma$", ".weight"),  # LayerNorm in old TF-converted / NVIDIA checkpoints
    (r"\.beta$", ".bias"),
    (r"\.dense_act\.", ".dense."),  # NVIDIA's fused bias+GELU layers
    (r"^(embeddings|encoder|pooler)\.", r"bert.\1."),  # Hugging Face BertModel checkpoints have no `bert.` prefix
]

# Keys some checkpoints carry that hold nothing this model needs: buffers and copies of tied weights.
REDUNDANT_KEYS = re.compile(
    r"^bert\.embeddings\.position_ids$"  # a buffer in older transformers checkpoints
    r"|^cls\.predictions\.decoder\.weight$"  # tied to bert.embeddings.word_embeddings.weight
    r"|^cls\.predictions\.decoder\.bias$"  # tied to cls.predictions.bias in transformers
)

# Heads: a class may start them fresh (the weights are not in a checkpoint of another task), and a checkpoint's
# heads that the class lacks are left out. Both are reported in one line each.
HEAD_PREFIXES = ("cls.", "qa_outputs.", "classifier.", "bert.pooler.")

# The tensors with one row per vocabulary entry (the decoder weight is tied to the first).
VOCAB_ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read safely or does not fit the model: the message lists the keys."""


# ----------------------------------------------------------------------------------------------------------------
# 1. Reading


def load_pt(path: str | os.PathLike) -> Any:
    """A .pt/.bin file through torch.load(weights_only=True): tensors and plain containers only, so no pickled code
    runs. A file that needs more (a pickled class), a truncated file or an unreadable one raises CheckpointError
    with one line of ours naming the file and what to do; PyTorch's own advice (re-run with weights_only=False,
    allowlist the class) is never passed on, since following it would run whatever the file holds."""
    path = Path(path)
    try:
        with warnings.catch_warnings(record=True) as caught:  # kept back until the file proves loadable
            warnings.simplefilter("always")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling refusal, a truncated file, ...
        text = str(e)
        if isinstance(e, pickle.UnpicklingError) or "Weights only load failed" in text:
            found = re.search(r"GLOBAL ([\w.]+)", text)  # the pickled class or function that was refused
            todo = (
                "pass its .safetensors file instead, or convert it to a plain state dict of tensors with a tool "
                "you trust"
            )
            if found:
                raise CheckpointError(
                    f"checkpoint {path} was refused: it holds a pickled {found.group(1)} beyond "
                    f"tensors and plain containers, and loading that could run code; {todo}"
                ) from None
            raise CheckpointError(
                f"checkpoint {path} was refused: it holds pickled data beyond tensors and plain "
                f"containers, or it is damaged; {todo}, or copy it again"
            ) from None
        if isinstance(e, OSError) and e.errno is not None:  # permissions, an I/O error: say what to check
            from bert_recipe.io.cli import describe_error

            raise CheckpointError(
                f"checkpoint {path} cannot be read: {describe_error(OSError(e.errno, e.strerror))}"
            ) from None
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        first = lines[0].split(". ")[0] if lines else type(e).__name__  # torch's first sentence: the reason
        if "weights_only" in first:  # never pass on advice about loading it unsafely
            first = type(e).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({first}): is it a complete checkpoint? Copy it again, or pass another"
        ) from None
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return obj


def read_state_dict(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """Read weights from a Hugging Face directory, a .safetensors file, or a .pt/.bin file, without executing
    pickled code. Returns (state_dict, config dict found beside or inside the checkpoint, or None)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} not found")
    config = None
    if path.is_dir():
        for name in ("config.json", "bert_config.json"):
            if (path / name).is_file():
                config = json.loads((path / name).read_text(encoding="utf-8"))
                break
        for name in ("model.safetensors", "pytorch_model.bin", "model.pt"):
            if (path / name).is_file():
                state, _ = read_state_dict(path / name)
                return state, config
        raise FileNotFoundError(f"checkpoint directory {path} holds no model.safetensors or pytorch_model.bin")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path)), None
    obj = load_pt(path)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):  # ckpt_<step>.pt, NVIDIA checkpoints
        config = obj.get("config") if isinstance(obj.get("config"), dict) else None
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"checkpoint {path} holds no state dict (expected tensors, or a dict with 'model')")
    return obj, config


# ----------------------------------------------------------------------------------------------------------------
# 2. Renaming


def canonical_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename every key to this model's (Hugging Face) names with CHECKPOINT_RENAMES; drop REDUNDANT_KEYS."""
    out = {}
    for key, value in state.items():
        for pattern, replacement in CHECKPOINT_RENAMES:
            key = re.sub(pattern, replacement, key)
        if not REDUNDANT_KEYS.match(key):
            out[key] = value
    return out


def _fit_vocab_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """Cut or zero-pad the vocabulary dimension: NVIDIA pads 30522 to 30528, exports keep the true size."""
    if tensor.shape[0] >= rows:
        return tensor[:rows]
    pad = tensor.new_zeros((rows - tensor.shape[0],) + tuple(tensor.shape[1:]))
    return torch.cat([tensor, pad])


# ----------------------------------------------------------------------------------------------------------------
# 3. Loading


@dataclass(frozen=True)
class LoadReport:
    """What a load did besides copying tensors: the model's head parameters the checkpoint had no tensor for (they
    keep their fresh initialisation) and the checkpoint's head tensors the model has no place for."""

    model: str
    fresh: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()

    def fresh_head(self, *prefixes: str) -> list[str]:
        """The freshly initialised parameters under any of `prefixes` ("qa_outputs.", "classifier.", ...)."""
        return [k for k in self.fresh if k.startswith(prefixes)]

    def lines(self) -> list[str]:
        """The report as log lines (nothing when every tensor found its place)."""
        out = []
        if self.fresh:
            out.append("initialised fresh: " + ", ".join(self.fresh))
        if self.left_out:
            out.append(f"not used by {self.model}: " + ", ".join(self.left_out))
        return out


def load_checkpoint_state(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> LoadReport:
    """Load a checkpoint's tensors into `model` after renaming; raise CheckpointError on anything that does
    not fit. Returns the LoadReport (heads initialised fresh, heads of the checkpoint left out)."""
    prefix = "bert." if isinstance(model, BertModel) else ""  # a bare BertModel's keys have no `bert.` prefix
    target = {prefix + k: v for k, v in model.state_dict().items() if not REDUNDANT_KEYS.match(prefix + k)}
    source_state = canonical_state_dict(state)
    for key in VOCAB_ROWS:
        if key in source_state and key in target:
            source_state[key] = _fit_vocab_rows(source_state[key], target[key].shape[0])

    missing = [k for k in target if k not in source_state]  # in the model's own order: weight before bias
    unexpected = [k for k in source_state if k not in target]
    fresh = [k for k in missing if k.startswith(HEAD_PREFIXES)]
    left_out = [k for k in unexpected if k.startswith(HEAD_PREFIXES)]
    missing = [k for k in missing if k not in fresh]
    unexpected = [k for k in unexpected if k not in left_out]
    wrong_shape = [
        f"{k} {tuple(source_state[k].shape)} vs {tuple(target[k].shape)}"
        for k in target
        if k in source_state and source_state[k].shape != target[k].shape
    ]
    problems = []
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape)):
        if keys:  # a few keys tell the story; a checkpoint of another size would list every tensor
            shown = keys if len(keys) <= 6 else keys[:6] + [f"... {len(keys) - 6} more"]
            problems.append(f"{what} {shown}")
    if problems:
        raise CheckpointError(
            f"{source} does not fit {type(model).__name__}: "
            + "; ".join(problems)
            + " (a checkpoint of another model size or config? check --config_file)"
        )

    to_load = {k[len(prefix) :]: source_state[k] for k in target if k in source_state}
    own = model.state_dict()
    with torch.no_grad():
        for key, value in to_load.items():
            own[key].copy_(value.to(own[key].dtype))
    return LoadReport(type(model).__name__, tuple(fresh), tuple(left_out))


def from_pretrained(
    cls: type[nn.Module],
    path: str | os.PathLike,
    config: BertConfig | str | os.PathLike | None = None,
    log: Callable[[str], None] | None = print,
    **model_kwargs,
) -> nn.Module:
    """load_pretrained's model alone, its report's lines sent to `log`."""
    model, report = load_pretrained(cls, path, config, **model_kwargs)
    for line in report.lines():
        if log:
            log(f"from_pretrained({cls.__name__}, {path}): {line}")
    return model


def load_pretrained(
    cls: type[nn.Module], path: str | os.PathLike, config: BertConfig | str | os.PathLike | None = None, **model_kwargs
) -> tuple[nn.Module, LoadReport]:
    """Build `cls` (a modeling.py class) and load a checkpoint into it:
    `from_pretrained(BertForQuestionAnswering, "results/SQuAD/hf_model")`.

    `path`: a Hugging Face directory (config.json + model.safetensors or pytorch_model.bin, keys with or without
    `bert.`), a ckpt_<step>.pt of this project or an NVIDIA checkpoint ({"model": state_dict}, `dense_act`,
    `gamma`/`beta`, vocabulary padded to 30528), or a plain state dict file. `config`: a BertConfig or a path to
    a config file; by default the one inside or beside the checkpoint. `model_kwargs` go to the class
    (num_labels=...). Returns the model and load_checkpoint_state's LoadReport, which callers test (a fine-tuning
    script warns when its task's head starts fresh, an export refuses it).
    """
    state, found_config = read_state_dict(path)
    if isinstance(config, (str, os.PathLike)):
        config = BertConfig.from_json_file(config)
    if config is None:
        path = Path(path)
        beside = [path.parent / n for n in ("config.json", "bert_config.json")] if path.is_file() else []
        if found_config is not None:
            config = BertConfig.from_dict(found_config, source=f"config of {path}")
        elif any(p.is_file() for p in beside):
            config = BertConfig.from_json_file(next(p for p in beside if p.is_file()))
        else:
            raise FileNotFoundError(f"no config for checkpoint {path}: pass --config_file (a bert_config.json)")
    model = cls(config, **model_kwargs)
    return model, load_checkpoint_state(model, state, source=str(path))


# ----------------------------------------------------------------------------------------------------------------
# 4. Writing: a Hugging Face directory, or an NVIDIA-style state dict.


def export_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under Hugging Face names, with the true vocabulary size and no tied duplicates."""
    prefix = "bert." if isinstance(model, BertModel) else ""
    vocab_size = model.config.vocab_size
    out = {}
    for key, value in model.state_dict().items():
        key = prefix + key
        if REDUNDANT_KEYS.match(key):
            continue
        if key in VOCAB_ROWS:
            value = value[:vocab_size]  # drop the padding rows (pad_vocab_size_multiple)
        out[key] = value.detach().contiguous().cpu()
    return out


def hf_config(config: BertConfig, architecture: str) -> dict[str, Any]:
    """A config.json that transformers' BertConfig reads (true vocabulary size, no padding key)."""
    d = config.to_dict()
    d.pop("pad_vocab_size_multiple", None)
    d.update(
        model_type="bert",
        architectures=[architecture],
        pad_token_id=0,
        position_embedding_type="absolute",
        tie_word_embeddings=True,
    )
    if d["hidden_act"] in ("bias_gelu",):
        d["hidden_act"] = "gelu"
    if d["hidden_act"] in ("gelu_tanh", "gelu_pytorch_tanh"):
        d["hidden_act"] = "gelu_pytorch_tanh"
    return d


def save_hf_directory(
    model: nn.Module, out_dir: str | os.PathLike, vocab_file: str | os.PathLike | None = None
) -> None:
    """Write config.json, model.safetensors (and vocab.txt) that transformers' from_pretrained loads."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = export_state_dict(model)
    architecture = type(model).__name__
    config = hf_config(model.config, architecture)
    if isinstance(model, BertModel):  # transformers' BertModel has no `bert.` prefix
        state = {k[len("bert.") :]: v for k, v in state.items()}
    if isinstance(model, BertForSequenceClassification):
        config["num_labels"] = model.num_labels
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(model.num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(model.num_labels)}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    atomic_write_json(out_dir / "config.json", config)
    if vocab_file is not None:
        with atomic_open(out_dir / "vocab.txt", "wb") as f:
            f.write(Path(vocab_file).read_bytes())


def nvidia_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Tensors under NVIDIA DeepLearningExamples' names (`dense_act`) with the vocabulary padded to a multiple
    of 8, as its run_pretraining.py and run_squad.py load them."""
    out = {}
    for key, value in export_state_dict(model).items():  # keys with `bert.`, even for a bare BertModel
        if key in VOCAB_ROWS:
            value = _fit_vocab_rows(value, ((value.shape[0] + 7) // 8) * 8)
        out[re.sub(r"(intermediate|transform|pooler)\.dense\.", r"\1.dense_act.", key)] = value
    if "cls.predictions.bias" in out:  # NVIDIA's checkpoints carry the tied decoder weight explicitly
        out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
    if isinstance(model, BertModel):  # NVIDIA's BertModel, like Hugging Face's, has no `bert.` prefix
        out = {k[len("bert.") :]: v for k, v in out.items()}
    return out


# --------------------------------------------------------------------------------------------------------------
# Checkpoints: ckpt_<step>.pt


class CheckpointManager:
    """The ckpt_<step>.pt files of one folder. `owns(step)` says which of them belong to this run (pre-training:
    the current phase's), the ones rotation and resume look at. Writes are atomic (atomic_io.atomic_torch_save: a
    temporary file, fsync, rename), reads use torch.load(weights_only=True), so a damaged or hostile file can
    neither run code nor be mistaken for a complete one."""

    NAME = re.compile(r"^ckpt_(\d+)\.pt$")

    def __init__(
        self,
        folder: str | Path,
        keep: int = 3,
        owns: Callable[[int], bool] = lambda step: True,
        log: Callable[[str], None] = lambda msg: None,
    ):
        self.folder, self.keep, self.owns, self.log = Path(folder), keep, owns, log

    def all(self) -> dict[int, Path]:
        """step -> path of every ckpt_<step>.pt in the folder, by step (interrupted writes are not listed)."""
        if not self.folder.is_dir():
            return {}
        found = {int(m.group(1)): p for p in self.folder.iterdir() if (m := self.NAME.match(p.name))}
        return dict(sorted(found.items()))

    def mine(self) -> dict[int, Path]:
        return {s: p for s, p in self.all().items() if self.owns(s)}

    @staticmethod
    def read(path: str | Path) -> dict[str, Any]:
        return load_pt(path)

    def newest_readable(self, required: set[str]) -> dict[str, Any] | None:
        """The newest of this run's checkpoints that loads and holds the `required` keys (older ones are tried
        when the newest is damaged, with a message for each), or None when there is none."""
        found = self.mine()
        for step in reversed(found):
            try:
                ckpt = self.read(found[step])
            except Exception as e:  # truncated or corrupted by something outside our atomic writes: fall back
                self.log(f"{cli.describe_error(e)}; trying an older one")
                continue
            if required <= set(ckpt):
                return ckpt
            self.log(f"checkpoint {found[step]} is incomplete (no training state); trying an older one")
        return None

    def save(self, step: int, payload: dict[str, Any]) -> Path:
        """Write ckpt_<step>.pt atomically, then drop this run's oldest beyond `keep` (never the new one)."""
        path = self.folder / f"ckpt_{step}.pt"
        atomic_io.atomic_torch_save(payload, path)
        others = [p for s, p in self.mine().items() if s != step]
        for old in others[: max(len(others) - (self.keep - 1), 0)]:
            old.unlink(missing_ok=True)
        self.log(f"saved {path}")
        return path

    def remove_interrupted_writes(self) -> None:
        """Temporary files left by a write that was killed (atomic_io.atomic_open names them .<name>.*.tmp)."""
        for p in self.folder.glob(".ckpt_*.pt.*.tmp"):
            p.unlink(missing_ok=True)
