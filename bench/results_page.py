"""The results page: bench/RESULTS.md and its plots (bench/results/*.png), from the JSON outputs of issue 14's
studies, in one command.

    .venv/bin/python -m bench.results_page [--studies results/studies] [--minilm_mrpc F] [--minilm_sst2 F] \\
        [--pretrain F] [--scaling F] [--out bench/RESULTS.md] [--plots bench/results]

Inputs (each can be named on its own; by default under --studies):
    minilm_mrpc/stability_mrpc.json   python -m bench.stability --task mrpc --seeds 1,2,3,4,5 --threads 1 ...
    minilm_sst2/stability_sst-2.json  python -m bench.stability --task sst-2 ... --epochs 1 --max_train_examples 10000
    pretrain/pretrain_study.json      python -m bench.pretrain_study --out <studies>/pretrain ...
    scaling/scaling_study.json        python -m bench.scaling_study --out <studies>/scaling ...
    sweep/sweep.json                  python -m bench.pretrain_sweep --out <studies>/sweep ... (--sweep: repeatable)
    vs_transformers/vs_transformers.json  python -m bench.pretrain_vs_transformers --out <studies>/vs_transformers ...
    --linear_probe F (repeatable, no default)  python -m bench.linear_probe --out F ...
    --adaptive F (repeatable, no default)      python -m bench.adaptive_study --out DIR ... (DIR/adaptive_study.json)
A study whose file is absent is listed as "not run" with the path looked at; the page is still written. Seed
tables follow NVIDIA's README (each seed's score, then mean and standard deviation, in percent); the plots are
drawn again from the numbers in the JSON files, so the page does not depend on the studies' own PNGs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from bench import (
    adaptive_study,
    bench_prep_engines,
    gpu_speed,
    gpu_study,
    pretrain_study,
    pretrain_sweep,
    pretrain_vs_transformers,
    scaling_study,
)
from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_text

REPO = su.REPO
METRIC_NAME = {"f1": "F1", "acc": "accuracy", "mcc": "Matthews corr.", "spearmanr": "Spearman"}


def nvidia_table(rows: list[tuple[str, list[int], list[float]]], metric: str, first: str = "Model") -> str:
    """NVIDIA's fine-tuning stability table: | first | seed #1 ... | mean | std |, scores in percent, 2 decimals.
    rows: (label, seeds, scores); the seed columns are the union of every row's seeds."""
    seeds = sorted({s for _, row_seeds, _ in rows for s in row_seeds})
    lines = [
        f"| {first} ({METRIC_NAME.get(metric, metric)}, %) | "
        + " | ".join(f"seed #{s}" for s in seeds)
        + " | mean | std |",
        "|---|" + "---|" * (len(seeds) + 2),
    ]
    for label, row_seeds, scores in rows:
        by_seed = dict(zip(row_seeds, scores))
        stats = su.aggregate(scores)
        cells = [f"{100 * by_seed[s]:.2f}" if s in by_seed else "" for s in seeds]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {100 * stats['mean']:.2f} | {100 * stats['std']:.2f} |")
    return "\n".join(lines)


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def not_run(path: Path, how: str) -> list[str]:
    return [f"Not run: no `{path}`. {how}", ""]


def stability_section(
    mrpc: dict | None, sst2: dict | None, paths: dict[str, Path], plots: Path, page_dir: Path, heading: str
) -> list[str]:
    lines = [f"{heading} Fine-tuning stability: all-MiniLM-L6-v2 over seeds", ""]
    groups = {}
    for task, summary, how in (
        (
            "mrpc",
            mrpc,
            "python -m bench.stability --task mrpc --seeds 1,2,3,4,5 --threads 1 --out <studies>/minilm_mrpc",
        ),
        (
            "sst-2",
            sst2,
            "python -m bench.stability --task sst-2 --seeds 1,2,3,4,5 --threads 1 "
            "--epochs 1 --max_train_examples 10000 --out <studies>/minilm_sst2",
        ),
    ):
        lines += [f"**{task.upper()}**", ""]
        if summary is None:
            lines += not_run(paths[task], f"Run `{how}`.")
            continue
        runs = summary["runs"]
        cmd = runs[0]["command"] if runs else []
        settings = su.settings_of(cmd) if cmd else {}
        lines += [
            nvidia_table(
                [(f"all-MiniLM-L6-v2, {task.upper()}", [r["seed"] for r in runs], [r["score"] for r in runs])],
                summary["metric"],
            ),
            "",
            f"{len(runs)} seeds, {summary.get('date')}; min {100 * min(r['score'] for r in runs):.2f}, max "
            f"{100 * max(r['score'] for r in runs):.2f}; {summary.get('wall_seconds')} s in all. Settings: "
            + ", ".join(f"{k.lstrip('-')} {v}" for k, v in settings.items() if v is not None)
            + f". From `{paths[task]}`.",
            "",
        ]
        groups[task] = {"MiniLM": [r["score"] for r in runs]}
    if groups:
        png = su.plot_seeds(groups, plots / "stability_minilm.png", title="all-MiniLM-L6-v2: dev score per seed")
        lines += [f"![MiniLM per seed]({os.path.relpath(png, page_dir)})", ""]
    return lines


