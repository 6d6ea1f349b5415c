"""The two small programs of scripts/run_cpu_demo.sh (the README's main job), as a module.

python -m scripts.cpu_demo config SOURCE_CONFIG VOCAB OUT_CONFIG
    the model config for a vocabulary: vocab_size kept when the vocabulary fits it (the rule run_pretraining.py
    checks: bert-base-uncased's 30522 stays 30522), else create_vocab's padding to a multiple of 8
python -m scripts.cpu_demo summary RUN_DIR --job JOB --heldout HELDOUT.hdf5 --train_shard TRAIN.hdf5 --vocab VOCAB
    what the run learned, from its JSON-lines logs: each phase's loss, held-out accuracy and speed, then the
    held-out loss against guessing from word frequencies (the held-out targets' own, and a unigram model of the
    training shard), and the context gain on the [MASK]ed held-out words (validation.py's numbers)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_write_json, read_json_lines
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prep.vocab import config_vocab_size
from bert_recipe.pretraining.shard_format import read_samples, unigram_log_prior
from bert_recipe.pretraining.validation import SpecialIds, heldout_most_frequent
from tokenization import load_vocab, vocab_fits_config


def fit_config(source: Path, vocab: Path, target: Path) -> dict:
    """`source`'s config with the vocab_size the vocabulary needs, written to `target` (atomically)."""
    try:
        config = json.loads(source.read_text(encoding="utf-8"))
        int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(
            f"--config {source} is not a BERT config JSON with a vocab_size ({e}): give one such as "
            "configs/bert-small-cpu.json"
        ) from None
    with open(vocab, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if not vocab_fits_config(lines, config["vocab_size"]):
        config["vocab_size"] = config_vocab_size(lines)
    atomic_write_json(target, config)
    print(f"model config: {source} with vocab_size {config['vocab_size']} -> {target}")
    return config


def phase_line(phase: int, records: list[dict]) -> tuple[str, tuple | None]:
    """One phase's line (loss, held-out accuracy, speed) and its last evaluation with a context gain, if any."""
    losses = [
        (r["step"], r["data"]["mlm_loss"]) for r in records if isinstance(r["step"], int) and "mlm_loss" in r["data"]
    ]
    evals = [(r["step"], r["data"]) for r in records if "eval_mlm_accuracy" in r.get("data", {})]
    final = next((r["data"] for r in reversed(records) if r["step"] == "FINAL"), {})
    line = f"phase {phase}:"
    if losses:
        line += (
            f" masked-LM loss {losses[0][1]:.3f} (step {losses[0][0]}) -> {losses[-1][1]:.3f} (step {losses[-1][0]})"
        )
    if evals:
        line += (
            f"; held-out masked-LM accuracy {evals[0][1]['eval_mlm_accuracy']:.3f} -> "
            f"{evals[-1][1]['eval_mlm_accuracy']:.3f}"
        )
    if "training_sequences_per_second" in final:
        line += f"; {final['training_sequences_per_second']:.1f} sequences/s"
    learned = (phase, *evals[-1]) if evals and "eval_context_gain" in evals[-1][1] else None
    return line, learned


def learned_lines(learned: tuple, targets: int, train_unigram: float) -> list[str]:
    """Did it learn from context? The held-out loss against the best context-free guesses, and what the context is
    worth on the [MASK]ed slots."""
    phase, step, e = learned
    head = f"learned? phase {phase}, step {step}:"
    below = e["eval_unigram_entropy"] - e["eval_mlm_loss"]
    gain = train_unigram - e["eval_mlm_loss"]
    lines = [
        f"{head} held-out masked-LM loss {e['eval_mlm_loss']:.3f} nats against {e['eval_unigram_entropy']:.3f} "
        f"for guessing from word frequencies alone ({abs(below):.3f} nats {'better' if below > 0 else 'worse'}; "
        f"those are the {targets} held-out targets' own frequencies, an optimistic reference on a set this "
        "small)",
        f"{head} against a unigram model of the training shard ({train_unigram:.3f} nats on the same targets): "
        f"{abs(gain):.3f} nats {'better' if gain > 0 else 'worse'}",
        f"{head} context gain {100 * e['eval_context_gain']:+.1f} points: {e['eval_mask_accuracy']:.3f} of the "
        f"[MASK]ed held-out words right with their context, {e['eval_mask_accuracy_without_context']:.3f} with "
        "every other word hidden too",
    ]
    commonest = e.get("eval_mask_accuracy_most_frequent")
    if commonest is not None:
        lines.append(
            f"{head} always guessing the commonest of those words scores {commonest:.3f}"
            + (
                ": with the context the model does no better, so the gain is its guesses without context "
                "getting worse (a row of [MASK]s is unlike its training), not a use of the context"
                if e["eval_context_gain"] > 0 and e["eval_mask_accuracy"] <= commonest
                else ""
            )
        )
    return lines


def summary(run_dir: Path, job: str, heldout: Path, train_shard: Path, vocab: Path, max_eval: int) -> list[str]:
    """The summary's lines (also printed). The baselines are counted as the evaluation counts: the first `max_eval`
    held-out samples, the masked slots with a position > 0 (the most frequent word: the [MASK]ed ones,
    validation.heldout_most_frequent)."""
    arrays = read_samples([heldout], max_eval, ("input_ids", "masked_lm_positions", "masked_lm_ids"))
    targets = arrays["masked_lm_ids"][arrays["masked_lm_positions"] > 0]
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    # A second context-free reference: a unigram model of the training shard (add-one smoothed, the prior that
    # --mlm_bias_init unigram starts from) scored on the same held-out targets. The held-out words' own entropy is
    # optimistic on a set this small (a few thousand targets: rare words seen once look certain).
    train_unigram = float(-unigram_log_prior(train_shard, vocab_size)[targets].mean())
    lines = [
        f"baseline: always guessing the most frequent masked token scores "
        f"{heldout_most_frequent(arrays, SpecialIds.from_vocab(load_vocab(vocab))):.3f} on the held-out set"
    ]
    learned = None
    for phase in (1, 2):
        path = run_dir / f"{job}.phase{phase}.json"
        if path.is_file():
            line, found = phase_line(phase, read_json_lines(path))
            lines.append(line)
            learned = found or learned
    if learned:
        lines += learned_lines(learned, len(targets), train_unigram)
    print("\n".join(lines))
    return lines


@dataclass(frozen=True)
class DemoFlags:
    """How the errors read."""

    prog: str = "scripts.cpu_demo"
    """the name its one-line errors start with (the launcher that runs it: run_cpu_demo.sh)"""


@dataclass(frozen=True)
class ConfigFlags:
    """The config to start from, the vocabulary, the config to write."""

    source: Path = flag(positional=True)
    """a BERT config JSON (configs/bert-small-cpu.json)"""
    vocab: Path = flag(positional=True)
    """the vocab.txt the model will read"""
    target: Path = flag(positional=True)
    """the config to write"""


@dataclass(frozen=True)
class SummaryFlags:
    """The run and the shards it read."""

    run_dir: Path = flag(positional=True)
    """the run's folder (its JSON-lines logs)"""
    job: str = flag(required=True)
    """the run's job name (its logs are <job>.phase<N>.json)"""
    heldout: Path = flag(required=True)
    """the held-out HDF5 shard the run evaluated on"""
    train_shard: Path = flag(required=True)
    """the phase 1 training shard"""
    vocab: Path = flag(required=True)
    """the run's vocab.txt"""
    max_eval: int = 2000
    """the run's --max_eval_samples"""


@dataclass(frozen=True)
class ConfigCommand(flags.Config):
    """a model config whose vocab_size fits the vocabulary"""

    config: ConfigFlags = field(default_factory=ConfigFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("config",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter


@dataclass(frozen=True)
class SummaryCommand(flags.Config):
    """what the demo's run learned"""

    summary: SummaryFlags = field(default_factory=SummaryFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("summary",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.HelpFormatter


@dataclass(frozen=True)
class DemoConfig(flags.Config):
    """--prog, then one of the two programs."""

    demo: DemoFlags = field(default_factory=DemoFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("demo",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"
    commands: ClassVar[dict[str, type[flags.Config]]] = {"config": ConfigCommand, "summary": SummaryCommand}


def main(argv: list[str] | None = None) -> int:
    top, command, cfg = flags.parse_command(DemoConfig, "python -m scripts.cpu_demo", __doc__, argv)
    with script_errors(top.demo.prog, argv):
        if command == "config":
            fit_config(cfg.config.source, cfg.config.vocab, cfg.config.target)
        else:
            s = cfg.summary
            summary(s.run_dir, s.job, s.heldout, s.train_shard, s.vocab, s.max_eval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
