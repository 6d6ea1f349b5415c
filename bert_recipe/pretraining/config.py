"""The configuration of a pre-training run, in sections: data, model, training, optimizer, precision, parallelism,
checkpoint, evaluation, logging, debug. Each section is a frozen dataclass; each field is a command-line flag of
run_pretraining.py with the same name and default (NVIDIA's interface: scripts/run_pretraining.sh and run.sub pass
them), and the docstring under the field is its --help text (torchtitan's style; flags.field_docs reads them).

    cfg = run_pretraining.parse_args(argv)      # flags.parse: the sections from the flags, then `rules`
    cfg.training.max_steps, cfg.checkpoint.output_dir, cfg.flags()["max_steps"]

`PretrainConfig.flags()` is the flat {flag: value} dict that the PARAMETER log line and every checkpoint's "args"
record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bert_recipe.io.flags import Config, flag
from bert_recipe.pretraining.data_stream import ShardSpec
from bert_recipe.training import precision_policy


@dataclass(frozen=True)
class DataConfig:
    """The training shards and how they are read."""

    input_dir: str | None = None
    """folder of training shards: every *.hdf5 in it (NVIDIA's layout)"""
    vocab_file: str | None = None
    """vocab.txt: checked against the config's vocab_size; needed by --dynamic_masking"""
    max_seq_length: int = 512
    """sequence length S of the shards (checked)"""
    max_predictions_per_seq: int = 80
    """masked positions per sequence: the shards' width is checked against it; the cap for --dynamic_masking"""
    dynamic_masking: bool = False
    """draw new masks every epoch (for shards written unmasked with create_pretraining_data.py
    --no_static_masking; masked ones are unmasked first)"""
    masked_lm_prob: float = 0.15
    """fraction of tokens masked by --dynamic_masking"""
    length_bins: int = 0
    """LDDL-style length binning (phase 2): group samples of similar real length into micro-batches, N bins of
    max_seq_length / N each, every micro-batch cut to its bin's upper length (0: off)"""
    mix_shards: int = 1
    """shuffle the samples of K shards together (K shards in memory at once; 1: one shard at a time, NVIDIA's
    way). A shard holds a few hundred articles, each dupe_factor times: a small batch trains on one for thousands
    of steps and chases its words; 8 or more makes the stream closer to the corpus"""
    num_workers: int = 4
    """DataLoader worker processes building micro-batches from the shard in memory (0: in the training
    process)"""

    @property
    def shard_spec(self) -> ShardSpec:
        return ShardSpec(self.max_seq_length, self.max_predictions_per_seq, self.dynamic_masking)


@dataclass(frozen=True)
class ModelConfig:
    """The model and its starting weights."""

    config_file: str | None = flag(None, required=True)
    """the model's bert_config.json"""
    init_checkpoint: str | None = None
    """start from these weights: a Hugging Face folder, an NVIDIA .pt, a ckpt_<step>.pt, a state-dict file
    (optimizer state is not taken)"""
    bert_model: str | None = None
    """accepted for compatibility with NVIDIA's scripts and ignored: the model comes from --config_file"""
    mlm_bias_init: Literal["zero", "unigram"] = "zero"
    """the masked-LM output bias of a model trained from scratch: zero (BERT's) or unigram (the log-frequency of
    each token among the first training shard's masked targets, add-one smoothed: the model starts at the unigram
    loss instead of learning word frequencies first; measured in bench/STUDIES.md)"""
    no_nsp: bool = False
    """train on the masked-LM loss alone (RoBERTa's choice); the next-sentence loss is still computed and logged,
    its head gets zero gradients (measured in bench/STUDIES.md)"""
    unpad: Literal["auto", "always", "never"] = "auto"
    """run the encoder on the real tokens only when a micro-batch has padding: auto (yes, except inside a
    whole-model graph, --compile_scope model), always, never (every position of the padded rows through every
    layer). Measured fastest on an H200 in both phases (README, speed on one GPU)"""
    varlen_kernel: Literal["auto", "varlen_attn", "flash_varlen", "flash_attn", "padded_sdpa"] = "auto"
    """the unpadded path's attention kernel: auto (bert_attention.choose_kernel's rule: FlashAttention-2's varlen
    kernel on a GPU), or one by name; a named kernel that cannot run here gives way to the rule, and the log says
    why"""


@dataclass(frozen=True)
class TrainingConfig:
    """How much is trained, in what batches."""

    do_train: bool = False
    """train (without it, only evaluate on --eval_dir)"""
    train_batch_size: int = 32
    """sequences per process per optimizer step (all micro-batches together)"""
    gradient_accumulation_steps: int = 1
    """micro-batches per optimizer step: micro-batch = train_batch_size / gradient_accumulation_steps (must
    divide)"""
    max_steps: int = 1000
    """optimizer steps of this phase in total (the schedule's length)"""
    steps_this_run: int = -1
    """stop after this many steps in this invocation (then checkpoint); -1: run to --max_steps"""
    seed: int = 42
    """random seed: model init, data order, dropout (rank r uses seed + r for dropout)"""

    @property
    def micro_batch_size(self) -> int:
        return self.train_batch_size // self.gradient_accumulation_steps


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer and its learning-rate schedule."""

    optimizer: Literal["nvlamb", "adamw"] = "nvlamb"
    """nvlamb: NVIDIA's LAMB (per-tensor trust ratio; the recipe for large batches); adamw: decoupled AdamW with
    bias correction (what transformers, Cramming and ModernBERT pre-train with; measured better at small batches,
    bench/STUDIES.md). Both clip the global gradient norm at --max_grad_norm"""
    learning_rate: float = 5e-5
    """peak learning rate"""
    warmup_proportion: float = 0.01
    """fraction of --max_steps with a linear warm-up of the learning rate"""
    lr_schedule: Literal["poly", "linear", "cosine", "constant"] = "poly"
    """learning-rate schedule after warm-up (poly: NVIDIA's (1-progress)^0.5)"""
    weight_decay: float = 0.01
    """decoupled weight decay (not for biases and LayerNorm)"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip (<= 0: off)"""
    use_nvlamb: bool = False
    """apply LAMB's trust ratio also to the no-decay group (NVIDIA's NVLAMB switch; --optimizer nvlamb only)"""


@dataclass(frozen=True)
class PrecisionConfig:
    """How the maths runs (precision_policy.py)."""

    precision: str = precision_policy.flag()
    """fp16: autocast float16 and a GradScaler (overflow steps are skipped); bf16: autocast bfloat16, no loss
    scaling. The old --fp16/--amp/--bf16 switches are aliases"""
    loss_scale: float = 0.0
    """fp16 loss scale: 0 = dynamic (starts at --init_loss_scale, halves on overflow), > 0 = this static scale"""
    init_loss_scale: float = 2.0**20
    """initial dynamic fp16 loss scale"""
    fp8: bool = False
    """the encoder layers' matrix products in float8 (fp8.py: torchao's float8 training, one scale per tensor each
    step); everything else runs in --precision. Needs the torchao package and a GPU with fp8 tensor cores (Ada,
    Hopper); emulated on a CPU"""


@dataclass(frozen=True)
class ParallelismConfig:
    """Data parallelism, memory and compilation (parallelize.apply_parallelism_and_precision)."""

    allreduce_post_accumulation: bool = False
    """all-reduce gradients once per optimizer step (DDP no_sync on the other micro-batches) instead of after
    every micro-batch"""
    allreduce_post_accumulation_fp16: bool = False
    """all-reduce gradients in fp16 (bf16 with --bf16 on GPUs): half the bytes"""
    checkpoint_activations: bool = False
    """recompute each layer's activations in the backward pass (less memory, about 30% more compute)"""
    compile: bool = False
    """torch.compile the model (the default on a GPU: see --no_compile)"""
    no_compile: bool = False
    """eager mode: the default on the CPU, where compiling costs minutes of a short run. On GPUs compiling is the
    default because it was measured faster (BERT-large on an H100, bf16: phase 1 +30%, phase 2 +15%)"""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile's mode: reduce-overhead adds CUDA graphs (static shapes: the fixed-slot head and the padded
    path under compile give them)"""
    compile_backend: str = "inductor"
    """torch.compile's backend: inductor, or one that traces the same graphs without generating code (aot_eager,
    eager: for debugging a compile, and for the tests' rehearsal of the GPU call)"""
    compile_scope: Literal["layers", "model"] = "layers"
    """what torch.compile takes: each encoder layer (and the embeddings and the masked-LM head) on its own, so one
    graph serves all layers and the unpadded path compiles too; or the whole model in one graph (the padded path
    only)"""
    static_token_granule: int = 0
    """experimental, not yet measured on a GPU (bench/STUDIES.md): the unpadded layout's rows rounded up to a multiple
    of N tokens (at most 8 sizes; cuda_graphs.fixed_rows), so a compiled step sees static shapes and
    --compile_mode reduce-overhead replays it as CUDA graphs (0: off)"""
    bit_dropout_masks: bool = False
    """experimental, not yet measured on a GPU (bench/STUDIES.md): keep the encoder's hidden-dropout masks for the
    backward in 1 bit an element instead of a byte (bit_dropout.py: less memory, a different draw)"""
    no_cuda: bool = False
    """train on the CPU even when a GPU is present"""
    local_rank: int = flag(-1, "--local-rank")
    """accepted for torch.distributed.launch compatibility; the LOCAL_RANK environment variable is used"""

    @property
    def compile_choice(self) -> bool | None:
        """True/False as asked, None: the default for the device (compiled on a GPU only)."""
        return True if self.compile else False if self.no_compile else None


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints, resuming, and the two phases."""

    output_dir: str | None = flag(None, required=True)
    """where ckpt_<step>.pt checkpoints are written"""
    num_steps_per_checkpoint: int = 100
    """write ckpt_<step>.pt every this many steps"""
    keep_checkpoints: int = 3
    """keep the newest this many checkpoints of the phase"""
    skip_checkpoint: bool = False
    """write no checkpoints at all"""
    resume_from_checkpoint: bool = False
    """continue from the newest complete checkpoint of the phase in --output_dir (start fresh when there is
    none)"""
    resume_step: int = -1
    """with --resume_from_checkpoint: continue from ckpt_<resume_step>.pt instead"""
    phase2: bool = False
    """phase 2: start from phase 1's ckpt_<phase1_end_step>.pt with a fresh optimizer"""
    phase1_end_step: int = 7038
    """the last step of phase 1 (phase 2 checkpoints are numbered after it)"""

    @property
    def phase(self) -> int:
        return 2 if self.phase2 else 1

    @property
    def step_offset(self) -> int:
        """What this phase's steps are counted after in checkpoint names and logs (NVIDIA's numbering)."""
        return self.phase1_end_step if self.phase2 else 0


@dataclass(frozen=True)
class EvaluationConfig:
    """Held-out masked-LM numbers (validation.Validator)."""

    eval_dir: str | None = None
    """folder of held-out *.hdf5 shards: masked-LM accuracy and loss"""
    eval_steps: int = flag(0, "--num_steps_per_eval")
    """evaluate every this many steps (0: only at the end)"""
    eval_batch_size: int = 0
    """sequences per process per evaluation batch (0: the training micro-batch)"""
    max_eval_samples: int = 0
    """evaluate on the first this many held-out samples (0: all)"""


@dataclass(frozen=True)
class LoggingConfig:
    """What rank 0 reports."""

    json_summary: str = flag("results/dllogger.json", "--json_summary", name="--json-summary")
    """dllogger-style JSON lines log (rank 0)"""
    log_freq: int = 1
    """log every this many steps"""
    throughput_warmup_steps: int = 3
    """steps left out of training_sequences_per_second (start-up, compilation)"""
    profile_steps: int = 0
    """profile this many steps after the throughput warm-up with torch.profiler (rank 0; they are left out of the
    throughput too) and write <output_dir>/profile.json: the top kernels by device time, what share of the step
    each part takes (matrix products, attention, fused kernels, optimizer, copies) and how long the GPU waited"""
    disable_progress_bar: bool = False
    """no tqdm progress bar"""


@dataclass(frozen=True)
class DebugConfig:
    """Faults the tests provoke on purpose; run_pretraining.main installs them as Trainer hooks."""

    debug_inject_inf_at_step: int = -1
    """TEST ONLY: put an inf into a gradient on the first attempt at this step (with --precision fp16)"""


@dataclass(frozen=True)
class PretrainConfig(Config):
    """Every flag of run_pretraining.py, by section (in --help's order)."""

    data: DataConfig = field(default_factory=DataConfig)
    """data"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """model"""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """training"""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """optimizer and learning-rate schedule"""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """precision"""
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    """parallelism and memory"""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """checkpoints and phases"""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """evaluation"""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """logging"""
    debug: DebugConfig = field(default_factory=DebugConfig)
    """debugging (test only)"""

    def rules(self) -> list[tuple[bool, str]]:
        """(refused, why) for every rule between flags, in the order they are reported."""
        d, m, t, o, p = self.data, self.model, self.training, self.optimizer, self.precision
        c, e, lg = self.checkpoint, self.evaluation, self.logging
        return [
            (t.train_batch_size < 1, f"--train_batch_size {t.train_batch_size} must be at least 1"),
            (
                t.gradient_accumulation_steps < 1,
                f"--gradient_accumulation_steps {t.gradient_accumulation_steps} must be at least 1",
            ),
            (
                t.train_batch_size % max(t.gradient_accumulation_steps, 1) != 0,
                f"--train_batch_size {t.train_batch_size} is not divisible by --gradient_accumulation_steps "
                f"{t.gradient_accumulation_steps}",
            ),
            (t.max_steps < 1, f"--max_steps {t.max_steps} must be at least 1"),
            (t.steps_this_run == 0 or t.steps_this_run < -1, "--steps_this_run must be positive (or -1: all)"),
            (not 0.0 <= o.warmup_proportion <= 1.0, f"--warmup_proportion {o.warmup_proportion} must be in [0, 1]"),
            (o.learning_rate < 0, f"--learning_rate {o.learning_rate} must not be negative"),
            (p.loss_scale < 0, f"--loss_scale {p.loss_scale} must be 0 (dynamic) or positive (static)"),
            (t.seed < 0, f"--seed {t.seed} must be a non-negative integer"),
            (lg.log_freq < 1, f"--log_freq {lg.log_freq} must be at least 1"),
            (lg.profile_steps < 0, f"--profile_steps {lg.profile_steps} must not be negative"),
            (
                lg.profile_steps > 0 and lg.throughput_warmup_steps < 1,
                "--profile_steps profiles the steps after the warm-up: give --throughput_warmup_steps 1 or more (the "
                "first step compiles and allocates)",
            ),
            (c.num_steps_per_checkpoint < 1, f"--num_steps_per_checkpoint {c.num_steps_per_checkpoint} must be >= 1"),
            (c.keep_checkpoints < 1, f"--keep_checkpoints {c.keep_checkpoints} must be at least 1"),
            (d.num_workers < 0, f"--num_workers {d.num_workers} must not be negative"),
            (
                e.eval_steps < 0 or e.eval_batch_size < 0 or e.max_eval_samples < 0,
                "--eval_steps, --eval_batch_size and --max_eval_samples must not be negative",
            ),
            (
                self.parallelism.compile and self.parallelism.no_compile,
                "--compile and --no_compile contradict each other: pass one",
            ),
            (
                self.parallelism.static_token_granule < 0,
                f"--static_token_granule {self.parallelism.static_token_granule} must not be negative (0: off)",
            ),
            (
                self.parallelism.static_token_granule > 0 and m.unpad == "never",
                "--static_token_granule rounds the unpadded layout: it needs --unpad auto or always",
            ),
            (
                o.use_nvlamb and o.optimizer != "nvlamb",
                "--use_nvlamb is a switch of --optimizer nvlamb: drop it with --optimizer adamw",
            ),
            (c.resume_step != -1 and not c.resume_from_checkpoint, "--resume_step needs --resume_from_checkpoint"),
            (c.phase2 and c.phase1_end_step < 0, f"--phase1_end_step {c.phase1_end_step} must not be negative"),
            (
                self.debug.debug_inject_inf_at_step > 0 and p.precision != "fp16",
                "--debug_inject_inf_at_step is for --precision fp16 runs only",
            ),
            (
                d.dynamic_masking and not d.vocab_file,
                "--dynamic_masking needs --vocab_file (the [MASK] id and the vocabulary size)",
            ),
            (not 0.0 < d.masked_lm_prob <= 1.0, f"--masked_lm_prob {d.masked_lm_prob} must be in (0, 1]"),
            (d.mix_shards < 1, f"--mix_shards {d.mix_shards} must be at least 1 (1: one shard at a time)"),
            (
                not 0 <= d.length_bins <= d.max_seq_length,
                f"--length_bins {d.length_bins} must be in [0, max_seq_length={d.max_seq_length}] (0: off)",
            ),
            (not t.do_train and not e.eval_dir, "nothing to do: pass --do_train (and/or --eval_dir to evaluate)"),
            (t.do_train and not d.input_dir, "--do_train needs --input_dir (a folder of .hdf5 shards)"),
            (
                Path(c.output_dir).exists() and not Path(c.output_dir).is_dir(),
                f"--output_dir {c.output_dir} is a file: name a folder for the checkpoints",
            ),
            (Path(lg.json_summary).is_dir(), f"--json-summary {lg.json_summary} is a folder: name the log file"),
            (
                m.init_checkpoint is not None and not Path(m.init_checkpoint).exists(),
                f"--init_checkpoint {m.init_checkpoint} not found: give a ckpt_<step>.pt, an NVIDIA .pt or a Hugging "
                "Face folder",
            ),
        ]
