"""The configurations of the fine-tuning scripts (run_glue.py, run_squad.py, run_swag.py), in the sections of their
--help: data, model, what to run, training, runtime (and SQuAD's windows). Each section is a frozen dataclass; each
field is a command-line flag with the same name and default (NVIDIA's interface), and the docstring under the field
is its --help text (flags.field_docs reads them, a base class's too).

The Finetune* sections hold the flags every script shares, with the defaults and help texts most scripts use; a
script's section derives from one to add its own flags or to re-declare a field whose default or help differs, and
its configuration (GlueConfig, SquadConfig, SwagConfig) re-declares the sections it replaces:

    cfg = flags.parse(GlueConfig, "run_glue.py", __doc__, argv)
    cfg.training.train_batch_size, cfg.run.do_train, cfg.flags()["seed"]

`FinetuneConfig.rules` holds the checks of the shared flags, the script's `positive` flags among them, then the
script's own (`task_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from bert_recipe.io.flags import Config, flag
from bert_recipe.tasks.squad_answers import QASettings
from bert_recipe.training import precision_policy

# ----------------------------------------------------------------------------------------------------------------
# The shared sections


@dataclass(frozen=True)
class FinetuneData:
    """The inputs and where the results go."""

    output_dir: str | None = flag(None, required=True)
    """where results, predictions and the model go"""


@dataclass(frozen=True)
class FinetuneModel:
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
class FinetuneRun:
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
class FinetuneTraining:
    """The optimizer, its schedule and the precision; a script adds its prediction batch flag."""

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
    precision: str = precision_policy.flag(precision_policy.HELP_FINETUNING)  # the --help is the rule for auto
    loss_scale: float = 0.0
    """fp16 loss scale: 0 = dynamic (starts at 2**16, halves on overflow), > 0 = this static scale"""


@dataclass(frozen=True)
class FinetuneRuntime:
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
    """The flags every fine-tuning script shares, by section (in --help's order); a script's configuration derives
    from it."""

    data: FinetuneData = field(default_factory=FinetuneData)
    """data"""
    model: FinetuneModel = field(default_factory=FinetuneModel)
    """model"""
    run: FinetuneRun = field(default_factory=FinetuneRun)
    """what to run"""
    training: FinetuneTraining = field(default_factory=FinetuneTraining)
    """training"""
    runtime: FinetuneRuntime = field(default_factory=FinetuneRuntime)
    """runtime"""

    debug_section: ClassVar[str | None] = "runtime"
    positive: ClassVar[tuple[str, ...]] = ()  # the script's flags that must be at least 1

    def rules(self) -> list[tuple[bool, str]]:
        """(refused, why) for the shared flags' impossible values and the script's `positive` flags below 1, then
        the script's own rules (`task_rules`), in the order they are reported."""
        r, t, rt = self.run, self.training, self.runtime
        flags, output_dir = self.flags(), self.data.output_dir
        return [
            (
                not (r.do_train or r.do_eval or r.do_predict),
                "nothing to do: pass at least one of --do_train, --do_eval, --do_predict",
            ),
            *[(flags[name] < 1, f"--{name} must be positive, got {flags[name]}") for name in self.positive],
            (
                t.gradient_accumulation_steps < 1 or t.train_batch_size % max(t.gradient_accumulation_steps, 1) != 0,
                f"--train_batch_size {t.train_batch_size} must be a positive multiple of --gradient_accumulation_steps "
                f"{t.gradient_accumulation_steps}",
            ),
            (t.train_batch_size < 1, f"--train_batch_size must be positive, got {t.train_batch_size}"),
            (
                not 0.0 <= t.warmup_proportion <= 1.0,
                f"--warmup_proportion must be in [0, 1], got {t.warmup_proportion}",
            ),
            (
                r.do_train and t.max_steps <= 0 and t.num_train_epochs <= 0,
                "--num_train_epochs must be positive (or give --max_steps)",
            ),
            (
                t.loss_scale < 0 or rt.log_freq < 1 or rt.num_workers < 0,
                "--loss_scale and --num_workers must not be negative, --log_freq must be positive",
            ),
            (
                bool(output_dir) and Path(output_dir).exists() and not Path(output_dir).is_dir(),
                f"--output_dir {output_dir} is a file: name a folder for the results",
            ),
            (
                bool(rt.json_summary) and Path(rt.json_summary).is_dir(),
                f"--json-summary {rt.json_summary} is a folder: name the log file",
            ),
            *self.task_rules(),
        ]

    def task_rules(self) -> list[tuple[bool, str]]:
        """The script's own rules, after the shared ones."""
        return []


# ----------------------------------------------------------------------------------------------------------------
# run_glue.py


@dataclass(frozen=True)
class GlueData(FinetuneData):
    """The GLUE task and its folder."""

    task_name: str | None = flag(None, required=True)
    """GLUE task, case-insensitive: cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli (also sst2, stsb,
    mnli-mm)"""
    data_dir: str | None = flag(None, required=True)
    """the task's GLUE folder (train.tsv, dev.tsv, ...)"""
    max_train_examples: int | None = None
    """train on the first N training examples only (quick CPU runs)"""
    max_eval_examples: int | None = None
    """evaluate/predict on the first N examples of each dev/test set only"""
    predict_split: Literal["dev", "test"] = "dev"
    """what --do_predict writes to predictions.json: the dev set(s) or GLUE's unlabeled test set(s)"""


@dataclass(frozen=True)
class GlueTraining(FinetuneTraining):
    """The training flags with GLUE's seed and evaluation batch."""

    seed: int = 2
    eval_batch_size: int = 128
    """sequences per evaluation batch"""


@dataclass(frozen=True)
class GlueConfig(FinetuneConfig):
    """Every flag of run_glue.py."""

    data: GlueData = field(default_factory=GlueData)
    """task and data"""
    training: GlueTraining = field(default_factory=GlueTraining)

    positive: ClassVar[tuple[str, ...]] = ("eval_batch_size", "max_seq_length")


# ----------------------------------------------------------------------------------------------------------------
# run_squad.py


@dataclass(frozen=True)
class SquadData(FinetuneData):
    """SQuAD's files and the feature cache."""

    train_file: str | None = None
    """SQuAD json for training, e.g. train-v1.1.json"""
    predict_file: str | None = None
    """SQuAD json to predict (and evaluate), e.g. dev-v1.1.json"""
    version_2_with_negative: bool = False
    """SQuAD 2.0: questions may have no answer (predicted as "")"""
    cache_dir: str | None = None
    """feature cache folder (default: beside the input file if writable, else <output_dir>/cache)"""
    skip_cache: bool = False
    """neither read nor write cached features"""


@dataclass(frozen=True)
class SquadModel(FinetuneModel):
    """SQuAD may start from random weights; its windows are longer."""

    init_checkpoint: str | None = None
    """ckpt_<step>.pt, an NVIDIA .pt, our fine-tuned model.pt, or a Hugging Face directory; without it the model
    starts from random weights (--config_file needed)"""
    max_seq_length: int = 384
    """tokens per window: [CLS] question [SEP] doc [SEP]"""


@dataclass(frozen=True)
class SquadRun(FinetuneRun):
    """What to run, in SQuAD's words, and the external evaluation script."""

    do_train: bool = False
    """fine-tune on --train_file"""
    do_eval: bool = False
    """score the predictions against --predict_file's answers (implies --do_predict)"""
    do_predict: bool = False
    """write predictions for --predict_file"""
    eval_script: str | None = None
    """also run this external script (e.g. the official evaluate-v1.1.py) on the predictions and log its output"""


@dataclass(frozen=True)
class SquadTraining(FinetuneTraining):
    """The training flags with SQuAD's prediction batch and length-grouped batches."""

    predict_batch_size: int = 64
    """windows per prediction batch"""
    group_by_length: bool = False
    """training batches of similar lengths (less padding; batches still in random order)"""


@dataclass(frozen=True)
class SquadRuntime(FinetuneRuntime):
    """The runtime flags with SQuAD's defaults."""

    num_workers: int = 0
    """DataLoader worker processes cutting the batches (the windows are in memory, so 0 is usually fastest)"""
    log_freq: int = 50
    use_env: bool = False
    """accepted for compatibility (the rank always comes from the environment)"""


@dataclass(frozen=True)
class SquadWindows:
    """How questions are cut into windows and answers read back (squad_answers.QASettings, whose defaults these are)."""

    doc_stride: int = QASettings.doc_stride
    """tokens between the starts of consecutive windows"""
    max_query_length: int = QASettings.max_query_length
    """questions are cut to this many tokens"""
    n_best_size: int = QASettings.n_best_size
    """answers kept per question in nbest_predictions.json"""
    max_answer_length: int = QASettings.max_answer_length
    """longest answer, in WordPiece tokens"""
    null_score_diff_threshold: float = QASettings.null_score_diff_threshold
    """v2.0: predict no answer when null score - best span score exceeds this"""
    verbose_logging: bool = False
    """accepted for compatibility; unused"""


@dataclass(frozen=True)
class SquadConfig(FinetuneConfig):
    """Every flag of run_squad.py."""

    data: SquadData = field(default_factory=SquadData)
    model: SquadModel = field(default_factory=SquadModel)
    run: SquadRun = field(default_factory=SquadRun)
    training: SquadTraining = field(default_factory=SquadTraining)
    runtime: SquadRuntime = field(default_factory=SquadRuntime)
    windows: SquadWindows = field(default_factory=SquadWindows)
    """windows and answers"""

    positive: ClassVar[tuple[str, ...]] = ("predict_batch_size", "doc_stride", "n_best_size", "max_answer_length")

    def task_rules(self) -> list[tuple[bool, str]]:
        """The files each mode needs, found, and windows with room for a document token."""
        d, m, r, w = self.data, self.model, self.run, self.windows
        files = {
            "train_file": d.train_file,
            "predict_file": d.predict_file,
            "eval_script": r.eval_script,
            "config_file": m.config_file,
            "vocab_file": m.vocab_file,
        }
        return [
            (r.do_train and not d.train_file, "--do_train needs --train_file (a SQuAD json such as train-v1.1.json)"),
            (
                (r.do_predict or r.do_eval) and not d.predict_file,
                "--do_predict/--do_eval need --predict_file (a SQuAD json such as dev-v1.1.json)",
            ),
            *[
                (value is not None and not Path(value).is_file(), f"--{name} {value} not found")
                for name, value in files.items()
            ],
            (
                m.max_seq_length < w.max_query_length + 4,
                f"--max_seq_length {m.max_seq_length} must be at least --max_query_length {w.max_query_length} + 4 "
                "([CLS], two [SEP] and one document token)",
            ),
        ]


# ----------------------------------------------------------------------------------------------------------------
# run_swag.py


@dataclass(frozen=True)
class SwagData(FinetuneData):
    """SWAG's folder and its splits."""

    data_dir: str | None = flag(None, required=True)
    """SWAG's folder: train.csv, val.csv (test.csv)"""
    max_train_examples: int | None = None
    """train on the first N training examples only (quick CPU runs)"""
    max_eval_examples: int | None = None
    """evaluate/predict on the first N examples of val.csv (test.csv) only"""
    predict_split: Literal["val", "test"] = "val"
    """what --do_predict writes to predictions.json: val.csv or the unlabelled test.csv"""


@dataclass(frozen=True)
class SwagModel(FinetuneModel):
    """The model flags with SWAG's sequences."""

    max_seq_length: int = 128
    """longest [CLS] sent1 [SEP] sent2 ending [SEP] after WordPiece; longer ones are truncated longest-first"""


@dataclass(frozen=True)
class SwagRun(FinetuneRun):
    """What to run, in SWAG's files."""

    do_train: bool = False
    """fine-tune on train.csv"""
    do_eval: bool = False
    """score val.csv"""


@dataclass(frozen=True)
class SwagTraining(FinetuneTraining):
    """SWAG counts examples (4 sequences each); the BERT paper's SWAG settings: batch 16, learning rate 2e-5."""

    train_batch_size: int = 16
    learning_rate: float = 2e-5
    eval_batch_size: int = 64
    """examples per evaluation batch"""


@dataclass(frozen=True)
class SwagConfig(FinetuneConfig):
    """Every flag of run_swag.py."""

    data: SwagData = field(default_factory=SwagData)
    model: SwagModel = field(default_factory=SwagModel)
    run: SwagRun = field(default_factory=SwagRun)
    training: SwagTraining = field(default_factory=SwagTraining)

    positive: ClassVar[tuple[str, ...]] = ("eval_batch_size",)

    def task_rules(self) -> list[tuple[bool, str]]:
        """Room for [CLS] and two [SEP]."""
        return [
            (self.model.max_seq_length < 3, f"--max_seq_length must be at least 3, got {self.model.max_seq_length}")
        ]
