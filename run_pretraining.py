"""Pre-train BERT (masked LM + next-sentence prediction) with NVLAMB, mixed precision, gradient accumulation and
data parallelism, on NVIDIA's HDF5 shards; resumable to the bit.

Launch (flags as NVIDIA's run_pretraining.py; `--help` lists them all):
    python run_pretraining.py --input_dir shards/ --config_file bert_config.json --output_dir out/ --do_train ...
    torchrun --nproc_per_node 8 run_pretraining.py ...          (one process per GPU; NCCL on GPU, gloo on CPU)
    srun --ntasks-per-node 8 python run_pretraining.py ...      (Slurm's variables are read like torchrun's)

Read top to bottom: the flags (the sections and meanings are pretraining/config.py's) -> the model with its
starting weights -> main, which builds the parts (the data stream, parallelism and precision applied in one place,
the optimizer, the validator) and hands them to trainer.Trainer, whose `fit` is the loop. Steps and phases, the
loss, the checkpoint payload and the resume rules are described in trainer.py; the data stream (shard and sample
order, global micro-batches, the data position a checkpoint stores, dynamic masking, length bins) in
pretraining/data_stream.py.

Data. Every *.hdf5 in --input_dir, sorted by name, in an order drawn from --seed: the samples of a global step do
not depend on how they are split across processes (2 processes x 16 sequences see exactly what 1 process x 32
sees), so any number of processes can resume from a checkpoint. Packed shards (create_pretraining_data.py
--pack_sequences K) are detected by their next_sentence_positions array: each row holds up to K sequences, each
attending only to itself with its own positions and NSP read at its own [CLS] (modeling.BertForPreTraining);
--max_predictions_per_seq stays the per-sequence value (a packed row's slots are checked against K times it). The
stream, resume and checkpoints count rows, so "sequences" in the throughput are rows. --length_bins N (LDDL-style,
for phase 2) groups samples of similar real length into the same micro-batches; the order depends on the global
micro-batch, which must stay the same on resume. --mix_shards K shuffles K shards' samples together (one shard at
a time by default, NVIDIA's way): at a small batch one shard lasts thousands of steps; K must stay the same on
resume.

Stopping and resuming. ckpt_<step>.pt is written every --num_steps_per_checkpoint steps, at the end and on
SIGTERM/SIGUSR1/SIGINT (the current step finishes, a checkpoint is written, exit 75 = EX_TEMPFAIL: "run again to
resume"; a second SIGINT stops at once); the newest --keep_checkpoints of the phase are kept. DataLoader workers
ignore those signals and are ended by the training process; console output whose reader died (a launcher's `tee`)
is dropped rather than ending the run. `--resume_from_checkpoint` continues from the newest checkpoint of the phase
that loads (or starts fresh when there is none, so a requeued job can always pass it): with the same number of
processes the run continues bit for bit as if never interrupted; with another number the weights, optimizer,
schedule and data position continue exactly, and the dropout RNG is re-seeded.

Logging (rank 0): dllogger-style JSON lines (--json-summary): a PARAMETER line (every flag, flat), every
--log_freq steps step, average_loss, mlm_loss, nsp_loss, learning_rate, skipped_steps, loss_scale (and mfu on a
known GPU, from model FLOPs of real, non-padding tokens), the validator's eval_* numbers, and a FINAL line with
final_loss, training_sequences_per_second (rows trained, after --throughput_warmup_steps),
training_real_sequences_per_second and training_real_tokens_per_second (each sequence of a packed row; non-padding
tokens only), mfu and peak_memory_gib on GPUs, and e2e_train_time.
TensorBoard scalars in <output_dir>/tensorboard when the tensorboard package is installed. A tqdm bar.

Exit status: 0 when the phase ran to its --max_steps (or --steps_this_run); 75 when a signal stopped it after its
checkpoint; 1 with one line "run_pretraining.py: error: ..." for bad input or a failure (--debug: the traceback);
2 for a flag argparse refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bert_recipe.io import cli, flags
from bert_recipe.io.checkpoint_io import CheckpointError, load_checkpoint_state, read_state_dict
from bert_recipe.io.cli import InputError, describe_error
from bert_recipe.pretraining.config import PretrainConfig
from bert_recipe.pretraining.data_stream import Masker, PretrainingData, inspect_shards, list_shards, load_eval_set
from bert_recipe.pretraining.shard_format import packed_predictions
from bert_recipe.pretraining.trainer import (
    Trainer,
    TrainingParts,
    checkpoint_manager,
    find_resume_checkpoint,
    refuse_used_output_dir,
    validate_and_describe,
)
from bert_recipe.pretraining.validation import SpecialIds, Validator
from bert_recipe.training import dist_env
from bert_recipe.training.meter import RunLogger
from bert_recipe.training.parallelize import apply_parallelism_and_precision, compiled
from bert_recipe.training.precision_policy import Precision
from bert_recipe.training.stop_signals import EXIT_STOPPED, StopRequest
from modeling import RETIRED_CONFIG_KEYS, BertConfig, BertForPreTraining, count_parameters, set_execution
from optimization import make_optimizer, param_groups_for_bert
from schedulers import get_scheduler

# ---------------------------------------------------------------------------------------------------------------
# Flags: one per field of the sections in bert_recipe/pretraining/config.py, --help grouped by section, help from
# the docstrings (flags.build_parser); the rules between flags are PretrainConfig.rules


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(PretrainConfig, "run_pretraining.py", __doc__)


def parse_args(argv: list[str] | None = None) -> PretrainConfig:
    """The sections from the command line; InputError (one line, from main) for values that cannot work."""
    return flags.parse(PretrainConfig, "run_pretraining.py", __doc__, argv)


# ---------------------------------------------------------------------------------------------------------------
# The parts main builds


def build_model(cfg: PretrainConfig, resume: dict[str, Any] | None, log):
    """BertForPreTraining from --config_file, with its starting weights: random (seeded identically on every
    rank), or --init_checkpoint / phase 1's checkpoint when not resuming (the resume checkpoint's weights are
    loaded later, with the rest of its state)."""
    m, d = cfg.model, cfg.data
    try:
        config = BertConfig.from_json_file(m.config_file)
    except (OSError, ValueError) as e:
        raise InputError(f"--config_file: {describe_error(e)}") from e
    if d.vocab_file:
        from tokenization import load_vocab, vocab_fits_config

        try:
            vocab_size = len(load_vocab(d.vocab_file))
        except (OSError, ValueError) as e:
            raise InputError(f"--vocab_file {d.vocab_file}: {describe_error(e)}") from e
        if not vocab_fits_config(vocab_size, config.vocab_size):
            raise InputError(
                f"--vocab_file {d.vocab_file} has {vocab_size} tokens but the config's vocab_size is "
                f"{config.vocab_size}: the vocabulary the shards were written with must match the "
                "config (up to padding to a multiple of 8)"
            )
    if d.max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length {d.max_seq_length} exceeds the config's max_position_embeddings "
            f"{config.max_position_embeddings} ({m.config_file}): use shorter shards or a config with "
            "more positions"
        )
    retired = sorted(set(RETIRED_CONFIG_KEYS) & set(json.loads(Path(m.config_file).read_text(encoding="utf-8"))))
    if retired:
        log(
            f"--config_file {m.config_file}: {', '.join(retired)} ignored (how a model runs is not its config: use "
            "the flags --unpad, --varlen_kernel, --static_token_granule, --bit_dropout_masks)"
        )
    dist_env.set_seed(cfg.training.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = set_execution(BertForPreTraining(config), unpad=m.unpad, varlen_kernel=m.varlen_kernel)
    start = None
    if resume is None and cfg.checkpoint.phase2:
        start = m.init_checkpoint or Path(cfg.checkpoint.output_dir) / f"ckpt_{cfg.checkpoint.phase1_end_step}.pt"
        if not Path(start).exists():
            raise InputError(
                f"phase 2 starts from phase 1's checkpoint, but {start} does not exist: pass "
                "--init_checkpoint or the right --phase1_end_step / --output_dir"
            )
    elif resume is None and m.init_checkpoint:
        start = m.init_checkpoint
    elif resume is None and m.mlm_bias_init == "unigram" and cfg.training.do_train:
        from bert_recipe.pretraining.shard_format import unigram_log_prior

        first = sorted(Path(d.input_dir).glob("*.hdf5"))[0]
        prior = unigram_log_prior(first, model.cls.predictions.bias.numel())  # [V] float32, numpy
        with torch.no_grad():
            model.cls.predictions.bias.copy_(torch.from_numpy(prior))
        log(f"masked-LM output bias: log unigram frequencies of the masked targets of {first.name}")
    if start is not None:
        try:
            state, _ = read_state_dict(start)
            for line in load_checkpoint_state(model, state, source=str(start)).lines():
                log(line)
        except (OSError, CheckpointError) as e:
            raise InputError(f"cannot start from {start}: {describe_error(e)}") from e
        log(f"weights from {start}")
    return model


def build_optimizer(cfg: PretrainConfig, raw_model: torch.nn.Module, env: dist_env.DistEnv):
    """The optimizer (--optimizer, decay on weight matrices only) and its learning-rate schedule."""
    o = cfg.optimizer
    optimizer = make_optimizer(
        o.optimizer,
        param_groups_for_bert(raw_model, o.weight_decay),
        lr=o.learning_rate,
        weight_decay=o.weight_decay,
        max_grad_norm=o.max_grad_norm if o.max_grad_norm > 0 else None,
        use_nvlamb=o.use_nvlamb,
        prefer_fused=env.device.type == "cuda",
    )
    return optimizer, get_scheduler(o.lr_schedule, optimizer, o.warmup_proportion, cfg.training.max_steps)


def build_data(cfg: PretrainConfig, shards, env: dist_env.DistEnv, log) -> PretrainingData:
    """This rank's stream of micro-batches from the start (a resume moves its position later)."""
    d = cfg.data
    packed = shards[0].packed  # inspect_shards checked that every shard is packed alike
    if packed:
        log(f"packed shards: up to {packed} sequences a row, {shards[0].width} masked slots a row")
    masker = (
        Masker.from_vocab(d.vocab_file, d.masked_lm_prob, _masked_slots(cfg, packed)) if d.dynamic_masking else None
    )
    return PretrainingData(
        shards,
        cfg.training.seed,
        cfg.training.micro_batch_size,
        env,
        masker=masker,
        num_workers=d.num_workers,
        length_bins=d.length_bins,
        mix_shards=d.mix_shards,
    )


