"""Pre-train, then fine-tune: does the recipe's own pre-training produce a model that transfers? (issue 14)

    .venv/bin/python -m bench.pretrain_study --out results/studies/pretrain \\
        [--pretrain_out DIR] [--config configs/bert-mini.json] [--phase1_steps 1500] [--phase2_steps 30] \\
        [--dupe_factor 5] [--batch 32] [--lr 1e-2] [--optimizer nvlamb] [--seeds 1,2,3,4,5] [--tasks mrpc,sst-2] \\
        [--models pretrained,random,minilm] [--small_lr 2e-4] [--minilm_mrpc_json F] [--minilm_sst2_json F]

1. Pre-training, with the recipe's own launcher: `scripts/run_cpu_demo.sh --config C --out PRETRAIN_OUT
   --phase1_steps N1 --phase2_steps N2 --dupe_factor D --batch B --lr LR --optimizer O [--vocab V] [--corpus T]
   [--init_checkpoint C]`
   (the demo's own text unless --corpus: 25 files of the Wikipedia slice, the last 5% of the documents held out;
   its vocabulary learned from the training text unless --vocab; phase 1 at sequence 64 with 30% masked and a
   constant rate, phase 2 at 512, batch 8).
   Or reuse: when --pretrain_out (default <out>/pretrain) already holds a run_*/ folder, the newest one is used as
   it is, if both its phases finished (a FINAL record at their last step); an unfinished newest run is refused,
   never silently replaced. The model fine-tuned is its last checkpoint, checkpoints/ckpt_<last step>.pt.
2. Random initialisation of the same architecture: BertForPreTraining(config) of modeling.py after
   dist_env.set_seed(--random_init_seed), saved as <out>/random_init/ckpt_0.pt ({"model", "config"}, the layout of
   run_pretraining.py's checkpoints) with bert_config.json and the pre-training's vocab.txt beside it. With the default
   seed 42, the pre-training's own seed, these are exactly the weights the pre-training started from.
3. Fine-tuning, with bench.stability (one run_glue.py process per seed): every model on every task, --seeds
   (default 5). MRPC: the full training set, 3 epochs; SST-2: the first 10,000 training sentences, 1 epoch; all
   at sequence 128, batch 32. Learning rates: MiniLM 1e-4 (bench.stability's default, the lead's MiniLM runs);
   the two small models --small_lr 2e-4 (not tuned here: between 1e-4 and 3e-4, the values Google's BERT
   miniatures grid offers a 4-layer, 256-wide BERT; the same for both so that only the starting weights differ).
   A stability JSON that already exists is reused: the one under <out>/<model>_<task>/ when its seeds and settings
   match, or any given with --minilm_mrpc_json / --minilm_sst2_json / --stability_json MODEL:TASK=FILE (differences
   in settings are printed and recorded as warnings).
4. Report (<out>/pretrain_study.json and .md, <out>/pretrain_loss.png, <out>/pretrain_seeds.png): held-out
   masked-LM accuracy against always guessing the most frequent masked token; a context probe (context_probe:
   the final checkpoint's held-out accuracy with and without the context, beside unigram and bigram count models
   of the training shard), run when the training shards sit beside the run; each model's mean, standard
   deviation, min and max per task, and the majority-class score of each dev set; and the verdict, by this rule:
   pre-trained beats random initialisation on a task when mean(pre-trained) - mean(random) > max(std(pre-trained),
   std(random)) (sample standard deviations over the seeds).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import stability
from bench import study_utils as su
from bert_recipe.training.dist_env import DistEnv, set_seed
from tokenization import load_vocab

REPO = su.REPO
MODELS = ("pretrained", "random", "minilm")
TASKS = ("mrpc", "sst-2")
GLUE_FOLDER = {"mrpc": "glue-mrpc", "sst-2": "glue-sst2"}


def folder_name(model: str, task: str) -> str:
    return f"{model}_{task.replace('-', '')}"


# --------------------------------------------------------------------------------------------------------------
# 1. pre-training: run it or reuse it


def newest_run(pretrain_out: Path) -> Path | None:
    runs = sorted(p for p in pretrain_out.glob("run_*") if p.is_dir()) if pretrain_out.is_dir() else []
    return runs[-1] if runs else None


def run_state(run_dir: Path) -> dict:
    """Both phases of a run_cpu_demo.sh run folder, summarised; finished only when both phases are, and the last
    checkpoint is on disk."""
    logs = sorted(run_dir.glob("*.phase1.json"))
    job = logs[0].name[: -len(".phase1.json")] if logs else None
    phase1 = su.phase_summary(run_dir / f"{job}.phase1.json") if job else su.phase_summary(run_dir / "none")
    phase2 = su.phase_summary(run_dir / f"{job}.phase2.json") if job else su.phase_summary(run_dir / "none")
    # A run of phase 1 only (no phase-2 log at all) is finished with phase 1.
    phase1_only = job is not None and not (run_dir / f"{job}.phase2.json").exists()
    last = phase1 if phase1_only else phase2
    checkpoint = None
    if last["finished"]:
        checkpoint = run_dir / "checkpoints" / f"ckpt_{last['final']['step']}.pt"
    finished = phase1["finished"] and last["finished"] and checkpoint is not None and checkpoint.is_file()
    if finished:
        state = "finished"
    elif not phase1["finished"]:
        state = f"phase 1 {phase1['state']}"
    elif not phase2["finished"]:
        state = f"phase 1 finished, phase 2 {phase2['state']}"
    else:
        state = f"both phases finished but {checkpoint} is missing"
    return {
        "run_dir": str(run_dir),
        "job": job,
        "phase1": phase1,
        "phase2": phase2,
        "finished": finished,
        "state": state,
        "checkpoint": str(checkpoint) if checkpoint else None,
    }


def demo_command(args) -> list[str]:
    cmd = [
        "bash",
        str(REPO / "scripts" / "run_cpu_demo.sh"),
        "--config",
        str(args.config),
        "--out",
        str(args.pretrain_out),
        "--phase1_steps",
        str(args.phase1_steps),
        "--phase2_steps",
        str(args.phase2_steps),
        "--dupe_factor",
        str(args.dupe_factor),
        "--batch",
        str(args.batch),
        "--lr",
        str(args.lr),
        "--optimizer",
        args.optimizer,
        "--processes",
        str(args.processes),
    ]
    if args.vocab:  # else the demo learns one of --vocab_size pieces from its training text
        cmd += ["--vocab", str(args.vocab)]
    else:
        cmd += ["--vocab_size", str(args.vocab_size)]
    for corpus in args.corpus or []:
        cmd += ["--corpus", str(corpus)]
    if args.init_checkpoint:  # continued pre-training (needs --vocab and --config: the checkpoint's own)
        cmd += ["--init_checkpoint", str(args.init_checkpoint)]
    return cmd


def tee(cmd: list[str], env: dict, log_path: Path) -> int:
    """Run `cmd` in the repository, its output (stdout and stderr) both to ours and to `log_path`, as it comes."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a chunk may end inside a character
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        while chunk := proc.stdout.read1(65536):
            log_file.write(chunk)
            sys.stdout.write(decoder.decode(chunk))
            sys.stdout.flush()
        return proc.wait()


