"""Issue 27, item 5: a small BERT (BERT-mini, BERT-small) pre-trained on one GPU in minutes, on the Wikipedia slice.

Three sub-commands: one before the GPU call, one on the GPU machine, one after it:

    python -m bench.gpu_study prepare --out .gpu_data        [--slice ../shared/data/wikipedia-en-slice/text]
    python -m bench.gpu_study run --text_dir T --eval_dir E --vocab V --config C --out OUT [--budget_s 300]
    python -m bench.gpu_study import --from OUT --to RUNS

`prepare` (here, about five minutes on 2 cores): the folder that `run` and bench/gpu_study_call.sh read, made from
the Wikipedia slice by the pipeline's own stages, as the CPU studies made theirs: `data.bertPrep` text_formatting and
sharding (32 training shards, 2 held-out shards of whole articles, 2% of the text), a 16,000-piece vocabulary
learned by `data.create_vocab --limit_alphabet 1000` from the training shards alone, and `data.bertPrep
create_hdf5_files --phase 1` with it (sequence 128, 20 predictions, dupe factor 5). It keeps text/ (the training
shards, xz), eval/ (the first --eval_samples sequences of the first held-out HDF5 shard: what `run` evaluates),
vocab.txt, BERT-mini's and BERT-small's configs for that vocabulary (Turc et al.'s shapes, dropout 0.1), glue.tar.xz
(MRPC's and SST-2's train.tsv and dev.tsv) and PREPARED.json (the command, the sizes, and the held-out set's
prediction slots and unigram entropy, which equal the CPU studies' when the vocabulary is learned anew byte for byte).
The device tool carries 64 MiB with the repository: training shards beyond --max_mib are left out, the last first.

`run` (on the GPU machine; also runs on a CPU with tiny settings, which is how the tests check it):
1. Data: T holds the slice's training text shards (one sentence per line, a blank line between articles), plain or
   xz-compressed; they become dupe-factor-1 shards written unmasked (`create_pretraining_data.py --output_dir
   --dupe_factor 1 --no_static_masking`), masked anew every epoch by `--dynamic_masking`. E is the held-out folder
   of the CPU studies (static masks), evaluated on its first --eval_samples sequences as they were.
2. Probe: every run (--runs, e.g. adamw:1e-3,nvlamb:2.83e-2) trains --probe_steps steps at the same time as the
   others, evaluates and checkpoints once: this compiles the model (torch.compile is the default on a GPU; the
   compiled graphs are cached for step 3), checks every stage end to end, and measures steps per second with the
   runs side by side.
3. Pre-training: every run again, side by side, from scratch, with --max_steps = the steps that fit --budget_s at the
   slowest run's probe rate (the probe's start-up time taken off first), rounded down to a hundred and capped at
   --max_steps_cap, so that each learning-rate schedule runs to its end. A run still going at 1.25 x the budget gets
   SIGTERM: run_pretraining.py then writes a checkpoint and stops (exit 75), and that checkpoint is exported.
4. Export to OUT: per run its JSON-lines log (<name>.log.json) and its final weights in bf16
   (<name>.bf16.safetensors: 15.1 MB for BERT-mini with a 16 K vocabulary, under the device tool's 16 MiB a file;
   with --checkpoints N also the weights after 1/N, 2/N, ... of the steps, <name>.step<S>.bf16.safetensors);
   gpu_study.json (machine, data, probe, steps, each run's last evaluation and throughput) and a table on stdout.

`import` (here): turns OUT into one pre-training run folder per run that `bench.pretrain_study --pretrain_run`
fine-tunes: <RUNS>/<name>/checkpoints/ckpt_<step>.pt ({"model": fp32 state dict}) and <name>.phase1.json.

torch, safetensors and the modules that load torch are imported in the functions that use them: `prepare` and the
results page (which imports this module for its table) need none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench import study_utils as su
from bert_recipe.io import atomic_io

REPO = su.REPO


def parse_runs(text: str) -> list[tuple[str, str, str]]:
    """'adamw:1e-3,nvlamb:2.83e-2' -> [(name, optimizer, lr)]; the name is optimizer_lr."""
    runs = []
    for item in text.split(","):
        optimizer, _, lr = item.partition(":")
        if optimizer not in ("adamw", "nvlamb") or not lr:
            raise ValueError(f"--runs item {item!r}: expected OPTIMIZER:LR with OPTIMIZER adamw or nvlamb")
        float(lr)
        runs.append((f"{optimizer}_{lr}", optimizer, lr))
    return runs


def last_record(log: Path, step=None, key: str | None = None) -> dict:
    """The data of the last JSON line of `log` (at `step`, holding `key`), or {}."""
    return next(
        (
            r.get("data", {})
            for r in reversed(atomic_io.read_json_lines(log))
            if (step is None or r.get("step") == step) and (key is None or key in r.get("data", {}))
        ),
        {},
    )


def steps_that_fit(budget_s: float, probe_steps: int, probe_wall_s: float, steps_per_s: float, cap: int) -> int:
    """Steps that fit `budget_s` at `steps_per_s`, after the probe's start-up (its wall time minus its steps' time),
    rounded down to a hundred, at least 100, then at most `cap`."""
    startup = max(0.0, probe_wall_s - probe_steps / steps_per_s)
    steps = int((budget_s - startup) * steps_per_s) // 100 * 100
    return min(cap, max(100, steps))


def prepare_data(args, work: Path, log) -> dict:
    """Text shards (plain or .xz) -> dupe-factor-1 unmasked HDF5 shards in work/shards."""
    text = work / "text"
    text.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for p in args.text_dir.iterdir() if p.name.endswith((".txt", ".txt.xz")))
    if not sources:
        raise SystemExit(f"gpu_study: error: --text_dir {args.text_dir} holds no .txt or .txt.xz files")
    started = time.time()

    def unpack(src: Path) -> None:
        target = text / src.name.removesuffix(".xz")
        if src.suffix == ".xz":
            with open(target, "wb") as f:
                subprocess.run(["xz", "-dc", str(src)], stdout=f, check=True)
        else:
            shutil.copyfile(src, target)

    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        list(pool.map(unpack, sources))
    unpacked = time.time() - started
    cmd = [
        sys.executable,
        "create_pretraining_data.py",
        "--input_file",
        str(text),
        "--output_dir",
        str(work / "shards"),
        "--vocab_file",
        str(args.vocab),
        "--do_lower_case",
        "--max_seq_length",
        "128",
        "--max_predictions_per_seq",
        "20",
        "--dupe_factor",
        "1",
        "--random_seed",
        "12345",
        "--no_static_masking",
        "--compression",
        "none",
        "--num_workers",
        str(args.workers),
        "--no_progress",
    ]
    log(" ".join(cmd))
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"gpu_study: create_pretraining_data.py failed (exit {result.returncode}): "
            f"{result.stderr.strip().splitlines()[-1:]}"
        )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        "text_shards": len(sources),
        "unpack_s": round(unpacked, 1),
        "shard_s": round(time.time() - started - unpacked, 1),
        "instances": summary.get("instances"),
        "tokens": summary.get("tokens"),
    }


def pretraining_command(
    args, work: Path, run_dir: Path, optimizer: str, lr: str, steps: int, eval_steps: int, checkpoints: int = 1
) -> list[str]:
    return [
        sys.executable,
        "run_pretraining.py",
        "--do_train",
        "--input_dir",
        str(work / "shards"),
        "--eval_dir",
        str(args.eval_dir),
        "--max_eval_samples",
        str(args.eval_samples),
        "--eval_steps",
        str(eval_steps),
        "--config_file",
        str(args.config),
        "--vocab_file",
        str(args.vocab),
        "--output_dir",
        str(run_dir / "checkpoints"),
        "--max_seq_length",
        "128",
        "--max_predictions_per_seq",
        "20",
        "--dynamic_masking",
        "--train_batch_size",
        str(args.batch),
        "--max_steps",
        str(steps),
        "--optimizer",
        optimizer,
        "--learning_rate",
        lr,
        "--warmup_proportion",
        str(args.warmup_proportion),
        "--lr_schedule",
        "linear",
        "--mlm_bias_init",
        "unigram",
        "--mix_shards",
        str(args.mix_shards),
        "--num_workers",
        str(args.loader_workers),
        "--num_steps_per_checkpoint",
        str(max(1, steps // checkpoints)),
        "--keep_checkpoints",
        str(checkpoints + (1 if steps % checkpoints else 0)),  # + the final step's
        "--log_freq",
        str(max(1, min(100, steps // 10))),
        "--disable_progress_bar",
        "--json-summary",
        str(run_dir / "log.json"),
        *args.extra,
    ]


def run_side_by_side(
    commands: dict[str, list[str]], logs: dict[str, Path], kill_after_s: float | None, log
) -> dict[str, dict]:
    """Start every command at once; SIGTERM the ones still running after kill_after_s; wall time and exit code."""
    started = time.time()
    procs = {}
    for name, cmd in commands.items():
        log(f"[{name}] {' '.join(cmd)}")
        procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=open(logs[name], "w"), stderr=subprocess.STDOUT)
    results, terminated = {}, set()
    while len(results) < len(procs):
        time.sleep(0.5)
        for name, proc in procs.items():
            if name in results:
                continue
            if proc.poll() is not None:
                results[name] = {
                    "returncode": proc.returncode,
                    "wall_s": round(time.time() - started, 1),
                    "terminated": name in terminated,
                }
            elif kill_after_s is not None and time.time() - started > kill_after_s and name not in terminated:
                log(f"[{name}] still running after {kill_after_s:.0f} s: SIGTERM (it checkpoints and stops)")
                proc.send_signal(signal.SIGTERM)
                terminated.add(name)
    return results


def environment() -> dict:
    import torch  # on use (see the module docstring)

    info = {"torch": torch.__version__, "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=torch.cuda.get_device_name(0),
            cuda=torch.version.cuda,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
        )
    else:
        info["device"] = "cpu"
    info["cpu"], info["cpu_count"] = su.cpu_description()[0], os.cpu_count()
    return info


def export_weights(checkpoint: Path, target: Path) -> int:
    """The checkpoint's model weights in bf16 (floating tensors; others as they are) as safetensors, its model config
    and step in the file's metadata; returns bytes."""
    import torch  # on use, as safetensors and checkpoint_io (see the module docstring)
    from safetensors.torch import save

    from bert_recipe.io import checkpoint_io

    ckpt = checkpoint_io.load_pt(checkpoint)
    tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in ckpt["model"].items()}
    data = save(tensors, metadata={"config": json.dumps(ckpt["config"]), "step": str(ckpt.get("step"))})
    with atomic_io.atomic_open(target) as f:
        f.write(data)
    return len(data)