def _masked_slots(cfg: PretrainConfig, packed: int) -> int:
    """--dynamic_masking's prediction slots: max_predictions_per_seq, or for rows of up to `packed` sequences the
    slots create_pretraining_data.py gives a packed row (enough for any K sequences of together S tokens)."""
    d = cfg.data
    if not packed:
        return d.max_predictions_per_seq

    return packed_predictions(d.max_seq_length, d.max_predictions_per_seq, d.masked_lm_prob, packed)


def make_validator(cfg: PretrainConfig, precision: Precision, env: dist_env.DistEnv):
    """The held-out set's validator (None without --eval_dir); the special ids from --vocab_file, or read off
    the held-out shards."""
    e = cfg.evaluation
    if not e.eval_dir:
        return None
    eval_set = load_eval_set(e.eval_dir, cfg.data.shard_spec, e.max_eval_samples, env.rank, env.world_size)
    if cfg.data.vocab_file:
        from tokenization import load_vocab

        special = SpecialIds.from_vocab(load_vocab(cfg.data.vocab_file))
    else:
        special = SpecialIds.from_shards(eval_set)
    try:
        return Validator(eval_set, special, e.eval_batch_size or cfg.training.micro_batch_size, precision.autocast, env)
    except ValueError as err:
        raise InputError(f"--eval_dir {e.eval_dir}: {err}") from None