def reuse_differences(state: dict, args) -> list[str]:
    """How a reused run's settings differ from --phase1_steps, --phase2_steps, --batch x --processes (the global
    batch), --lr, --optimizer and --config."""
    p1, p2 = state["phase1"]["params"], state["phase2"]["params"]
    lines = []
    for name, have, want in (
        ("phase 1 steps", p1.get("max_steps"), args.phase1_steps),
        *((("phase 2 steps", p2.get("max_steps"), args.phase2_steps),) if p2 else ()),
        ("phase 1 global batch", p1.get("train_batch_size", 0) * p1.get("world_size", 1), args.batch * args.processes),
    ):
        if have != want:
            lines.append(f"{name} {have} (flag: {want})")
    if p1.get("learning_rate") is None or abs(p1["learning_rate"] - float(args.lr)) > 1e-12:
        lines.append(f"phase 1 learning rate {p1.get('learning_rate')} (flag: {args.lr})")
    optimizer = p1.get("optimizer")
    if optimizer != args.optimizer:
        lines.append(f"optimizer {optimizer} (flag: {args.optimizer})")
    return lines + config_differences(p1.get("config_file"), args.config)


def config_differences(used: str | None, flag: Path) -> list[str]:
    """How a run's model config (`used`, its log's config_file) differs from --config, key by key. vocab_size is
    left out: run_cpu_demo.sh sets it from the vocabulary and writes <out>/bert_config.json, so a run made from
    --config reads as the same. A config that cannot be read (a run folder that moved) is compared by file name."""
    try:
        have, want = json.loads(Path(used).read_text()), json.loads(flag.read_text())
    except (OSError, TypeError, ValueError):
        return [] if Path(used or "").name == flag.name else [f"config {used} (flag: {flag})"]
    keys = [k for k in sorted((set(have) | set(want)) - {"vocab_size"}) if have.get(k) != want.get(k)]
    return (
        [f"config {used}: " + ", ".join(f"{k} {have.get(k)!r} (flag {flag.name}: {want.get(k)!r})" for k in keys)]
        if keys
        else []
    )


def pretrained_run(args, log) -> tuple[dict, bool, list[str] | None]:
    """(run_state of the run to fine-tune, reused?, the command that pre-trained it here or None)."""
    run = args.pretrain_run or newest_run(args.pretrain_out)
    if run is not None:
        state = run_state(run)
        if not state["finished"]:
            raise SystemExit(
                f"pretrain_study: the newest pre-training run in {args.pretrain_out}, {run.name}, is not "
                f"finished ({state['state']}): wait for it to end, resume it, or move it away to "
                "pre-train again"
            )
        log(f"pretrain_study: reusing the finished pre-training run {run} ({state['checkpoint']})")
        state["warnings"] = reuse_differences(state, args)
        for line in state["warnings"]:
            log(f"warning: the reused pre-training differs from this command's flags: {line}")
        return state, True, None
    cmd = demo_command(args)
    log(f"pretrain_study: pre-training: OMP_NUM_THREADS={args.threads} {' '.join(cmd)}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHON": sys.executable}
    started = time.time()
    args.pretrain_out.mkdir(parents=True, exist_ok=True)
    log_path = args.pretrain_out / "cpu_demo_output.log"
    returncode = tee(cmd, env, log_path)
    if returncode != 0:
        raise SystemExit(
            f"pretrain_study: scripts/run_cpu_demo.sh failed (exit {returncode}); its output is above and in {log_path}"
        )
    run = newest_run(args.pretrain_out)
    state = run_state(run) if run else None
    if state is None or not state["finished"]:
        raise SystemExit(
            f"pretrain_study: run_cpu_demo.sh ended but {args.pretrain_out} holds no finished run "
            f"({state['state'] if state else 'no run_* folder'})"
        )
    state["wall_seconds"] = round(time.time() - started, 1)
    return state, False, cmd