def pretrain_section(
    report: dict | None, path: Path, plots: Path, page_dir: Path, heading: str, name: str = "pretrain"
) -> list[str]:
    """One pre-train-then-fine-tune study; `name` prefixes its plots' file names (several studies, one page)."""
    if report is None:
        return [f"{heading} Pre-train, then fine-tune", ""] + not_run(
            path, "Run `python -m bench.pretrain_study --out <studies>/pretrain` (see its --help)."
        )
    pre, ft = report["pretraining"], report["finetuning"]
    images = []
    if pre:
        images.append(
            su.plot_pretraining(
                pre["curves"],
                pre["heldout"],
                plots / f"{name}_loss.png",
                title=f"pre-training {Path(pre['config_file'] or '').name}",
            )
        )
    else:
        images.append(plots / f"{name}_loss.png")
    groups = {t: {m: s["scores"] for m, s in per.items()} for t, per in ft["results"].items()}
    images.append(su.plot_seeds(groups, plots / f"{name}_seeds.png", baselines=ft["baselines"]))
    text = pretrain_study.markdown(report, tuple(os.path.relpath(p, page_dir) for p in images), heading=heading)
    lines = text.splitlines() + [""]
    for task, per in ft["results"].items():
        metric = next(iter(per.values()))["metric"]
        lines += [
            nvidia_table([(m, s["seed_list"], s["scores"]) for m, s in per.items()], metric, first=f"{task.upper()}"),
            "",
        ]
    lines += [f"Command: `{' '.join(report['command'])}`. From `{path}`.", ""]
    return lines


def scaling_section(report: dict | None, path: Path, plots: Path, page_dir: Path, heading: str) -> list[str]:
    if report is None:
        return [f"{heading} Batch-size scaling study", ""] + not_run(
            path, "Run `python -m bench.scaling_study --out <studies>/scaling` (see its --help)."
        )
    runs = report["runs"]
    png = su.plot_runs(
        {f"{k}: {v['processes']}x{v['batch_per_process']}, lr {v['lr']:.3g}": v for k, v in runs.items()},
        plots / "scaling_loss.png",
        title="scaling study",
        baseline=report["heldout_baseline"],
    )
    lines = scaling_study.markdown(report, os.path.relpath(png, page_dir), heading=heading).splitlines() + [""]
    rows = [
        (f"run {k}", v["downstream"]["seed_list"], v["downstream"]["scores"])
        for k, v in runs.items()
        if v.get("downstream")
    ]
    if rows:
        metric = next(v["downstream"]["metric"] for v in runs.values() if v.get("downstream"))
        lines += [nvidia_table(rows, metric, first=report["settings"]["glue_task"].upper()), ""]
    lines += [f"Command: `{' '.join(report['command'])}`. From `{path}`.", ""]
    return lines


def table_and_plot_section(
    module, report: dict | None, path: Path, plots: Path, page_dir: Path, heading: str, title: str, name: str
) -> list[str]:
    """A bench script's own Markdown table (its `markdown(report)`, whose first line is "# <title> ...") and its plot
    (its `plot(report, path)`), drawn again from the JSON: the pre-training sweeps and ours-vs-transformers."""
    if report is None:
        script = module.__name__
        return [f"{heading} {title}", ""] + not_run(
            path, f"Run `python -m {script} --out <studies>/...` (see its --help)."
        )
    png = module.plot(report, plots / f"{name}.png")
    text = module.markdown(report).replace(f"# {title}", f"{heading} {title}", 1)
    return text.splitlines() + ["", f"![{name}]({os.path.relpath(png, page_dir)})", "", f"From `{path}`.", ""]