# ---------------------------------------------------------------------------------------------------------------
# Test hooks: installed on the Trainer from here, never inside its loop


def _inject_inf(model: torch.nn.Module) -> None:
    """TEST ONLY (--debug_inject_inf_at_step): an inf in the first gradient, as an fp16 overflow would leave."""
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    grad.view(-1)[0] = float("inf")


def inject_inf_at(step: int):
    """A Trainer hook: an inf in a gradient on the first attempt at phase step `step` (that attempt overflows)."""
    pending = True

    def hook(trainer: Trainer) -> None:
        nonlocal pending
        if pending and trainer.state.step + 1 == step:
            _inject_inf(trainer.model)
            pending = False

    return hook


# ---------------------------------------------------------------------------------------------------------------
# main


def report_stop(cfg: PretrainConfig, summary: dict, env: dist_env.DistEnv) -> int:
    """One line on stderr for a run stopped by a signal (what a launcher and a person need), and EXIT_STOPPED."""
    c = cfg.checkpoint
    saved = "" if c.skip_checkpoint or not summary["phase_step"] else f" (checkpoint ckpt_{summary['step']}.pt)"
    again = (
        "run the same command again to resume"
        if c.resume_from_checkpoint
        else "run the same command with --resume_from_checkpoint to resume"
    )
    if env.is_main:
        print(
            f"run_pretraining.py: phase {c.phase} stopped at step {summary['step']} by "
            f"{summary['stopped_by_signal']}{saved}: {again}",
            file=sys.stderr,
            flush=True,
        )
    return EXIT_STOPPED