def pretraining_report(state: dict) -> dict:
    """The numbers the report needs from a finished run: settings, losses, held-out accuracy and its baseline."""
    p1, p2 = state["phase1"], state["phase2"]

    def phase(s: dict) -> dict:
        params, final, losses = s["params"], s["final"] or {}, s["losses"]
        return {
            "steps": params.get("max_steps"),
            "batch": params.get("train_batch_size", 0) * params.get("world_size", 1),
            "learning_rate": params.get("learning_rate"),
            "max_seq_length": params.get("max_seq_length"),
            "processes": params.get("world_size"),
            "precision": params.get("precision"),
            "first_mlm_loss": losses[0][1] if losses else None,
            "final_mlm_loss": losses[-1][1] if losses else None,
            "final_loss": final.get("final_loss"),
            "seconds": final.get("e2e_train_time"),
            "sequences_per_second": final.get("training_sequences_per_second"),
        }

    evals = p1["evals"] + p2["evals"]
    started, ended = p1["started"], p2["ended"] or p1["ended"]
    eval_dir, max_eval = p1["params"].get("eval_dir"), p1["params"].get("max_eval_samples", 0)
    if not eval_dir or not Path(eval_dir).is_dir():  # the run folder moved: run_cpu_demo.sh's layout
        eval_dir = str(Path(state["run_dir"]).parent / "hdf5_heldout128")
    baseline = su.heldout_baseline(eval_dir, max_eval) if Path(eval_dir).is_dir() else None
    return {
        "run_dir": state["run_dir"],
        "checkpoint": state["checkpoint"],
        "config_file": p1["params"].get("config_file"),
        "parameters": p1["params"].get("parameters"),
        "seed": p1["params"].get("seed"),
        "phase1": phase(p1),
        "phase2": phase(p2),
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else None,
        "wall_seconds": round(ended - started, 1) if started and ended else None,
        "heldout": {
            "accuracy": evals[-1][1] if evals else None,
            "loss": evals[-1][2] if evals else None,
            "step": evals[-1][0] if evals else None,
            "baseline": baseline,
            "eval_dir": eval_dir,
            "max_eval_samples": max_eval,
            "evals": evals,
        },
        "curves": {"phase1": p1["losses"], "phase2": p2["losses"]},
    }


def _most_frequent_follower(keys: np.ndarray, values: np.ndarray) -> dict[int, int]:
    """key -> the value seen most often with it (ties: the smallest value)."""
    codes, counts = np.unique(keys.astype(np.int64) * (1 << 20) + values, return_counts=True)
    first, second = codes >> 20, codes & ((1 << 20) - 1)
    order = np.lexsort((-counts, first))  # by key, the most frequent value first
    keep = order[np.r_[True, first[order][1:] != first[order][:-1]]]
    return dict(zip(first[keep].tolist(), second[keep].tolist()))


def count_model_accuracies(train: dict, heldout: dict, special) -> dict[str, float]:
    """Three count models from the training shards' original tokens (masks undone), scored on the held-out
    [MASK]ed slots that validation.Validator scores (validation.mask_slots: nothing to copy there, `<unk>` pieces
    left out): unigram, the most frequent ordinary token; bigram, the most frequent token after the token the model
    sees just before the slot; previous+next, the most frequent token between the two tokens the model sees around
    the slot. Each backs off to the one before it when what it looks at is [MASK] or was never seen in training.
    `special`: validation.SpecialIds."""
    from bert_recipe.pretraining.data_stream import unmask
    from bert_recipe.pretraining.validation import mask_slots

    tokens = unmask(train["input_ids"], train["masked_lm_positions"], train["masked_lm_ids"]).astype(np.int64)
    real = train["input_mask"].astype(bool)
    ordinary = real & ~np.isin(tokens, [special.cls, special.sep, special.mask, special.pad])
    unigram = int(np.bincount(tokens[ordinary]).argmax())
    pairs = real[:, :-1] & ordinary[:, 1:]  # [N, S-1]: a real token followed by an ordinary one
    bigram = _most_frequent_follower(tokens[:, :-1][pairs], tokens[:, 1:][pairs])
    triples = real[:, :-2] & ordinary[:, 1:-1] & real[:, 2:]  # [N, S-2]: an ordinary token between two real ones
    around = tokens[:, :-2][triples] * (1 << 20) + tokens[:, 2:][triples]
    between = _most_frequent_follower(around, tokens[:, 1:-1][triples])

    slots = mask_slots(heldout, special)  # [N, P]
    rows, cols = np.nonzero(slots)
    positions = heldout["masked_lm_positions"][rows, cols]
    targets = heldout["masked_lm_ids"][rows, cols].astype(np.int64)
    inputs = heldout["input_ids"].astype(np.int64)
    before = inputs[rows, positions - 1]
    after = inputs[rows, np.minimum(positions + 1, inputs.shape[1] - 1)]
    guess_bigram = np.array([unigram if b == special.mask else bigram.get(b, unigram) for b in before.tolist()])
    guess_between = np.array(
        [
            g if special.mask in (b, a) else between.get(b * (1 << 20) + a, g)
            for g, b, a in zip(guess_bigram.tolist(), before.tolist(), after.tolist())
        ]
    )
    return {
        "unigram": float((targets == unigram).mean()),
        "bigram": float((guess_bigram == targets).mean()),
        "previous_next": float((guess_between == targets).mean()),
        "slots": int(len(targets)),
    }