def gpu_section(paths: list[Path], plots: Path, page_dir: Path, heading: str) -> list[str]:
    """bench.gpu_study's runs (every --gpu_study file), one table and one plot of all their runs."""
    if not paths:
        return [
            f"{heading} Pre-training on one GPU (bench.gpu_study)",
            "",
            "Not run: no --gpu_study file given (it needs a GPU: see bench/gpu_study.py).",
            "",
        ]
    studies = [(path, json.loads(path.read_text())) for path in paths]
    runs = {
        f"{path.parent.name}: {name}": gpu_study.curves(path.parent / f"{name}.log.json")
        for path, report in studies
        for name in report["runs"]
    }
    png = su.plot_runs(
        {k: {"losses": v["losses"], "evals": [e[:2] for e in v["evals"] if e[2] == e[2]]} for k, v in runs.items()},
        plots / "gpu_study.png",
        title="on one GPU: masked-LM loss (train), [MASK] accuracy (held-out)",
    )
    text = gpu_study.markdown(studies, heading, os.path.relpath(png, page_dir))
    return text.splitlines() + [f"From {', '.join(f'`{p}`' for p in paths)}.", ""]


def report_sections(module, paths: list[Path], heading: str, title: str, flag: str) -> list[str]:
    """A bench script's reports (every --<flag> file), each its own table by the script's `markdown(report)`: the
    linear probes (bench.linear_probe) and the task-adaptive studies (bench.adaptive_study)."""
    lines = [f"{heading} {title}", ""]
    if not paths:
        script = module.__name__.split(".")[-1]
        return lines + [f"Not run: no --{flag} file given (see bench/{script}.py).", ""]
    for path in paths:
        lines += module.markdown(json.loads(path.read_text())).splitlines() + ["", f"From `{path}`.", ""]
    return lines