def main(argv: list[str] | None = None) -> int:
    """0: the phase ran to its --max_steps (or --steps_this_run); EXIT_STOPPED (75): stopped by a signal after its
    checkpoint, run again to resume; 1 (a one-line message): bad input or a failure."""
    with cli.survive_broken_pipes():  # a launcher's dead `tee` must not cost the preemption checkpoint
        with cli.script_errors("run_pretraining.py", argv):  # bad input, a checkpoint that does not fit, a
            return _main(argv)  # diverged run, a full disk: one line (--debug: the traceback)


def _main(argv: list[str] | None) -> int:
    e2e_start = time.perf_counter()
    cfg = parse_args(argv)

    owns_process_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    env = dist_env.init_distributed(no_cuda=cfg.parallelism.no_cuda)
    log = (lambda msg: print(f"run_pretraining: {msg}", flush=True)) if env.is_main else (lambda msg: None)
    logger = RunLogger(
        cfg.logging.json_summary,
        Path(cfg.checkpoint.output_dir) / "tensorboard",
        enabled=env.is_main,
        progress=not cfg.logging.disable_progress_bar,
    )
    stop = StopRequest().install()  # from the start: a preemption during set-up ends the run before its 1st step
    data = None
    try:
        Path(cfg.checkpoint.output_dir).mkdir(parents=True, exist_ok=True)
        if env.is_main:
            checkpoint_manager(cfg).remove_interrupted_writes()
        spec, do_train = cfg.data.shard_spec, cfg.training.do_train
        shards = inspect_shards(list_shards(cfg.data.input_dir, "--input_dir"), spec, "--input_dir") if do_train else []
        if cfg.evaluation.eval_dir:  # its shards are checked now, before the model is built, and read later
            inspect_shards(list_shards(cfg.evaluation.eval_dir, "--eval_dir"), spec, "--eval_dir")
        if do_train:  # evaluating alone writes nothing there
            refuse_used_output_dir(cfg)
        resume = find_resume_checkpoint(cfg, log) if cfg.checkpoint.resume_from_checkpoint else None
        raw_model = build_model(cfg, resume, log)
        par = cfg.parallelism
        model, precision = apply_parallelism_and_precision(
            raw_model,
            env,
            cfg.precision.precision,
            loss_scale=cfg.precision.loss_scale,
            init_loss_scale=cfg.precision.init_loss_scale,
            checkpoint_activations=par.checkpoint_activations,
            allreduce_fp16=par.allreduce_post_accumulation_fp16,
            compile=par.compile_choice,
            compile_mode=par.compile_mode,
            compile_backend=par.compile_backend,
            compile_scope=par.compile_scope,
            fp8=cfg.precision.fp8,
            bit_dropout=par.bit_dropout_masks,
        )
        scope = compiled(model)
        log(
            f"precision {precision.name} ({precision.reason}); "
            f"{'float8 feed-forward products in the encoder layers (torchao); ' if cfg.precision.fp8 else ''}"
            f"{'1-bit hidden-dropout masks; ' if par.bit_dropout_masks else ''}"
            f"{f'torch.compile of the {scope}, mode ' + par.compile_mode if scope else 'eager mode'}"
            f"{'' if par.compile or par.no_compile else ' (the default on a ' + env.device.type.upper() + ')'}"
        )
        if precision.warning:
            log(f"warning: {precision.warning}")
        validator = make_validator(cfg, precision, env)
        parameters = {
            **cfg.flags(),
            "world_size": env.world_size,
            "device": str(env.device),
            "precision_requested": cfg.precision.precision,
            "precision": precision.name,
            "precision_reason": precision.reason,
            "parameters": count_parameters(raw_model),
        }
        if not do_train:  # evaluation only: the weights are all we need
            if resume is not None:
                load_checkpoint_state(raw_model, resume["model"], source=f"ckpt_{resume['step']}.pt")
            step = cfg.checkpoint.step_offset
            logger.log("PARAMETER", {**parameters, "start_step": step})
            logger.log(step, validate_and_describe(validator, raw_model, log))
            return 0

        optimizer, scheduler = build_optimizer(cfg, raw_model, env)
        data = build_data(cfg, shards, env, log)
        dist_env.set_seed(cfg.training.seed + env.rank)  # dropout differs between ranks
        parts = TrainingParts(model, raw_model, optimizer, scheduler, precision)
        trainer = Trainer(cfg, env, parts, data, logger=logger, stop=stop, validator=validator, log=log)
        if cfg.debug.debug_inject_inf_at_step > 0:
            trainer.hooks.append(inject_inf_at(cfg.debug.debug_inject_inf_at_step))
        if resume is not None:
            trainer.load_state_dict(resume)  # last: it restores the RNG states, nothing after may draw from them
        logger.log("PARAMETER", {**parameters, "start_step": trainer.state.global_step})
        summary = trainer.fit()
        summary["e2e_train_time"] = time.perf_counter() - e2e_start
        logger.log("FINAL", summary)
        if summary["stopped_by_signal"]:
            return report_stop(cfg, summary, env)
        log(
            f"done: step {summary['step']}, final loss {summary['final_loss']}, "
            f"{summary['training_sequences_per_second']:.1f} rows/s "
            f"({summary['training_real_sequences_per_second']:.1f} sequences/s, "
            f"{summary['training_real_tokens_per_second']:.0f} real tokens/s)"
        )
        return 0
    finally:
        stop.restore()
        if data is not None:
            data.close()
        logger.close()
        if owns_process_group:
            dist_env.end_process_group(clean=sys.exc_info()[0] is None)  # no barrier while an error propagates


if __name__ == "__main__":
    dist_env.exit_script(main)  # not sys.exit: see exit_script for a multi-process run's end
