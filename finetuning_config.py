"""The configuration of a fine-tuning run (run_squad.py, run_glue.py, run_swag.py), in the sections of their --help:
data, model, what to run, training, runtime. Each section is a frozen dataclass whose fields are the flags every
fine-tuning script shares (NVIDIA's names), with the defaults and help texts most scripts use; a script derives a
section to add its own flags or to re-declare the few whose default or help differ (config.field_docs reads the
docstrings of base classes too), and makes its configuration with one `make_config` call:

    SwagConfig = finetuning_config.make_config("SwagConfig", data=SwagData, ..., positive=("eval_batch_size",))
    cfg = config.parse(SwagConfig, "run_swag.py", __doc__, argv)
    cfg.training.train_batch_size, cfg.run.do_train, cfg.flags()["seed"]

The flags of the SHARED sections come first on the usage line (and in each group), --debug after them, then the
script's own (`FinetuneConfig.flag_order`): the order the scripts' --help always had. `split_data` makes the data
section of a task whose --data_dir holds its splits (GLUE, SWAG). `FinetuneConfig.rules` holds the checks of the
shared flags, the script's `positive` flags among them, then the script's own (`task_rules`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Sequence

import precision as precision_policy
from config import Config, flag


@dataclass(frozen=True)
class DataConfig:
    """The inputs and where the results go."""

    output_dir: str | None = flag(None, required=True)
    """where results, predictions and the model go"""


@dataclass(frozen=True)
class ModelConfig:
    """The model, its vocabulary and its input length."""

    init_checkpoint: str | None = flag(None, required=True)
    """ckpt_<step>.pt, an NVIDIA .pt, our fine-tuned model.pt, or a Hugging Face directory"""
    config_file: str | None = None
    """bert_config.json; default: the config inside or beside --init_checkpoint"""
    vocab_file: str | None = None
    """vocab.txt; default: vocab.txt in or beside --init_checkpoint"""
    do_lower_case: bool = False
    """lower-case the input (uncased models)"""
    max_seq_length: int = 128
    """longest [CLS] A [SEP] B [SEP] after WordPiece; longer pairs are truncated longest-first"""
    bert_model: str | None = None
    """accepted for compatibility with the original; unused"""


@dataclass(frozen=True)
class RunConfig:
    """What to run."""

    do_train: bool = False
    """fine-tune on train.tsv"""
    do_eval: bool = False
    """score the dev set(s)"""
    do_predict: bool = False
    """write predictions.json (see --predict_split)"""
    skip_checkpoint: bool = False
    """do not save the fine-tuned model"""


@dataclass(frozen=True)
class TrainingConfig:
    """The optimizer, its schedule and the precision; a script adds its prediction batch flag (`EvalBatch`,
    `PredictBatch`)."""

    train_batch_size: int = 32
    """sequences per optimizer step per process (split into --gradient_accumulation_steps parts)"""
    learning_rate: float = 5e-5
    """peak learning rate of AdamW"""
    weight_decay: float = 0.01
    """decoupled weight decay (not on biases/LayerNorm)"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip (<= 0: off)"""
    num_train_epochs: float = 3.0
    """epochs (fractions allowed)"""
    max_steps: float = -1.0
    """optimizer steps; > 0 overrides --num_train_epochs"""
    warmup_proportion: float = 0.1
    """fraction of the steps with linear warm-up"""
    gradient_accumulation_steps: int = 1
    """micro-batches per optimizer step"""
    seed: int = 42
    """random seed (the new head, dropout, shuffling)"""
    precision: str = flag("auto", help=precision_policy.HELP_FINETUNING)
    loss_scale: float = 0.0
    """fp16 loss scale: 0 = dynamic (starts at 2**16, halves on overflow), > 0 = this static scale"""


@dataclass(frozen=True)
class EvalBatch(TrainingConfig):
    """The training flags with --eval_batch_size (GLUE's, SWAG's)."""

    eval_batch_size: int = 128
    """sequences per evaluation batch"""


@dataclass(frozen=True)
class PredictBatch(TrainingConfig):
    """The training flags with --predict_batch_size (SQuAD's)."""

    predict_batch_size: int = 64
    """windows per prediction batch"""


@dataclass(frozen=True)
class RuntimeConfig:
    """Processes, devices and logging."""

    num_workers: int = 0
    """DataLoader worker processes"""
    no_cuda: bool = False
    """run on the CPU even when a GPU is present"""
    log_freq: int = 10
    """log the training loss every N optimizer steps"""
    json_summary: str | None = flag(None, name="--json-summary")
    """JSON-lines log file (default: <output_dir>/dllogger.json)"""
    disable_progress_bar: bool = flag(False, "--disable-progress-bar")
    """no tqdm bars"""
    local_rank: int | None = flag(None, "--local-rank")
    """set by torch.distributed.launch; torchrun's LOCAL_RANK environment variable is used"""