def context_probe(
    checkpoint: str | os.PathLike,
    config_file: str | os.PathLike,
    vocab: Path,
    train_dir: str,
    eval_dir: str,
    max_samples: int,
    max_train_samples: int = 200_000,
) -> dict:
    """Does the pre-trained model read the context? On the held-out [MASK]ed slots (validation.Validator: nothing
    to copy there), its accuracy with the context and with every other token replaced by [MASK], beside three count
    models of the training shards (count_model_accuracies; the first `max_train_samples` training samples) as
    independent references: a model that reads the context beats the previous+next-token counts."""
    import torch  # here, not at the head: importing the study (adaptive_study, the results page) stays light

    from bert_recipe.io.checkpoint_io import from_pretrained
    from bert_recipe.pretraining.validation import SpecialIds, Validator
    from modeling import BertForPreTraining

    special = SpecialIds.from_vocab(load_vocab(str(vocab)))
    heldout = su.read_shards(eval_dir, max_samples)
    counts = count_model_accuracies(su.read_shards(train_dir, max_train_samples), heldout, special)
    model = from_pretrained(BertForPreTraining, checkpoint, config=str(config_file), log=None).eval()
    with torch.no_grad():
        result = Validator(heldout, special, 64, contextlib.nullcontext, DistEnv())(model)
    return {
        "model": result["eval_mask_accuracy"],
        "model_without_context": result["eval_mask_accuracy_without_context"],
        "context_gain": result["eval_context_gain"],
        "heldout_loss": result["eval_mlm_loss"],
        "unigram_entropy": result["eval_unigram_entropy"],
        **counts,
        "checkpoint": str(checkpoint),
        "max_samples": max_samples,
    }


# --------------------------------------------------------------------------------------------------------------
# 2. random initialisation


def make_random_init(config: dict, vocab: Path, seed: int, out_dir: Path) -> Path:
    """modeling.py's own initialisation of BertForPreTraining(config) after set_seed(seed), saved as
    out_dir/ckpt_0.pt with bert_config.json and vocab.txt beside it (what run_glue.py --init_checkpoint reads)."""
    import torch  # here, not at the head: importing the study stays light

    from bert_recipe.io.checkpoint_io import REDUNDANT_KEYS
    from modeling import BertConfig, BertForPreTraining

    bert_config = BertConfig.from_dict(config, source="the pre-trained checkpoint's config")
    set_seed(seed)
    model = BertForPreTraining(bert_config)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if not REDUNDANT_KEYS.match(k)}
    path = out_dir / "ckpt_0.pt"
    torch.save({"model": state, "config": bert_config.to_dict(), "step": 0, "random_init_seed": seed}, path)
    bert_config.to_json_file(out_dir / "bert_config.json")
    shutil.copyfile(vocab, out_dir / "vocab.txt")
    return path


def write_finetune_config(config: dict, dropout: float, out_dir: Path) -> Path:
    """out_dir/finetune_config_dropout<P>.json: the pre-trained checkpoint's config with hidden_dropout_prob and
    attention_probs_dropout_prob set to P (the name carries P, so a study's reuse check tells dropouts apart)."""
    from modeling import BertConfig  # torch-backed: here, so that importing the study stays light

    if not 0.0 <= dropout < 1.0:
        raise SystemExit(f"pretrain_study: --finetune_dropout {dropout}: give a probability in [0, 1)")
    bert_config = BertConfig.from_dict(
        {**config, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout},
        source="the pre-trained checkpoint's config",
    )
    path = out_dir / f"finetune_config_dropout{dropout:g}.json"
    bert_config.to_json_file(path)
    return path


def checkpoint_config(path: str | os.PathLike) -> dict:
    import torch  # here, not at the head: importing the study stays light

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt.get("config"), dict):
        raise SystemExit(f"pretrain_study: {path} carries no config (expected a ckpt_<step>.pt of run_pretraining.py)")
    return ckpt["config"]


# --------------------------------------------------------------------------------------------------------------
# 3-4. fine-tuning and the report


def task_settings(args, task: str) -> dict:
    epochs = args.mrpc_epochs if task == "mrpc" else args.sst2_epochs if task == "sst-2" else args.other_epochs
    max_train = args.sst2_max_train_examples if task == "sst-2" else None
    if args.max_train_examples is not None:
        max_train = args.max_train_examples
    return {"epochs": epochs, "max_train": max_train}


def given_jsons(args) -> dict[tuple[str, str], Path]:
    given: dict[tuple[str, str], Path] = {}
    if args.minilm_mrpc_json:
        given[("minilm", "mrpc")] = args.minilm_mrpc_json
    if args.minilm_sst2_json:
        given[("minilm", "sst-2")] = args.minilm_sst2_json
    for item in args.stability_json or []:
        key, sep, path = item.partition("=")
        model, sep2, task = key.partition(":")
        if not (sep and sep2 and model in MODELS):
            raise SystemExit(f"--stability_json {item!r}: give MODEL:TASK=FILE with MODEL one of {', '.join(MODELS)}")
        given[(model, task.lower())] = Path(path)
    return given