def progress_log(path: Path) -> Callable[[str], None]:
    """A log function for `run`: each message after the time of day, on stdout and appended to `path` (flushed at
    once: the device call may be cut off at any moment)."""
    progress = open(path, "a")

    def log(message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        progress.write(line + "\n")
        progress.flush()

    return log


@dataclass(frozen=True)
class Stage:
    """One training of every run side by side: its folder under --work (probe, pretrain), the steps, the
    evaluation interval (0: none), when a run still going gets SIGTERM (None: never), the checkpoints kept."""

    name: str
    steps: int
    eval_steps: int
    kill_after_s: float | None
    checkpoints: int = 1


def side_by_side(
    args: argparse.Namespace, runs: list[tuple[str, str, str]], stage: Stage, log: Callable[[str], None]
) -> dict[str, dict]:
    """Every run of --runs trained at once from scratch in <work>/<stage>/<name>/; per run its exit code, wall
    time, FINAL record, last evaluation and folder (a failed run's last output lines are logged)."""
    dirs = {name: args.work / stage.name / name for name, _, _ in runs}
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    commands = {
        name: pretraining_command(
            args, args.work, dirs[name], opt, lr, stage.steps, stage.eval_steps, stage.checkpoints
        )
        for name, opt, lr in runs
    }
    results = run_side_by_side(commands, {n: dirs[n] / "output.txt" for n in dirs}, stage.kill_after_s, log)
    for name, result in results.items():
        result["final"] = last_record(dirs[name] / "log.json", "FINAL")
        result["eval"] = last_record(dirs[name] / "log.json", key="eval_mlm_loss")
        result["dir"] = dirs[name]
        log(
            f"[{name}] {stage.name}: exit {result['returncode']} in {result['wall_s']} s, "
            f"{result['final'].get('training_sequences_per_second', 0):.0f} seq/s, eval {result['eval']}"
        )
        if result["returncode"] not in (0, 75):
            tail = (dirs[name] / "output.txt").read_text().splitlines()[-15:]
            log(f"[{name}] output's last lines:\n" + "\n".join(tail))
    return results


def probe_steps(
    args: argparse.Namespace, runs: list[tuple[str, str, str]], report: dict, log: Callable[[str], None]
) -> int:
    """Step 2: the probe (--probe_steps of every run side by side, its checkpoints exported to check the export);
    report["probe"] and report["steps"] set; returns the steps that fit --budget_s at the slowest run's rate."""
    from bert_recipe.io.checkpoint_io import CheckpointManager

    probe = side_by_side(args, runs, Stage("probe", args.probe_steps, 0, None), log)
    failed = [n for n, r in probe.items() if r["returncode"] != 0 or not r["final"]]
    if failed:
        raise SystemExit(f"gpu_study: the probe failed for {', '.join(failed)}: see {args.out / 'gpu_study.log'}")
    for name, r in probe.items():  # the probe's own checkpoint exports too: the export path is checked before step 3
        found = CheckpointManager(r["dir"] / "checkpoints").all()
        export_weights(found[max(found)], args.work / f"{name}.probe.safetensors")
    rate = min(r["final"]["training_sequences_per_second"] for r in probe.values()) / args.batch
    wall = max(r["wall_s"] for r in probe.values())
    steps = steps_that_fit(args.budget_s, args.probe_steps, wall, rate, args.max_steps_cap)
    report["probe"] = {
        "steps": args.probe_steps,
        "wall_s": wall,
        "steps_per_s": round(rate, 2),
        "sequences_per_s": {n: round(r["final"]["training_sequences_per_second"], 1) for n, r in probe.items()},
    }
    report["steps"] = steps
    log(f"probe: {rate:.2f} steps/s side by side, start-up and probe {wall:.0f} s: {steps} steps each")
    return steps


def export_run(args: argparse.Namespace, name: str, r: dict) -> dict:
    """Step 4 for one run of side_by_side: its newest checkpoint's weights (and, with --checkpoints N, the earlier
    ones) as bf16 safetensors and its log into --out; returns the run's entry of gpu_study.json."""
    from bert_recipe.io.checkpoint_io import CheckpointManager

    entry = {
        "returncode": r["returncode"],
        "wall_s": r["wall_s"],
        "terminated": r["terminated"],
        "final": r["final"],
        "eval": r["eval"],
    }
    found = CheckpointManager(r["dir"] / "checkpoints").all()
    if found:
        entry["checkpoint_step"] = max(found)
        entry["weights_bytes"] = export_weights(found.pop(max(found)), args.out / f"{name}.bf16.safetensors")
        # --checkpoints N: the earlier ones too (the run's weights after 1/N, 2/N, ... of its steps), each as
        # <name>.step<S>.bf16.safetensors, for probing how transfer grows with the tokens seen.
        entry["earlier_steps"] = sorted(found)
        for step, path in found.items():
            export_weights(path, args.out / f"{name}.step{step}.bf16.safetensors")
    if (r["dir"] / "log.json").is_file():
        shutil.copyfile(r["dir"] / "log.json", args.out / f"{name}.log.json")
    return entry


def cmd_run(args: argparse.Namespace) -> dict:
    """`run`: the inputs checked, then steps 1-4 of the module's text; writes <out>/gpu_study.json and returns it."""
    runs = parse_runs(args.runs)
    for flag, path in (
        ("--text_dir", args.text_dir),
        ("--eval_dir", args.eval_dir),
        ("--vocab", args.vocab),
        ("--config", args.config),
    ):
        if not path.exists():
            raise SystemExit(f"gpu_study: error: {flag} {path} does not exist")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    log = progress_log(args.out / "gpu_study.log")
    report = {
        "environment": environment(),
        "runs": {},
        "settings": {
            "config": args.config.name,
            "batch": args.batch,
            "warmup_proportion": args.warmup_proportion,
            "schedule": "linear",
            "mix_shards": args.mix_shards,
            "eval_samples": args.eval_samples,
            "budget_s": args.budget_s,
            "extra": args.extra,
        },
    }
    log(f"environment: {report['environment']}")
    report["data"] = prepare_data(args, args.work, log)
    log(f"data: {report['data']}")
    steps = probe_steps(args, runs, report, log)
    main_runs = side_by_side(
        args,
        runs,
        Stage("pretrain", steps, max(1, steps // args.evaluations), 1.25 * args.budget_s, args.checkpoints),
        log,
    )
    for name, r in main_runs.items():
        report["runs"][name] = export_run(args, name, r)
    atomic_io.atomic_write_json(args.out / "gpu_study.json", report)
    print_table(report, log)
    return report


def print_table(report: dict, log) -> None:
    log("| run | steps | seq/s | wall s | held-out loss | unigram entropy | below | [MASK] acc | context gain |")
    log("|---|---|---|---|---|---|---|---|---|")
    for name, r in report["runs"].items():
        e, f = r["eval"], r["final"]
        if not e:
            log(f"| {name} | {r.get('checkpoint_step')} | - | {r['wall_s']} | no evaluation | | | | |")
            continue
        log(
            f"| {name} | {f.get('step', r.get('checkpoint_step'))} | {f.get('training_sequences_per_second', 0):.0f} "
            f"| {r['wall_s']} | {e['eval_mlm_loss']:.3f} | {e['eval_unigram_entropy']:.3f} "
            f"| {e['eval_unigram_entropy'] - e['eval_mlm_loss']:+.3f} | {e['eval_mask_accuracy']:.3f} "
            f"| {100 * e['eval_context_gain']:+.1f} |"
        )


def curves(log: Path) -> dict:
    """A run's JSON-lines log -> {"losses": [[step, training masked-LM loss]], "evals": [[step, [MASK] accuracy,
    held-out loss, context gain, unigram entropy]]} (study_utils.plot_runs' layout)."""
    run = su.run_log(log)
    return {
        "losses": run["losses"],
        "evals": [
            [e["step"], e["eval_mask_accuracy"], e["eval_mlm_loss"], e["eval_context_gain"], e["eval_unigram_entropy"]]
            for e in run["evals"]
        ],
    }


def markdown(studies: list[tuple[Path, dict]], heading: str = "##", image: str | None = None) -> str:
    """The results page's section: every run of every `run` call (each a gpu_study.json, its logs beside it)."""
    lines = [f"{heading} Pre-training on one GPU (bench.gpu_study)", ""]
    for _path, report in studies[:1]:
        env, st = report["environment"], report["settings"]
        lines += [
            f"{env.get('device')} ({env.get('gpu_memory_gib')} GiB), torch {env.get('torch')}, CUDA "
            f"{env.get('cuda')}, {env.get('cpu_count')} CPU cores ({env.get('cpu')}); each call's model "
            f"config in the column 'model', batch {st['batch']}, warm-up {st['warmup_proportion']:.0%} then "
            f"linear decay, --mlm_bias_init unigram, --dynamic_masking, --mix_shards {st['mix_shards']}, bf16 "
            "autocast, torch.compile; held-out: the "
            f"first {st['eval_samples']} sequences of the CPU studies' evaluation set. The runs of one call "
            "train side by side on the one GPU, each for the steps that fit the call's budget.",
            "",
        ]
    lines += [
        "| call (date, budget) | model | run | steps | sequences/s | wall s | held-out loss | unigram entropy "
        "| below it | [MASK] accuracy | context gain (points) | end |",
        "|" + "---|" * 12,
    ]
    for path, report in studies:
        call = (
            f"{path.parent.name} ({report['environment'].get('date', '')[:16]}, {report['settings']['budget_s']:.0f} s)"
        )
        for name, run in report["runs"].items():
            evals = curves(path.parent / f"{name}.log.json")["evals"]
            finite = [e for e in evals if e[2] == e[2]]  # NaN != NaN
            last = finite[-1] if finite else None
            end = (
                "finished"
                if run["returncode"] == 0
                else f"exit {run['returncode']}"
                + (": diverged (the last row is its last finite evaluation)" if len(finite) < len(evals) else "")
            )
            steps = run.get("checkpoint_step") or f"{report.get('steps')} planned"
            sps = run["final"].get("training_sequences_per_second")
            cells = (
                [
                    f"{last[2]:.3f}",
                    f"{last[4]:.3f}",
                    f"{last[4] - last[2]:+.3f}",
                    f"{last[1]:.3f}",
                    f"{100 * last[3]:+.1f}",
                ]
                if last
                else ["-"] * 5
            )
            if last and run["returncode"] != 0:
                cells[0] += f" (step {last[0]})"
            lines.append(
                f"| {call} | {report['settings']['config']} | {name} | {steps} | "
                f"{f'{sps:,.0f}' if sps else '-'} | {run['wall_s']} | " + " | ".join(cells) + f" | {end} |"
            )
    lines.append("")
    if image:
        lines += [f"![gpu_study]({image})", ""]
    return "\n".join(lines)


# Turc et al.'s shapes (BERT-Mini: L=4, H=256; BERT-Small: L=4, H=512), with BERT's dropout; vocab_size is set by
# `prepare` from the learned vocabulary.
SHAPES = {
    "mini": {"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
    "small": {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048},
}


def shape_configs(vocab_entries: int, out: Path) -> list[Path]:
    """bert-<shape>-<N>k.json for each of SHAPES: 4 layers, dropout 0.1, vocab_size = the vocabulary's entries
    rounded up to a multiple of 8 (what run_pretraining.py --vocab_file accepts)."""
    from modeling import BertConfig  # torch-backed: on use (see the module docstring)

    vocab_size = -(-vocab_entries // 8) * 8
    made = []
    for shape, dims in SHAPES.items():
        path = out / f"bert-{shape}-{round(vocab_entries / 1000)}k.json"
        config = BertConfig(
            vocab_size=vocab_size,
            num_hidden_layers=4,
            max_position_embeddings=512,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            **dims,
        )
        config.to_json_file(path)  # inside the .part folder, renamed whole when complete
        made.append(path)
    return made


def heldout_summary(eval_dir: Path, samples: int, vocab: list[str]) -> dict:
    """What run_pretraining.py's evaluation reads of `eval_dir` (its first `samples` sequences): the prediction
    slots, the [MASK]ed ones it scores (validation.mask_slots) and the unigram entropy of their targets."""
    from bert_recipe.pretraining.validation import SpecialIds, mask_slots, unigram_entropy

    arrays = su.read_shards(eval_dir, samples, ("input_ids", "masked_lm_positions", "masked_lm_ids"))
    targets = arrays["masked_lm_ids"][arrays["masked_lm_positions"] > 0]
    special = SpecialIds.from_vocab({token: i for i, token in enumerate(vocab)})
    return {
        "sequences": int(len(arrays["input_ids"])),
        "prediction_slots": int(len(targets)),
        "mask_slots": int(mask_slots(arrays, special).sum()),
        "unigram_entropy": round(unigram_entropy(targets), 6) if len(targets) else None,
    }


def first_sequences(src: Path, dst: Path, n: int) -> int:
    """An HDF5 shard holding the first `n` sequences of `src` (every array and attribute, same dtypes and
    compression): all that `run` evaluates of it with --eval_samples n; returns the sequences written."""
    import h5py

    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:  # dst is inside prepare's .part folder
        g.attrs.update(dict(f.attrs))
        for key, data in f.items():
            rows = min(n, len(data)) if n > 0 else len(data)
            chunks = (min(rows, data.chunks[0]), *data.chunks[1:]) if data.chunks and rows else None
            g.create_dataset(
                key,
                data=data[:rows],
                compression=data.compression,
                compression_opts=data.compression_opts,
                chunks=chunks,
            )
        return rows


def shards_that_fit(sizes: list[int], room: int) -> int:
    """How many of `sizes` (bytes, in order) fit in `room` bytes taken from the first one on."""
    total = 0
    for i, size in enumerate(sizes):
        total += size
        if total > room:
            return i
    return len(sizes)


def tracked_bytes() -> int:
    """Bytes of the repository's tracked files: what travels to the device machine beside the carried folder."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        return 0
    return sum(
        (REPO / name).stat().st_size for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()
    )


def prepare_folders(args: argparse.Namespace) -> Path:
    """`prepare`'s inputs checked and its folders made (paths made absolute: the pipeline's stages run from the
    repository root): --work emptied, if an earlier `prepare` made it, and marked; the staging folder <out>.part,
    renamed to --out only when complete, made anew with text/ and eval/. Returns the staging folder."""
    for name in ("out", "slice", "glue_root", "work"):  # the pipeline's stages run from the repository root
        setattr(args, name, getattr(args, name).resolve())
    if not args.slice.is_dir():
        raise SystemExit(f"gpu_study: error: --slice {args.slice} is not a folder of WikiExtractor output")
    for task in ("glue-mrpc", "glue-sst2"):
        if not (args.glue_root / task / "train.tsv").is_file():
            raise SystemExit(f"gpu_study: error: --glue_root {args.glue_root} has no {task}/train.tsv")
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"gpu_study: error: --out {args.out} is not empty: remove it or name another folder")
    work, marker = args.work, args.work / ".gpu_study_prepare"  # only a folder this command made is emptied
    if work.exists() and any(work.iterdir()) and not marker.is_file():
        raise SystemExit(
            f"gpu_study: error: --work {work} is not empty and was not made by `prepare`: name a new or empty folder"
        )
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    marker.touch()
    stage_dir = args.out.with_name(args.out.name + ".part")  # renamed to --out only when complete
    shutil.rmtree(stage_dir, ignore_errors=True)
    (stage_dir / "text").mkdir(parents=True)
    (stage_dir / "eval").mkdir()
    return stage_dir


def prepare_step(stages: dict[str, float], name: str, cmd: list[str]) -> None:
    """One stage of `prepare`, run from the repository root, its seconds into `stages`; a failure exits with the
    stage's last line of stderr."""
    t = time.time()
    print(f"gpu_study prepare: {' '.join(cmd)}", flush=True)
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"gpu_study: {name} failed (exit {result.returncode}): {' '.join(result.stderr.strip().splitlines()[-1:])}"
        )
    stages[name] = round(time.time() - t, 1)


def prepare_pipeline(args: argparse.Namespace, stage_dir: Path, stages: dict[str, float]) -> tuple[list[Path], Path]:
    """The pipeline's stages in --work: data.bertPrep text_formatting and sharding, data.create_vocab on the
    training shards alone (into the staging folder's vocab.txt), data.bertPrep create_hdf5_files with it; then the
    first held-out shard's first --eval_samples sequences into eval/. Returns (the training text shards in order,
    the held-out shard)."""
    work = args.work
    prep = [
        sys.executable,
        "-m",
        "data.bertPrep",
        "--working_dir",
        str(work),
        "--dataset",
        "wikicorpus_en",
        "--n_processes",
        str(args.workers),
        "--random_seed",
        "12345",
        "--no_progress",
    ]
    shards = [
        "--n_training_shards",
        str(args.n_training_shards),
        "--n_test_shards",
        str(args.n_test_shards),
        "--fraction_test_set",
        str(args.fraction_test_set),
    ]
    prepare_step(
        stages, "text_formatting", prep + ["--action", "text_formatting", "--wikiextractor_dir", str(args.slice)]
    )
    prepare_step(stages, "sharding", prep + ["--action", "sharding", *shards])
    shard_dir = next(work.glob("sharded_*")) / "wikicorpus_en"
    training = sorted(shard_dir.glob("wikicorpus_en_training_*.txt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    vocab = stage_dir / "vocab.txt"
    inputs = [a for path in training for a in ("--input", str(path))]  # the training shards alone, as the studies'
    prepare_step(
        stages,
        "create_vocab",
        [
            sys.executable,
            "-m",
            "data.create_vocab",
            *inputs,
            "--output_file",
            str(vocab),
            "--vocab_size",
            str(args.vocab_size),
            "--limit_alphabet",
            str(args.limit_alphabet),
            "--no_progress",
        ],
    )
    prepare_step(
        stages,
        "create_hdf5_files",
        prep + ["--action", "create_hdf5_files", "--phase", "1", "--vocab_file", str(vocab), *shards],
    )
    heldout = sorted(next(work.glob("hdf5_*")).glob("wikicorpus_en/test/*.hdf5"))
    first_sequences(heldout[0], stage_dir / "eval" / heldout[0].name, args.eval_samples)
    return training, heldout[0]


def compress_text(training: list[Path], stage_dir: Path, workers: int, stages: dict[str, float]) -> None:
    """The training text shards xz-compressed into the staging folder's text/, `workers` at a time."""
    t = time.time()

    def compress(src: Path) -> None:
        with open(stage_dir / "text" / (src.name + ".xz"), "wb") as f:
            subprocess.run(["xz", "-6", "-c", str(src)], stdout=f, check=True)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(compress, training))
    stages["xz"] = round(time.time() - t, 1)


def keep_text_that_fits(args: argparse.Namespace, stage_dir: Path, training: list[Path]) -> int:
    """Leave out the compressed training shards that do not fit --max_mib beside the repository's tracked files and
    the staging folder's other files, the last ones first; returns how many are kept."""
    # What travels to the device machine (the repository's tracked files and the carried folder) has a limit: the
    # training text is the bulk, so only the shards that fit go, the first ones first.
    text = [stage_dir / "text" / (p.name + ".xz") for p in training]
    others = sum(p.stat().st_size for p in stage_dir.rglob("*") if p.is_file() and p not in text)
    room = args.max_mib * 2**20 - tracked_bytes() - others if args.max_mib > 0 else sum(p.stat().st_size for p in text)
    kept = shards_that_fit([p.stat().st_size for p in text], room)
    if kept == 0:
        raise SystemExit(
            f"gpu_study: error: no training shard fits --max_mib {args.max_mib} beside the repository "
            "and the other files: raise it or make the shards smaller (--n_training_shards)"
        )
    for p in text[kept:]:
        p.unlink()
    if kept < len(text):
        print(
            f"gpu_study prepare: {kept} of the {len(text)} training shards fit --max_mib {args.max_mib} beside "
            f"the repository; {len(text) - kept} left out",
            flush=True,
        )
    return kept


def cmd_prepare(args: argparse.Namespace) -> dict:
    """The Wikipedia slice -> args.out (text/, eval/, vocab.txt, two model configs, glue.tar.xz, PREPARED.json)."""
    started, stages = time.time(), {}
    stage_dir = prepare_folders(args)
    training, heldout = prepare_pipeline(args, stage_dir, stages)
    compress_text(training, stage_dir, args.workers, stages)
    entries = (stage_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    configs = shape_configs(len(entries), stage_dir)
    glue = [
        f"{task}/{name}"
        for task in ("glue-mrpc", "glue-sst2")
        for name in ("train.tsv", "dev.tsv", "PROVENANCE.txt")
        if (args.glue_root / task / name).is_file()
    ]
    prepare_step(stages, "glue", ["tar", "-cJf", str(stage_dir / "glue.tar.xz"), "-C", str(args.glue_root), *glue])
    kept = keep_text_that_fits(args, stage_dir, training)
    report = {
        "command": "python -m bench.gpu_study prepare " + " ".join(args.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": su.cpu_description()[0],
        "stages_s": stages,
        "wall_s": round(time.time() - started, 1),
        "training_shards": len(training),
        "text_shards": kept,
        "max_mib": args.max_mib,
        "heldout_shard": heldout.name,
        "heldout": heldout_summary(stage_dir / "eval", args.eval_samples, entries),
        "vocab_entries": len(entries),
        "configs": [p.name for p in configs],
        "bytes": sum(p.stat().st_size for p in stage_dir.rglob("*") if p.is_file()),
    }
    atomic_io.atomic_write_json(stage_dir / "PREPARED.json", report)
    if args.out.exists():
        args.out.rmdir()  # empty (checked above)
    stage_dir.rename(args.out)
    print(json.dumps(report), flush=True)
    return report


def cmd_import(args) -> list[Path]:
    """OUT of `run` -> <to>/<name>/ run folders for bench.pretrain_study --pretrain_run."""
    from safetensors import safe_open  # on use, as modeling (see the module docstring)
    from safetensors.torch import load_file

    from modeling import BertConfig

    report = json.loads((args.source / "gpu_study.json").read_text())
    made = []
    for name, entry in report["runs"].items():
        if "checkpoint_step" not in entry:  # diverged or failed before its first checkpoint: nothing to fine-tune
            print(f"gpu_study: {name} skipped: it ended with exit {entry['returncode']} and no checkpoint")
            continue
        weights, log_file = args.source / f"{name}.bf16.safetensors", args.source / f"{name}.log.json"
        if not weights.is_file() or not log_file.is_file():
            raise SystemExit(f"gpu_study: error: {weights} or {log_file} is missing: the run did not finish there")
        run_dir = args.to / name
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        with safe_open(str(weights), "pt") as f:
            config = json.loads((f.metadata() or {}).get("config", "null"))
        if config is None:  # exported before the metadata carried it
            if args.config is None:
                raise SystemExit(f"gpu_study: error: {weights} carries no model config: give --config")
            config = BertConfig.from_json_file(args.config).to_dict()
        exports = {entry["checkpoint_step"]: weights}
        for step in entry.get("earlier_steps", []):  # brought back only where they fit the device tool's files
            earlier = args.source / f"{name}.step{step}.bf16.safetensors"
            if earlier.is_file():
                exports[step] = earlier
            else:
                print(f"gpu_study: {name}: {earlier.name} did not come back: step {step} is not imported")
        for step, path in exports.items():
            state = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(path)).items()}
            atomic_io.atomic_torch_save(
                {"model": state, "config": config, "step": step}, run_dir / "checkpoints" / f"ckpt_{step}.pt"
            )
        shutil.copyfile(log_file, run_dir / f"{name}.phase1.json")
        made.append(run_dir)
        print(f"gpu_study: {run_dir} (step {entry['checkpoint_step']})")
    return made


def build_parser() -> argparse.ArgumentParser:
    """The command line: the three sub-commands and their flags."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_study",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="on the GPU machine: data, probe, pre-training side by side, export")
    p.add_argument("--text_dir", type=Path, required=True, help="training text shards (.txt or .txt.xz)")
    p.add_argument("--eval_dir", type=Path, required=True, help="held-out HDF5 shards (seq 128, 20 predictions)")
    p.add_argument("--vocab", type=Path, required=True)
    p.add_argument("--config", type=Path, required=True, help="the model's bert_config.json")
    p.add_argument("--out", type=Path, required=True, help="logs, weights, gpu_study.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_study"), help="shards and checkpoints (scratch)")
    p.add_argument("--runs", default="adamw:1e-3,nvlamb:2.83e-2", help="OPTIMIZER:LR,... trained side by side")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup_proportion", type=float, default=0.1)
    p.add_argument("--mix_shards", type=int, default=8)
    p.add_argument("--budget_s", type=float, default=300.0, help="wall seconds of the pre-training (step 3)")
    p.add_argument("--probe_steps", type=int, default=300)
    p.add_argument("--max_steps_cap", type=int, default=30000, help="at most this many steps (the preset's 30,000)")
    p.add_argument("--evaluations", type=int, default=10, help="held-out evaluations per run")
    p.add_argument(
        "--checkpoints",
        type=int,
        default=1,
        help="checkpoints kept and exported per run, evenly spaced "
        "(1: the final weights only; N: also after 1/N, 2/N, ... of the steps)",
    )
    p.add_argument("--eval_samples", type=int, default=2048)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the data")
    p.add_argument("--loader_workers", type=int, default=4, help="DataLoader workers per run")
    p.add_argument("extra", nargs="*", help="after --: more run_pretraining.py flags for every run")
    r = sub.add_parser("prepare", help="here: the Wikipedia slice -> the folder that `run` reads (.gpu_data)")
    r.add_argument("--out", type=Path, required=True, help="the folder to make (absent or empty), e.g. .gpu_data")
    r.add_argument(
        "--slice",
        type=Path,
        default=su.DATA / "wikipedia-en-slice" / "text",
        help="WikiExtractor output (the shared Wikipedia slice)",
    )
    r.add_argument("--glue_root", type=Path, default=su.DATA, help="holds glue-mrpc/ and glue-sst2/")
    r.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/gpu_study_prepare"),
        help="the pipeline's working folder (scratch: new, empty, or an earlier prepare's, which is emptied first)",
    )
    r.add_argument("--n_training_shards", type=int, default=32)
    r.add_argument("--n_test_shards", type=int, default=2)
    r.add_argument("--fraction_test_set", type=float, default=0.02)
    r.add_argument("--vocab_size", type=int, default=16000)
    r.add_argument("--limit_alphabet", type=int, default=1000)
    r.add_argument(
        "--eval_samples",
        type=int,
        default=2048,
        help="held-out sequences `run` evaluates on (the summary in PREPARED.json counts these)",
    )
    r.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    r.add_argument(
        "--max_mib",
        type=float,
        default=62.0,
        help="what travels to the device machine, the "
        "repository's tracked files included (the device tool carries 64 MiB; 2 kept for the repository "
        "to grow): the training text shards that do not fit are left out, the last ones first; 0: all",
    )
    i = sub.add_parser("import", help="here: OUT -> run folders for bench.pretrain_study --pretrain_run")
    i.add_argument("--from", dest="source", type=Path, required=True)
    i.add_argument("--to", type=Path, required=True)
    i.add_argument(
        "--config", type=Path, default=None, help="the model's bert_config.json, for weights whose file carries none"
    )
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The sub-command (args.command) and its flags; args.argv: the words after the sub-command, which `prepare`'s
    report records."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)[1:]
    return args


def main(argv: list[str] | None = None):
    """python -m bench.gpu_study prepare|run|import: parse the command line, then run the sub-command."""
    args = parse(argv)
    return {"run": cmd_run, "prepare": cmd_prepare, "import": cmd_import}[args.command](args)


if __name__ == "__main__":
    main()