@dataclass(frozen=True)
class FinetuneConfig(Config):
    """The flags every fine-tuning script shares, by section (in --help's order); a script's configuration is made
    by `make_config` from sections derived from these."""

    data: DataConfig = field(default_factory=DataConfig)
    """data"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """model"""
    run: RunConfig = field(default_factory=RunConfig)
    """what to run"""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """training"""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """runtime"""

    positive: ClassVar[tuple[str, ...]] = ()  # the script's flags that must be at least 1

    @classmethod
    def flag_order(cls) -> list[tuple[str, str | None]]:
        """The flags declared in this module first, section by section, then --debug (in runtime), then the
        script's own, section by section."""
        order = [pair for pair in super().flag_order() if pair[1] is not None]
        kinds = {f.name: f.default_factory for f in dataclasses.fields(cls)}
        shared = [(section, name) for section, name in order if name in _shared_fields(kinds[section])]
        return [*shared, ("runtime", None), *[pair for pair in order if pair not in shared]]

    def rules(self) -> list[tuple[bool, str]]:
        """(refused, why) for the shared flags' impossible values and the script's `positive` flags below 1, then
        the script's own rules (`task_rules`), in the order they are reported."""
        r, t, rt = self.run, self.training, self.runtime
        flags, output_dir = self.flags(), self.data.output_dir
        return [
            (not (r.do_train or r.do_eval or r.do_predict),
             "nothing to do: pass at least one of --do_train, --do_eval, --do_predict"),
            *[(flags[name] < 1, f"--{name} must be positive, got {flags[name]}") for name in self.positive],
            (t.gradient_accumulation_steps < 1 or t.train_batch_size % max(t.gradient_accumulation_steps, 1) != 0,
             f"--train_batch_size {t.train_batch_size} must be a positive multiple of --gradient_accumulation_steps "
             f"{t.gradient_accumulation_steps}"),
            (t.train_batch_size < 1, f"--train_batch_size must be positive, got {t.train_batch_size}"),
            (not 0.0 <= t.warmup_proportion <= 1.0,
             f"--warmup_proportion must be in [0, 1], got {t.warmup_proportion}"),
            (r.do_train and t.max_steps <= 0 and t.num_train_epochs <= 0,
             "--num_train_epochs must be positive (or give --max_steps)"),
            (t.loss_scale < 0 or rt.log_freq < 1 or rt.num_workers < 0,
             "--loss_scale and --num_workers must not be negative, --log_freq must be positive"),
            (bool(output_dir) and Path(output_dir).exists() and not Path(output_dir).is_dir(),
             f"--output_dir {output_dir} is a file: name a folder for the results"),
            (bool(rt.json_summary) and Path(rt.json_summary).is_dir(),
             f"--json-summary {rt.json_summary} is a folder: name the log file"),
            *self.task_rules(),
        ]

    def task_rules(self) -> list[tuple[bool, str]]:
        """The script's own rules, after the shared ones."""
        return []


def _shared_fields(kind: type) -> set[str]:
    """The fields of section `kind` that one of the SHARED sections declares."""
    return {f.name for klass in kind.__mro__ if klass in SHARED for f in dataclasses.fields(klass)}


SHARED = (DataConfig, ModelConfig, RunConfig, TrainingConfig, EvalBatch, PredictBatch, RuntimeConfig)


def split_data(name: str, *, before: Sequence[tuple[str, Any, Any]] = (), data_dir_help: str, eval_sets: str,
               splits: tuple[str, str], split_help: str) -> type[DataConfig]:
    """The data section of a task whose --data_dir holds its splits (GLUE's, SWAG's): --data_dir (`data_dir_help`),
    --max_train_examples, --max_eval_examples (of `eval_sets`) and --predict_split (`splits`: the labelled split
    first, the default), after the script's flags in `before` ((name, type, field) as make_dataclass takes
    them)."""
    fields = [*before, ("data_dir", str | None, flag(None, required=True, help=data_dir_help)),
              ("max_train_examples", int | None,
               flag(None, help="train on the first N training examples only (quick CPU runs)")),
              ("max_eval_examples", int | None,
               flag(None, help=f"evaluate/predict on the first N examples of {eval_sets} only")),
              ("predict_split", Literal[splits], flag(splits[0], help=split_help))]
    return dataclasses.make_dataclass(name, fields, bases=(DataConfig,), frozen=True)


def make_config(name: str, *, positive: tuple[str, ...] = (), task_rules: Callable[[Any], list] | None = None,
                titles: dict[str, str] | None = None, **sections: type) -> type[FinetuneConfig]:
    """A script's frozen configuration: FinetuneConfig with the sections in `sections` (section name -> its
    class: a derived one in place of a shared section, or a section of the script's own, added after them),
    `titles` for --help groups whose title is not FinetuneConfig's (every added section needs one), `positive`
    flags and `task_rules` (cfg -> [(refused, why)]) for `FinetuneConfig.rules`."""
    titles = titles or {}
    fields = [(section, kind, field(default_factory=kind, metadata={"title": titles.get(section)}))
              for section, kind in sections.items()]
    namespace: dict[str, Any] = {"positive": positive, "__module__": __name__}
    if task_rules is not None:
        namespace["task_rules"] = task_rules
    return dataclasses.make_dataclass(name, fields, bases=(FinetuneConfig,), frozen=True, namespace=namespace)