def markdown(
    report: dict, images: tuple[str, str] | None = ("pretrain_loss.png", "pretrain_seeds.png"), heading: str = "#"
) -> str:
    """The study's Markdown; `images`: the loss-curve and per-seed plots' links (None: none)."""
    pre, ft = report["pretraining"], report["finetuning"]
    phase1_only = bool(pre) and pre["phase2"]["steps"] is None  # a run of phase 1 alone (--pretrain_run)
    steps = (
        ""
        if not pre
        else (
            f": {pre['phase1']['steps']} pre-training steps (phase 1 only)"
            if phase1_only
            else f": {pre['phase1']['steps']} + {pre['phase2']['steps']} pre-training steps"
        )
    )
    lines = [f"{heading} Pre-train, then fine-tune{steps} ({report['date']})", ""]
    if pre:
        p1, p2, held = pre["phase1"], pre["phase2"], pre["heldout"]
        lines += [
            f"Pre-training: `{pre['config_file']}` ({pre['parameters'] or '?'} parameters), run "
            f"`{pre['run_dir']}`"
            f"{' (reused)' if report['pretraining_reused'] else ''}, started {pre.get('started') or 'n/a'}, "
            f"{su.fmt(pre.get('wall_seconds'), 0)} s from the first to the last log line; fine-tuned from "
            f"`{pre['checkpoint']}`.",
            "",
        ]
        warnings = report.get("pretraining_warnings") or []
        lines += [f"- Warning: the reused run differs from the command's flags: {w}." for w in warnings]
        lines += [""] if warnings else []
        lines += [
            "| phase | steps | batch | lr | seq | masked-LM loss first logged -> last | seconds | sequences/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, p in (("1", p1),) + ((("2", p2),) if not phase1_only else ()):
            lines.append(
                f"| {name} | {p['steps']} | {p['batch']} | {p['learning_rate']} | {p['max_seq_length']} | "
                f"{su.fmt(p['first_mlm_loss'], 3)} -> {su.fmt(p['final_mlm_loss'], 3)} | "
                f"{su.fmt(p['seconds'], 0)} | {su.fmt(p['sequences_per_second'], 1)} |"
            )
        lines += [
            "",
            f"Held-out masked-LM accuracy (step {held['step']}, at most {held['max_eval_samples']} held-out "
            f"samples): **{su.fmt(held['accuracy'], 4)}**; always guessing the most frequent masked token: "
            f"{su.fmt(held['baseline'], 4)}.",
            "",
        ]
        probe = pre.get("context_probe")
        if probe:
            lines += [
                f"Context probe (the final checkpoint, on the {probe['slots']} held-out [MASK]ed slots: "
                f"nothing to copy there): accuracy **{su.fmt(probe['model'], 4)}** with the context, "
                f"{su.fmt(probe['model_without_context'], 4)} with every other token of the input replaced "
                f"by [MASK] (position and segment alone); count models from the training shards: unigram "
                f"{su.fmt(probe['unigram'], 4)}, bigram (the previous token) {su.fmt(probe['bigram'], 4)}, "
                f"previous and next token {su.fmt(probe['previous_next'], 4)}. Held-out masked-LM loss "
                f"{su.fmt(probe['heldout_loss'], 3)} nats against a unigram entropy of "
                f"{su.fmt(probe['unigram_entropy'], 3)}.",
                "",
            ]
    models = [m for m in MODELS if any(m in ft["results"].get(t, {}) for t in ft["results"])]
    lines += [
        "Downstream (dev set; mean ± sample std over seeds, [min, max]):",
        "",
        "| task (metric) | majority class | " + " | ".join(models) + " |",
        "|---|---|" + "---|" * len(models),
    ]
    for task, per_model in ft["results"].items():
        cells = []
        for m in models:
            s = per_model.get(m)
            cells.append(
                "not run"
                if s is None
                else f"{s['mean']:.4f} ± {s['std']:.4f} [{s['min']:.4f}, {s['max']:.4f}] ({s['seeds']} seeds)"
            )
        metric = next((s["metric"] for s in per_model.values() if s), "")
        lines.append(f"| {task} ({metric}) | {su.fmt(ft['baselines'].get(task))} | " + " | ".join(cells) + " |")
    lines += ["", f"Rule: {su.RULE}.", ""]
    for task, v in report["verdicts"].items():
        word = "beats" if v["beats"] else "does NOT beat"
        lines.append(
            f"- {task}: pre-trained {word} random initialisation by more than the seed spread "
            f"(difference {v['difference']:+.4f}, spread {v['spread']:.4f})."
        )
    for note in report.get("notes", []):
        lines.append(f"- {note}")
    lines += [
        "",
        "Fine-tuning settings: "
        + "; ".join(f"{m}: lr {s['learning_rate']}, batch {s['batch_size']}" for m, s in ft["model_settings"].items())
        + "; "
        + "; ".join(
            f"{t}: {s['epochs']} epoch(s), {s['max_train'] or 'all'} training examples"
            for t, s in ft["task_settings"].items()
        )
        + f"; sequence {ft['max_seq_length']}"
        + (
            f"; dropout {ft['dropout']} in fine-tuning (the checkpoint's config with both dropouts changed)"
            if ft["dropout"] is not None
            else ""
        )
        + ".",
        "",
    ]
    for name, src in ft["sources"].items():
        lines.append(
            f"- {name}: `{src['source']}`{' (reused)' if src['reused'] else ''}"
            + (f"; warnings: {'; '.join(src['warnings'])}" if src["warnings"] else "")
        )
    if images:
        lines += ["", f"![pre-training loss]({images[0]})" if pre else "", "", f"![scores per seed]({images[1]})"]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The study's command line; --help shows the module's text and every default."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2], formatter_class=su.HelpFormatter
    )
    p.add_argument("--out", type=Path, default=REPO / "results" / "studies" / "pretrain", help="where the study writes")
    g = p.add_argument_group("pre-training (scripts/run_cpu_demo.sh)")
    g.add_argument(
        "--pretrain_out",
        type=Path,
        default=None,
        help="run_cpu_demo.sh's --out: reused when it holds a finished run_*/ (None: <out>/pretrain)",
    )
    g.add_argument(
        "--pretrain_run",
        type=Path,
        default=None,
        help="a finished pre-training run to fine-tune, made any way: a folder with <job>.phase1.json "
        "(and <job>.phase2.json, unless it ran phase 1 only) and checkpoints/ (run_pretraining.sh's "
        "RESULTS_DIR and CHECKPOINTS_DIR)",
    )
    g.add_argument("--config", type=Path, default=REPO / "configs" / "bert-mini.json")
    g.add_argument("--phase1_steps", type=int, default=1500)
    g.add_argument("--phase2_steps", type=int, default=30)
    g.add_argument("--dupe_factor", type=int, default=5)
    g.add_argument("--batch", type=int, default=32, help="phase 1 sequences per step and process")
    g.add_argument(
        "--processes",
        type=int,
        default=1,
        help="pre-training processes (gloo); each takes --batch sequences a step and --threads threads",
    )
    g.add_argument("--lr", default="1e-2", help="phase 1 peak learning rate (of --optimizer)")
    g.add_argument(
        "--optimizer",
        choices=("nvlamb", "adamw"),
        default="nvlamb",
        help="pre-training optimizer (the cpu preset's NVLAMB, or AdamW)",
    )
    g.add_argument(
        "--corpus",
        action="append",
        type=Path,
        help="text to pre-train on (repeatable; None: "
        "run_cpu_demo.sh's default, 25 files of ../shared/data/wikipedia-en-slice)",
    )
    g.add_argument(
        "--vocab",
        type=Path,
        default=None,
        help="an existing vocabulary for the pre-training (e.g. "
        "bert-base-uncased's; None: the one run_cpu_demo.sh learns, or the reused run's own)",
    )
    g.add_argument("--vocab_size", type=int, default=8000, help="the learned vocabulary's size (without --vocab)")
    g.add_argument(
        "--init_checkpoint",
        type=Path,
        default=None,
        help="phase 1 starts from these weights "
        "(run_cpu_demo.sh --init_checkpoint: continued pre-training; give the checkpoint's --vocab and "
        "--config)",
    )
    g.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the pre-training")
    g.add_argument(
        "--random_init_seed",
        type=int,
        default=42,
        help="seed of the random initialisation (42 is the pre-training's own: the same starting weights)",
    )
    g = p.add_argument_group("fine-tuning (bench.stability)")
    g.add_argument(
        "--no_context_probe",
        action="store_true",
        help="skip the context probe of the checkpoint (count "
        "models over the training shards: minutes of CPU), e.g. where another run of the study does it",
    )
    g.add_argument("--models", default=",".join(MODELS), help="which of pretrained,random,minilm")
    g.add_argument("--tasks", default=",".join(TASKS), help="GLUE tasks")
    g.add_argument("--seeds", default="1,2,3,4,5")
    g.add_argument("--small_lr", type=float, default=2e-4, help="learning rate of the pre-trained and random models")
    g.add_argument("--small_batch", type=int, default=32)
    g.add_argument("--minilm_lr", type=float, default=1e-4)
    g.add_argument("--minilm_batch", type=int, default=32)
    g.add_argument("--minilm_checkpoint", type=Path, default=None, help="None: the all-MiniLM-L6-v2 weights")
    g.add_argument("--mrpc_epochs", type=float, default=3.0)
    g.add_argument("--sst2_epochs", type=float, default=1.0)
    g.add_argument("--other_epochs", type=float, default=3.0, help="epochs of any other --tasks")
    g.add_argument("--sst2_max_train_examples", type=int, default=10000)
    g.add_argument("--max_train_examples", type=int, default=None, help="every task (quick runs)")
    g.add_argument("--max_eval_examples", type=int, default=None)
    g.add_argument("--max_steps", type=int, default=-1)
    g.add_argument("--max_seq_length", type=int, default=128)
    g.add_argument(
        "--finetune_dropout",
        type=float,
        default=None,
        help="fine-tune the pre-trained and random models with both dropouts at this value (BERT's "
        "0.1), through a copy of the checkpoint's config given to run_glue.py as --config_file "
        "(None: the checkpoint's own config, as studies 1-9 ran: a pre-training config with "
        "dropout 0 fine-tuned without dropout)",
    )
    g.add_argument("--glue_threads", type=int, default=1, help="threads per fine-tuning run")
    g.add_argument("--parallel", type=int, default=1, help="fine-tuning runs at a time")
    g.add_argument(
        "--glue_in_process",
        action="store_true",
        help="run each fine-tuning's run_glue.main in this "
        "process (bench.stability --launch in_process; needs --parallel 1): saves a Python and torch start "
        "per seed, most of a quick run's time; the same commands and results files",
    )
    g.add_argument("--data_root", type=Path, default=su.DATA, help="holds glue-mrpc/, glue-sst2/")
    g.add_argument("--minilm_mrpc_json", type=Path, default=None, help="reuse this stability_mrpc.json for MiniLM")
    g.add_argument("--minilm_sst2_json", type=Path, default=None, help="reuse this stability_sst-2.json for MiniLM")
    g.add_argument(
        "--stability_json",
        action="append",
        metavar="MODEL:TASK=FILE",
        help="reuse a stability JSON for any model and task (repeatable)",
    )
    return p


