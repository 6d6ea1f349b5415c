"""Is SST-2's failure on the CPU the pre-training text's domain? Task-adaptive pre-training, four starts (issue 27).

    .venv/bin/python -m bench.adaptive_study --out results/studies/adaptive [--config configs/bert-small-cpu.json] \\
        [--wiki_steps 4000] [--task_steps 4000] [--task_dupe_factor 10] [--doc_sentences 8] \\
        [--seeds 1,2,3,4,5] [--small_lr 1e-4,3e-4,1e-3,3e-3] [--sst2_max_train_examples 10000] [--sst2_epochs 1] \\
        [--parallel 2]

The CPU studies' pre-trained models fine-tune on SST-2 no better than random initialisation, and a linear probe
finds no sentiment in their features: is it the text (Wikipedia has few opinions about films) or the amount of it?
Four starting points, one fine-tuning:

1. wikipedia: the README's main job, `scripts/run_cpu_demo.sh` (its Wikipedia text and learned vocabulary,
   AdamW 1e-3, --wiki_steps phase-1 steps at sequence 64, 20 at 512), run by bench.pretrain_study;
2. random: that run's initial weights (seed 42), no pre-training;
3. sst2-text: masked-LM pre-training from that same random start on the text of SST-2's training sentences, their
   labels dropped (Gururangan et al. 2020, "Don't Stop Pretraining": task-adaptive pre-training), with the Wikipedia
   run's vocabulary and config: run_cpu_demo.sh --corpus with --task_steps and --task_dupe_factor. SST-2 has no
   documents; --doc_sentences consecutive sentences make one, so that a sequence of 64 holds several instead of one
   short phrase. The demo holds out the last 5% of those documents (a held-out set that flatters: SST-2's training
   sentences are phrases of one another, and most held-out ones occur inside training ones). The dev set's
   sentences come from other reviews (two short ones, "bad ." and "very bad .", occur inside training sentences, as
   in GLUE's own split);
4. wikipedia+sst2-text: the same from the Wikipedia model's last checkpoint (run_cpu_demo.sh --init_checkpoint).

Each is fine-tuned by bench.pretrain_study (bench.stability: one run_glue.py per seed) on the first
--sst2_max_train_examples labelled SST-2 sentences for --sst2_epochs, batch 32, sequence 128, at every rate of
--small_lr (a pre-trained start may need a gentler rate than a random one), and probed by bench.linear_probe
(frozen features, all 67,349 training sentences, dev accuracy). Verdicts by the results page's rule
(study_utils.RULE): each start against random initialisation at the same rate, and each at its best rate (chosen on
dev, for every start alike) against random's best; and the pairs that answer the question, at their best rates:
sst2-text against random (does the domain's own text teach sentiment?), wikipedia+sst2-text against sst2-text and
against wikipedia (does each text add to the other?). Output: <out>/adaptive_study.json and .md; each arm's
pre-training under <out>/<arm>/pretrain/, its pretrain_study report per rate under <out>/<arm>/lr<rate>/.
A second call reuses every finished run; one with another --sst2_max_train_examples or --sst2_epochs reuses the
pre-training and writes its fine-tunings and report under names that say so (lr<rate>_n<N>_ep<E>/,
adaptive_study_n<N>_ep<E>.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import pretrain_study
from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_text
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.tasks.glue import get_task, get_train_examples

REPO = su.REPO
ARMS = ("random", "wikipedia", "sst2-text", "wikipedia+sst2-text")


def sst2_documents(data_dir: Path, out: Path, per_doc: int) -> dict:
    """SST-2's training sentences, labels dropped, in file order, `per_doc` to a document (blank-line separated):
    the plain-text input of run_cpu_demo.sh --corpus. Returns {"sentences", "documents", "words"}."""
    sentences = [e.text_a.strip() for e in get_train_examples(data_dir, get_task("sst-2"))]
    sentences = [s for s in sentences if s]
    docs = [sentences[i : i + per_doc] for i in range(0, len(sentences), per_doc)]
    atomic_write_text(out, "".join("\n".join(doc) + "\n\n" for doc in docs))
    return {"sentences": len(sentences), "documents": len(docs), "words": sum(len(s.split()) for s in sentences)}


def markdown(report: dict) -> str:
    lrs, rows = report["learning_rates"], report["arms"]
    head = " | ".join(f"SST-2 dev acc., lr {lr}" for lr in lrs)
    lines = [
        f"| start | pre-training | {head} | at its best rate against random's best (difference, spread) | "
        "linear probe, [CLS] / mean of tokens |",
        "|---" * (4 + len(lrs)) + "|",
    ]
    for arm in ARMS:
        r = rows[arm]
        cells = []
        for lr in lrs:
            m = r["sst2"][lr]
            cell = f"{m['mean']:.4f} ± {m['std']:.4f}"
            cells.append(f"**{cell}**" if lr == r["best_lr"] else cell)
        v = r["against_random"]["best"] if r["against_random"] else None
        verdict = (
            ""
            if v is None
            else (f"{'**beats**' if v['beats'] else 'does not beat'} ({v['difference']:+.4f}, {v['spread']:.4f})")
        )
        p = r["linear_probe"]
        lines.append(
            f"| {arm} | {r['pretraining']} | {' | '.join(cells)} | {verdict} | {p['cls']:.4f} / {p['mean']:.4f} |"
        )
    majority = f"{report['majority']:.4f}"
    lines.append(f"| majority class | | {' | '.join(majority for _ in lrs)} | | {majority} |")
    lines += [""] + [
        f"- {name}, each at its best rate: {'**beats**' if v['beats'] else 'does not beat'} "
        f"({v['difference']:+.4f}, spread {v['spread']:.4f})"
        for name, v in report["pairs"].items()
    ]
    t, fine = report["sst2_text"], report["finetuning"]
    lines += [
        "",
        f"Fine-tuning: the first {fine['sst2_max_train_examples']} labelled sentences, {fine['sst2_epochs']:g} "
        f"epoch(s), {fine['seeds']} seeds, batch {fine['batch']}; bold: each start's best rate. "
        f"Rule: {report['rule']}. "
        f"SST-2 text: {t['sentences']} sentences, {t['words']} words, {t['documents']} documents. "
        f"{report['date']}, {report['cpu']}, {report['wall_seconds']} s. Command: "
        f"`python -m bench.adaptive_study {' '.join(report['command'][3:])}`.",
    ]
    return "\n".join(lines) + "\n"


def pretraining_line(pre: dict | None) -> str:
    """'N1 + N2 steps, S s' of a pretrain_study pre-training report, or 'none'."""
    if not pre:
        return "none"
    p1 = pre["phase1"]
    return f"{p1['steps']} + {pre['phase2']['steps']} steps, {pre.get('wall_seconds')} s"


def main(argv: list[str] | None = None) -> dict:
    """Bad input: one line on stderr ("adaptive_study: error: ..."), exit status 1."""
    with script_errors("adaptive_study", argv):
        return run(parse(argv))


def build_parser() -> argparse.ArgumentParser:
    """The study's command line (the defaults are the main job's)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "results" / "studies" / "adaptive")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "bert-small-cpu.json")
    p.add_argument("--wiki_steps", type=int, default=4000, help="phase-1 steps on Wikipedia (the main job's)")
    p.add_argument("--task_steps", type=int, default=4000, help="phase-1 steps on SST-2's text")
    p.add_argument(
        "--task_dupe_factor",
        type=int,
        default=10,
        help="masked copies of SST-2's text (create_"
        "pretraining/data_stream.py --dupe_factor): 10 gives about as many sequences as 4,000 steps of 32 read",
    )
    p.add_argument("--doc_sentences", type=int, default=8, help="SST-2 sentences per document")
    p.add_argument("--phase2_steps", type=int, default=20)
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument(
        "--small_lr",
        default="1e-4,3e-4,1e-3,3e-3",
        help="fine-tuning learning rates, comma-separated: every "
        "start is fine-tuned at each, and compared at the same rate and at its best",
    )
    p.add_argument("--sst2_max_train_examples", type=int, default=10000)
    p.add_argument("--sst2_epochs", type=float, default=1.0)
    p.add_argument("--max_steps", type=int, default=-1, help="fine-tuning steps cap (quick runs)")
    p.add_argument("--max_eval_examples", type=int, default=None, help="dev sentences (quick runs)")
    p.add_argument("--probe_max_train_examples", type=int, default=None, help="linear probe sentences (quick runs)")
    p.add_argument("--parallel", type=int, default=2, help="fine-tuning runs at a time")
    p.add_argument(
        "--glue_in_process",
        action="store_true",
        help="each fine-tuning's run_glue.main in this process "
        "(bench.pretrain_study --glue_in_process; needs --parallel 1): saves a process start per run, "
        "most of a quick run's time",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of each pre-training (default: the cores this process may use: $OMP_NUM_THREADS "
        "when it is set, as on a shared machine or a test worker, else the CPUs it may run on)",
    )
    p.add_argument("--data_root", type=Path, default=su.DATA, help="holds glue-sst2/ (SST-2's train.tsv, dev.tsv)")
    g = p.add_argument_group("sizes (the defaults are the main job's; smaller for quick runs and the tests)")
    g.add_argument("--corpus", action="append", type=Path, help="the Wikipedia arm's text (None: the main job's)")
    g.add_argument("--vocab_size", type=int, default=8000, help="the vocabulary learned from that text")
    g.add_argument("--batch", type=int, default=32, help="pre-training sequences per step")
    g.add_argument("--small_batch", type=int, default=32, help="fine-tuning batch")
    g.add_argument("--max_seq_length", type=int, default=128, help="fine-tuning and probe sequence length")
    return p


@dataclass(frozen=True)
class Plan:
    """The checked command line: the flags, SST-2's folder, the fine-tuning rates (as pretrain_study's --small_lr
    is given them), the study's folder (absolute), the suffix of the names of the fine-tunings and the report,
    the pretrain_study flags every arm and rate share, and the command for the report."""

    args: argparse.Namespace
    data_dir: Path
    lrs: list[str]
    out: Path
    suffix: str
    common: list[str]
    command: list[str]

    @property
    def demo(self) -> Path:
        """The Wikipedia arm's run_cpu_demo.sh --out: its vocab.txt and bert_config.json serve every arm."""
        return self.out / "wikipedia" / "pretrain"


def parse(argv: list[str] | None = None) -> Plan:
    """The command line, checked (SST-2's files, the rates) before anything is written."""
    args = build_parser().parse_args(argv)
    if args.threads is None:
        args.threads = su.available_cores()
    data_dir = args.data_root.resolve() / "glue-sst2"
    for name in ("train.tsv", "dev.tsv"):
        if not (data_dir / name).is_file():
            raise InputError(
                f"--data_root {args.data_root}: {data_dir / name} not found (SST-2 from GLUE: "
                "../shared/data/glue-sst2 holds it)"
            )
    try:
        lrs = [f"{float(x):g}" for x in args.small_lr.split(",") if x.strip()]
    except ValueError:
        lrs = []
    if not lrs or any(float(lr) <= 0 for lr in lrs):
        raise InputError(f"--small_lr {args.small_lr!r}: give positive learning rates, comma-separated (1e-4,1e-3)")
    common = [
        "--optimizer",
        "adamw",
        "--lr",
        "1e-3",
        "--phase2_steps",
        str(args.phase2_steps),
        "--tasks",
        "sst-2",
        "--seeds",
        args.seeds,
        "--sst2_max_train_examples",
        str(args.sst2_max_train_examples),
        "--sst2_epochs",
        str(args.sst2_epochs),
        "--max_steps",
        str(args.max_steps),
        "--parallel",
        str(args.parallel),
        "--no_context_probe",
        "--data_root",
        str(args.data_root.resolve()),
        "--batch",
        str(args.batch),
        "--small_batch",
        str(args.small_batch),
        "--max_seq_length",
        str(args.max_seq_length),
        "--threads",
        str(args.threads),
    ]
    if args.glue_in_process:
        common.append("--glue_in_process")
    if args.max_eval_examples:
        common += ["--max_eval_examples", str(args.max_eval_examples)]
    # Fine-tuning folders and the report are named by any setting that differs from the defaults, so that a second
    # call with fewer labels or more epochs reuses the pre-training beside the first call's results.
    suffix = "".join(
        f"_{key}{value:g}"
        for key, value, default in (("n", args.sst2_max_train_examples, 10000), ("ep", args.sst2_epochs, 1.0))
        if value != default
    )
    return Plan(
        args,
        data_dir,
        lrs,
        args.out.resolve(),
        suffix,
        common,
        [sys.executable, "-m", "bench.adaptive_study", *(argv if argv is not None else sys.argv[1:])],
    )


def study(plan: Plan, arm: str, lr: str, models: str, pretraining: list[str]) -> dict:
    """One arm fine-tuned at one rate (bench.pretrain_study's report); the arm's pre-training runs with its first
    rate and is reused after."""
    out = plan.out
    return pretrain_study.main(
        [
            "--out",
            str(out / arm / f"lr{lr}{plan.suffix}"),
            "--pretrain_out",
            str(out / arm / "pretrain"),
            "--small_lr",
            lr,
            "--models",
            models,
            *pretraining,
            *plan.common,
        ]
    )


def pretrain_and_fine_tune(plan: Plan) -> tuple[dict[str, dict[str, dict]], dict]:
    """The three pre-trained arms, each fine-tuned at every rate, in order (the later arms read the Wikipedia arm's
    vocabulary, config and checkpoint): (arm -> rate -> pretrain_study report, sst2_documents' counts). The random
    arm is the Wikipedia arm's "random" model."""
    args, lrs = plan.args, plan.lrs
    # 1-2: Wikipedia, and the random start it began from
    wiki_pre = [
        "--config",
        str(args.config),
        "--phase1_steps",
        str(args.wiki_steps),
        "--dupe_factor",
        "1",
        "--vocab_size",
        str(args.vocab_size),
        *[a for c in args.corpus or [] for a in ("--corpus", str(c))],
    ]
    wiki = {lr: study(plan, "wikipedia", lr, "pretrained,random", wiki_pre) for lr in lrs}
    # 3-4: SST-2's text, from the random start and from the Wikipedia model
    text = plan.out / "sst2_text.txt"
    text_stats = sst2_documents(plan.data_dir, text, args.doc_sentences)
    task_pre = [
        "--corpus",
        str(text),
        "--vocab",
        str(plan.demo / "vocab.txt"),
        "--config",
        str(plan.demo / "bert_config.json"),
        "--phase1_steps",
        str(args.task_steps),
        "--dupe_factor",
        str(args.task_dupe_factor),
    ]
    tapt = {lr: study(plan, "sst2-text", lr, "pretrained", task_pre) for lr in lrs}
    wiki_ckpt = wiki[lrs[0]]["pretraining"]["checkpoint"]
    both = {
        lr: study(plan, "wikipedia+sst2-text", lr, "pretrained", ["--init_checkpoint", wiki_ckpt, *task_pre])
        for lr in lrs
    }
    return {"wikipedia": wiki, "sst2-text": tapt, "wikipedia+sst2-text": both}, text_stats


def linear_probe_of(plan: Plan, starts: dict[str, str]) -> dict:
    """bench.linear_probe of every arm's starting checkpoint (`starts`: arm -> checkpoint), or its JSON reused."""
    from bench import linear_probe  # it imports torch: here, so that importing this study stays light

    args = plan.args
    probe_argv = [a for arm in ARMS for a in ("--checkpoint", f"{arm}={starts[arm]}")]
    probe_argv += [
        "--vocab_file",
        str(plan.demo / "vocab.txt"),
        "--task",
        "sst-2",
        "--data_dir",
        str(plan.data_dir),
        "--out",
        str(plan.out / "linear_probe.json"),
        "--max_seq_length",
        str(args.max_seq_length),
    ]
    if args.probe_max_train_examples:
        probe_argv += ["--max_train_examples", str(args.probe_max_train_examples)]
    if args.max_eval_examples:
        probe_argv += ["--max_eval_examples", str(args.max_eval_examples)]
    # The probe of the same checkpoints with the same settings is reused, as the fine-tunings are (a new
    # pre-training run has a new run_<time>/ folder, so the same paths are the same weights).
    probe_json = plan.out / "linear_probe.json"
    probe = json.loads(probe_json.read_text()) if probe_json.is_file() else None
    if probe is not None and probe.get("command", [])[3:] == probe_argv:
        print(f"adaptive_study: reusing {probe_json} (the same checkpoints and settings)", flush=True)
    else:
        probe = linear_probe.main(probe_argv)
    return probe


def arm_rows(
    lrs: list[str], studies: dict[str, dict[str, dict]], starts: dict[str, str], probe: dict
) -> tuple[dict, dict]:
    """The report's "arms" (per arm: its start, pre-training, SST-2 scores per rate, best rate, verdicts against
    random, linear probe) and "pairs" (the pairs that answer the question, each at its best rate)."""
    wiki, first = studies["wikipedia"], {arm: by_lr[lrs[0]] for arm, by_lr in studies.items()}
    scores = {
        "random": {lr: wiki[lr]["finetuning"]["results"]["sst-2"]["random"] for lr in lrs},
        **{
            arm: {lr: by_lr[lr]["finetuning"]["results"]["sst-2"]["pretrained"] for lr in lrs}
            for arm, by_lr in studies.items()
        },
    }
    best = {arm: max(lrs, key=lambda lr: by_lr[lr]["mean"]) for arm, by_lr in scores.items()}
    top = {arm: scores[arm][best[arm]] for arm in ARMS}  # each start at its best rate (chosen on dev, for all alike)
    arms = {
        arm: {
            "checkpoint": starts[arm],
            "pretraining": pretraining_line(first.get(arm, {}).get("pretraining")),
            "pretraining_report": first.get(arm, {}).get("pretraining"),
            "sst2": {lr: {k: v for k, v in scores[arm][lr].items() if k != "date"} for lr in lrs},
            "best_lr": best[arm],
            "against_random": None
            if arm == "random"
            else {
                "same_lr": {lr: su.beats(scores[arm][lr], scores["random"][lr]) for lr in lrs},
                "best": su.beats(top[arm], top["random"]),
            },
            "linear_probe": {k: probe["results"][arm][k]["dev_accuracy"] for k in ("cls", "mean")},
        }
        for arm in ARMS
    }
    pairs = {
        f"{a} against {b}": su.beats(top[a], top[b])
        for a, b in (
            ("sst2-text", "random"),
            ("wikipedia+sst2-text", "sst2-text"),
            ("wikipedia+sst2-text", "wikipedia"),
        )
    }
    return arms, pairs


def run(plan: Plan) -> dict:
    """The study of the module's text: the four starts pre-trained and fine-tuned at every rate, their linear
    probes, the verdicts; writes <out>/adaptive_study<suffix>.json and .md and returns the report."""
    args, lrs = plan.args, plan.lrs
    plan.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    studies, text_stats = pretrain_and_fine_tune(plan)
    wiki = studies["wikipedia"][lrs[0]]
    starts = {
        "random": wiki["random_init"]["checkpoint"],
        **{arm: by_lr[lrs[0]]["pretraining"]["checkpoint"] for arm, by_lr in studies.items()},
    }
    probe = linear_probe_of(plan, starts)
    arms, pairs = arm_rows(lrs, studies, starts, probe)
    cpu, flags = su.cpu_description()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": plan.command,
        "cpu": f"{cpu} ({', '.join(flags) or 'no bf16 flags'})",
        "sst2_text": text_stats,
        "learning_rates": lrs,
        "finetuning": {
            "sst2_max_train_examples": args.sst2_max_train_examples,
            "sst2_epochs": args.sst2_epochs,
            "seeds": len(su.parse_seeds(args.seeds)),
            "batch": args.small_batch,
        },
        "majority": wiki["finetuning"]["baselines"]["sst-2"],
        "arms": arms,
        "pairs": pairs,
        "rule": su.RULE,
        "linear_probe": str(plan.out / "linear_probe.json"),
        "wall_seconds": round(time.time() - started, 1),
    }
    su.write_report(plan.out, f"adaptive_study{plan.suffix}", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