def gpu_speed_section(folders: list[Path], heading: str) -> list[str]:
    """BERT-large pre-training speed on one GPU, path by path, beside transformers (bench/gpu_pretraining.sh), one
    table per device call."""
    lines = [f"{heading} BERT-large pre-training speed on one GPU (bench/gpu_pretraining.sh)", ""]
    if not folders:
        return lines + ["Not run: no --gpu_speed folder given (it needs a GPU: see bench/gpu_speed.py).", ""]
    lines += [
        "Each row is its own process through run_pretraining.py (transformers' rows: `bench.gpu_speed hf`), "
        "bf16 autocast, NVLAMB, compiled; MFU counts the model's FLOPs on real (non-padding) tokens against "
        "the 989 TFLOP/s dense bf16 peak; 'vs transformers' is the ratio of real tokens/s to transformers' "
        "row of the same phase in the same call; the profile's parts are shares of the GPU's kernel time "
        "over two profiled steps (`profiling.py`), its busy share the part of those steps during "
        "which any kernel ran (the profiler's own host overhead lowers it where the host is the limit).",
        "",
    ]
    for folder in folders:
        lines += gpu_speed.markdown(folder).splitlines() + ["", f"From `{folder}`.", ""]
    return lines


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2], formatter_class=su.HelpFormatter
    )
    p.add_argument("--studies", type=Path, default=REPO / "results" / "studies", help="where the studies wrote")
    p.add_argument("--minilm_mrpc", type=Path, default=None, help="None: <studies>/minilm_mrpc/stability_mrpc.json")
    p.add_argument("--minilm_sst2", type=Path, default=None, help="None: <studies>/minilm_sst2/stability_sst-2.json")
    p.add_argument(
        "--pretrain",
        type=Path,
        action="append",
        default=None,
        help="a pre-train-then-fine-tune study's JSON; repeat it for several (e.g. two pre-training "
        "budgets), each its own section (None: <studies>/pretrain/pretrain_study.json)",
    )
    p.add_argument("--scaling", type=Path, default=None, help="None: <studies>/scaling/scaling_study.json")
    p.add_argument(
        "--sweep",
        type=Path,
        action="append",
        default=None,
        help="a pre-training sweep's JSON, repeatable (None: <studies>/sweep/sweep.json)",
    )
    p.add_argument(
        "--vs_transformers", type=Path, default=None, help="None: <studies>/vs_transformers/vs_transformers.json"
    )
    p.add_argument(
        "--gpu_study",
        type=Path,
        action="append",
        default=None,
        help="a bench.gpu_study run's gpu_study.json (its <run>.log.json files beside it), repeatable",
    )
    p.add_argument(
        "--linear_probe", type=Path, action="append", default=None, help="a bench.linear_probe report, repeatable"
    )
    p.add_argument(
        "--adaptive", type=Path, action="append", default=None, help="a bench.adaptive_study report, repeatable"
    )
    p.add_argument(
        "--prep_engines",
        type=Path,
        action="append",
        default=None,
        help="a bench.bench_prep_engines report (prep_engines.json), repeatable",
    )
    p.add_argument(
        "--gpu_speed",
        type=Path,
        action="append",
        default=None,
        help="a bench/gpu_pretraining.sh call's folder (summary.json, gpu.txt, call.json), repeatable",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    p.add_argument("--plots", type=Path, default=None, help="where the PNGs go (None: results/ beside --out)")
    args = p.parse_args(argv)
    su.require_matplotlib("results_page")
    paths = {
        "mrpc": args.minilm_mrpc or args.studies / "minilm_mrpc" / "stability_mrpc.json",
        "sst-2": args.minilm_sst2 or args.studies / "minilm_sst2" / "stability_sst-2.json",
        "pretrain": (args.pretrain or [args.studies / "pretrain" / "pretrain_study.json"])[0],
        "scaling": args.scaling or args.studies / "scaling" / "scaling_study.json",
        "sweep": (args.sweep or [args.studies / "sweep" / "sweep.json"])[0],
        "vs_transformers": args.vs_transformers or args.studies / "vs_transformers" / "vs_transformers.json",
    }
    page_dir = args.out.resolve().parent
    plots = (args.plots or page_dir / "results").resolve()
    plots.mkdir(parents=True, exist_ok=True)
    page_dir.mkdir(parents=True, exist_ok=True)
    found = {k: load(v) for k, v in paths.items()}
    lines = [
        "# Results: multi-seed fine-tuning, our own pre-training, batch-size scaling, learning-rate sweeps",
        "",
        f"Generated by `python -m bench.results_page {shlex.join(sys.argv[1:] if argv is None else argv)}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')} from the studies' "
        "JSON outputs (issue 14). Dev-set scores; standard deviations are over seeds (sample, n - 1). "
        f'Rule for "beats": {su.RULE}.',
        "",
        "| study | status |",
        "|---|---|",
    ]
    for name, key in (
        ("MiniLM MRPC, 5 seeds", "mrpc"),
        ("MiniLM SST-2 (10k), 5 seeds", "sst-2"),
        ("pre-train, then fine-tune", "pretrain"),
        ("batch-size scaling", "scaling"),
        ("pre-training sweep", "sweep"),
        ("ours against transformers", "vs_transformers"),
    ):
        lines.append(f"| {name} | {'from `' + str(paths[key]) + '`' if found[key] else 'not run'} |")
    lines.append("")
    lines += stability_section(found["mrpc"], found["sst-2"], paths, plots, page_dir, "##")
    lines += pretrain_section(found["pretrain"], paths["pretrain"], plots, page_dir, "##")
    for i, extra in enumerate((args.pretrain or [])[1:], start=2):
        lines += pretrain_section(load(extra), extra, plots, page_dir, "##", name=f"pretrain{i}")
    lines += scaling_section(found["scaling"], paths["scaling"], plots, page_dir, "##")
    for i, sweep in enumerate(args.sweep or [paths["sweep"]], start=1):
        lines += table_and_plot_section(
            pretrain_sweep,
            load(sweep),
            sweep,
            plots,
            page_dir,
            "##",
            "Pre-training sweep",
            "sweep" if i == 1 else f"sweep{i}",
        )
    lines += table_and_plot_section(
        pretrain_vs_transformers,
        found["vs_transformers"],
        paths["vs_transformers"],
        plots,
        page_dir,
        "##",
        "Ours against transformers",
        "vs_transformers",
    )
    lines += gpu_section(args.gpu_study or [], plots, page_dir, "##")
    from bench import linear_probe  # here, not at the head: it imports torch, which the page itself never needs

    lines += report_sections(
        linear_probe, args.linear_probe or [], "##", "Frozen-feature linear probes (bench.linear_probe)", "linear_probe"
    )
    lines += report_sections(
        adaptive_study,
        args.adaptive or [],
        "##",
        "Task-adaptive pre-training: four starts for SST-2 (bench.adaptive_study)",
        "adaptive",
    )
    lines += gpu_speed_section(args.gpu_speed or [], "##")
    lines += report_sections(
        bench_prep_engines,
        args.prep_engines or [],
        "##",
        "The data pipeline on both engines (bench.bench_prep_engines)",
        "prep_engines",
    )
    text = "\n".join(lines).rstrip() + "\n"
    atomic_write_text(args.out, text)
    studies = sum(v is not None for v in found.values())
    print(f"results_page: {args.out} ({studies} of {len(found)} studies; plots in {plots})")
    return text


if __name__ == "__main__":
    main()