@dataclass(frozen=True)
class Plan:
    """The checked command line: the flags (paths absolute; run() sets args.vocab to the pre-training's own when
    --vocab is not given), the lists that --models, --tasks and --seeds name, and the command for the report."""

    args: argparse.Namespace
    models: list[str]
    tasks: list[str]
    seeds: list[int]
    command: list[str]


def parse(argv: list[str] | None = None) -> Plan:
    """The command line, checked before anything starts or is written (matplotlib too: the plots come last), its
    paths made absolute (run_cpu_demo.sh runs in the repository)."""
    args = build_parser().parse_args(argv)
    su.require_matplotlib("pretrain_study")
    args.out = args.out.resolve()
    args.pretrain_out = (args.pretrain_out or args.out / "pretrain").resolve()
    args.config = args.config.resolve()  # run_cpu_demo.sh runs in the repository
    args.vocab = args.vocab.resolve() if args.vocab else None
    args.corpus = [c.resolve() for c in args.corpus or []]
    args.init_checkpoint = args.init_checkpoint.resolve() if args.init_checkpoint else None
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    tasks = [t.strip().lower() for t in args.tasks.split(",") if t.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models or not tasks:
        raise SystemExit(f"--models: one or more of {', '.join(MODELS)} (got {args.models!r}); --tasks: at least one")
    seeds = su.parse_seeds(args.seeds)
    if args.glue_in_process and args.parallel != 1:
        raise SystemExit(
            f"--glue_in_process runs one fine-tuning at a time in this process: give --parallel 1, not {args.parallel}"
        )
    if args.vocab and not args.vocab.is_file():
        raise SystemExit(f"--vocab {args.vocab} not found")
    return Plan(
        args,
        models,
        tasks,
        seeds,
        [sys.executable, "-m", "bench.pretrain_study", *(argv if argv is not None else sys.argv[1:])],
    )


@dataclass
class Starts:
    """Steps 1-2's outcome: the pre-training (its report, run_state, whether it was reused, the command that ran it
    here), the random initialisation's checkpoint and the fine-tuning config (--finetune_dropout); None where
    --models and the flags ask for none."""

    pre: dict | None = None
    state: dict | None = None
    reused: bool | None = None
    command: list[str] | None = None
    random_ckpt: Path | None = None
    finetune_config: Path | None = None


def small_model_starts(plan: Plan) -> Starts:
    """Steps 1-2: the pre-trained run (run or reused) and its context probe, then the random initialisation and the
    fine-tuning config where asked; sets args.vocab to the run's own when --vocab is not given."""
    args, starts = plan.args, Starts()
    if "pretrained" not in plan.models and "random" not in plan.models:
        return starts
    starts.state, starts.reused, starts.command = pretrained_run(args, su.log)
    state = starts.state
    starts.pre = pretraining_report(state)
    run_vocab = state["phase1"]["params"].get("vocab_file")
    if args.vocab is None:  # the run's own: what its shards and checkpoint were made with
        if not run_vocab or not Path(run_vocab).is_file():
            raise SystemExit(
                f"pretrain_study: the pre-training in {state['run_dir']} names no vocabulary that "
                f"exists ({run_vocab}): give --vocab"
            )
        args.vocab = Path(run_vocab)
    probe_the_context(args, state, starts.pre)
    if "random" in plan.models or args.finetune_dropout is not None:  # both start from the checkpoint's config
        config = checkpoint_config(state["checkpoint"])
    if "random" in plan.models:
        starts.random_ckpt = make_random_init(config, args.vocab, args.random_init_seed, args.out / "random_init")
        su.log(f"pretrain_study: random initialisation (seed {args.random_init_seed}) -> {starts.random_ckpt}")
    if args.finetune_dropout is not None:
        starts.finetune_config = write_finetune_config(config, args.finetune_dropout, args.out)
        su.log(f"pretrain_study: fine-tuning config with dropout {args.finetune_dropout} -> {starts.finetune_config}")
    return starts


def probe_the_context(args: argparse.Namespace, state: dict, pre: dict) -> None:
    """pre["context_probe"] = context_probe() of the final checkpoint, when its training shards and held-out set
    are on disk and --no_context_probe is not given."""
    input_dir = state["phase1"]["params"].get("input_dir")
    train_dir = Path(input_dir) if input_dir else None  # where phase 1 trained
    if train_dir is None or not train_dir.is_dir():
        train_dir = Path(state["run_dir"]).parent / "hdf5_phase1"  # run_cpu_demo.sh's layout, moved
    if args.no_context_probe:
        su.log("pretrain_study: context probe not run (--no_context_probe)")
    elif train_dir.is_dir() and pre["checkpoint"] and Path(pre["heldout"]["eval_dir"]).is_dir():
        pre["context_probe"] = context_probe(
            pre["checkpoint"],
            pre["config_file"],
            args.vocab,
            str(train_dir),
            pre["heldout"]["eval_dir"],
            pre["heldout"]["max_eval_samples"],
        )
        su.log(f"pretrain_study: context probe {pre['context_probe']}")


def model_settings(plan: Plan, starts: Starts) -> tuple[dict, dict[str, dict]]:
    """(model -> the checkpoint it is fine-tuned from, None: bench.stability's MiniLM; model -> its fine-tuning
    settings as the report records them)."""
    args, pre, finetune_config = plan.args, starts.pre, starts.finetune_config
    inits = {
        "pretrained": pre["checkpoint"] if pre else None,
        "random": starts.random_ckpt,
        "minilm": args.minilm_checkpoint,
    }
    settings = {
        m: {
            "learning_rate": args.minilm_lr if m == "minilm" else args.small_lr,
            "batch_size": args.minilm_batch if m == "minilm" else args.small_batch,
            "init_checkpoint": str(inits[m]) if inits[m] else "all-MiniLM-L6-v2 (default)",
            "config_file": str(finetune_config) if finetune_config and m != "minilm" else "the checkpoint's",
        }
        for m in plan.models
    }
    return inits, settings


def fine_tune(plan: Plan, starts: Starts, given: dict[tuple[str, str], Path]) -> dict:
    """Step 3: every model on every task with bench.stability (run, or reused where its JSON is given or already
    there), and each task's majority-class score: the report's "finetuning" block."""
    args = plan.args
    inits, settings_of_model = model_settings(plan, starts)
    results: dict[str, dict] = {t: {} for t in plan.tasks}
    sources, details, baselines = {}, {t: {} for t in plan.tasks}, {}
    for task in plan.tasks:
        settings = task_settings(args, task)
        data_dir = args.data_root / GLUE_FOLDER.get(task, f"glue-{task}")
        baselines[task] = su.glue_majority_baseline(task, data_dir, args.max_eval_examples)
        for model in plan.models:
            name, small = folder_name(model, task), model != "minilm"
            argv_s = su.stability_argv(
                task,
                inits[model],
                plan.seeds,
                args.out / name,
                su.StabilitySettings(
                    epochs=settings["epochs"],
                    batch=settings_of_model[model]["batch_size"],
                    lr=settings_of_model[model]["learning_rate"],
                    seq=args.max_seq_length,
                    max_train=settings["max_train"],
                    max_eval=args.max_eval_examples,
                    max_steps=args.max_steps,
                    threads=args.glue_threads,
                    parallel=args.parallel,
                    vocab=args.vocab if small else None,
                    data_dir=data_dir,
                    config_file=starts.finetune_config if small else None,
                    launch="in_process" if args.glue_in_process else "subprocess",
                ),
            )
            summary, sources[name] = su.run_or_reuse_stability(
                name, argv_s, given.get((model, task)), stability.main, su.log
            )
            results[task][model] = su.stats_of(summary)
            details[task][model] = su.seed_details(summary)
    return {
        "seeds": plan.seeds,
        "model_settings": settings_of_model,
        "dropout": args.finetune_dropout,
        "task_settings": {t: task_settings(args, t) for t in plan.tasks},
        "max_seq_length": args.max_seq_length,
        "results": results,
        "baselines": baselines,
        "per_seed": details,
        "sources": sources,
    }


def verdicts_and_notes(tasks: list[str], finetuning: dict, pre: dict | None) -> tuple[dict, list[str]]:
    """Step 4: per task, pre-trained against random by su.RULE; and the notes: models that predict one class,
    MiniLM's lead, the held-out accuracy against its baseline."""
    verdicts, notes = {}, []
    results, baselines = finetuning["results"], finetuning["baselines"]
    for task in tasks:
        r = results[task]
        if "pretrained" in r and "random" in r:
            verdicts[task] = su.beats(r["pretrained"], r["random"])
        for model, s in r.items():
            if all(abs(x - baselines[task]) < 1e-9 for x in s["scores"]):
                notes.append(
                    f"{task}: every seed of {model} scores exactly the majority-class {s['metric']} "
                    f"{baselines[task]:.4f}: it predicts one class for every example"
                )
        if "minilm" in r and "pretrained" in r:
            notes.append(f"{task}: MiniLM - pre-trained = {r['minilm']['mean'] - r['pretrained']['mean']:+.4f}")
    if pre and pre["heldout"]["accuracy"] is not None and pre["heldout"]["baseline"] is not None:
        gain = pre["heldout"]["accuracy"] - pre["heldout"]["baseline"]
        notes.append(
            f"held-out masked-LM accuracy {pre['heldout']['accuracy']:.4f} is {gain:+.4f} from the "
            "most-frequent-token baseline"
        )
    return verdicts, notes


def write_outputs(out: Path, report: dict) -> None:
    """<out>/pretrain_study.json and .md, then the plots (pretrain_loss.png, pretrain_seeds.png)."""
    # The report first: the plots need matplotlib (requirements-test.txt), and a missing plotting library must not
    # lose an hour of fine-tuning (the runs are reused on a second call, but the JSON is the result).
    su.write_report(out, "pretrain_study", report, markdown(report))
    pre, finetuning = report["pretraining"], report["finetuning"]
    if pre:
        su.plot_pretraining(
            pre["curves"],
            pre["heldout"],
            out / "pretrain_loss.png",
            title=f"pre-training {Path(pre['config_file'] or '').name}",
        )
    su.plot_seeds(
        {t: {m: s["scores"] for m, s in per_model.items()} for t, per_model in finetuning["results"].items()},
        out / "pretrain_seeds.png",
        baselines=finetuning["baselines"],
    )


def run(plan: Plan) -> dict:
    """The study of the module's text: 1-2 the small models' checkpoints, 3 every fine-tuning, 4 the verdicts and
    the files; returns the report."""
    args = plan.args
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    given = given_jsons(args)
    starts = small_model_starts(plan)
    finetuning = fine_tune(plan, starts, given)
    verdicts, notes = verdicts_and_notes(plan.tasks, finetuning, starts.pre)
    state = starts.state
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": plan.command,
        "pretraining": starts.pre,
        "pretraining_reused": starts.reused,
        "pretraining_command": starts.command,
        "pretraining_warnings": state.get("warnings", []) if state else [],
        "pretraining_wall_seconds": state.get("wall_seconds") if state else None,
        "random_init": {"checkpoint": str(starts.random_ckpt), "seed": args.random_init_seed}
        if starts.random_ckpt
        else None,
        "finetuning": finetuning,
        "rule": su.RULE,
        "verdicts": verdicts,
        "notes": notes,
        "wall_seconds": round(time.time() - started, 1),
    }
    write_outputs(args.out, report)
    return report


def main(argv: list[str] | None = None) -> dict:
    """python -m bench.pretrain_study: parse the command line, then run the study; returns its report."""
    return run(parse(argv))


if __name__ == "__main__":
    main()
