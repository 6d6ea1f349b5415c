"""Ours against transformers, side by side: the same shards, steps, batch, learning rate and initial weights; does
our pre-training learn at least as fast per step as a plain transformers loop? (issue 27)

    .venv/bin/python -m bench.pretrain_vs_transformers --data DIR --out results/studies/vs_transformers \\
        [--config configs/bert-mini.json] [--steps 1500] [--batch 64] [--lr 2e-3] [--warmup 0.1] \\
        [--eval_every 250] [--max_eval_samples 1024] [--precision auto] [--parallel]

ours:       `run_pretraining.py --optimizer adamw --lr_schedule linear` (our model, loader, AdamW, loop), evaluated
            by validation.Validator every --eval_every steps.
reference:  `transformers.BertForPreTraining` trained by a plain loop written here: its own reader of the same HDF5
            shards (a seeded shuffle of each shard, NVIDIA's label rule: a prediction slot ends at the first 0 after
            index 0), torch.optim.AdamW (no decay on biases and LayerNorm), torch's LambdaLR with the same linear
            warm-up and decay, clip_grad_norm_(1.0), the same dropout. The loss is transformers' (its cross-entropy
            of prediction_logits at the labelled positions plus the next-sentence loss): its modules `bert`,
            `cls.predictions` and `cls.seq_relationship` are called on the labelled positions only, which is
            transformers' own loss without the [B, S, V] logits of the unlabelled positions (too slow on a CPU).
            Evaluated here by its own code on the same held-out samples: the loss over every prediction slot, and
            the accuracy on [MASK]ed slots with and without the context (every other real token but [CLS]/[SEP]
            replaced by [MASK]).
Both start from the same weights (ours at --seed, exported with checkpoint_io.save_hf_directory and loaded by
transformers' from_pretrained; the table's step 0 evaluates them both, each with its own code) and run in the same
precision (--precision auto: bf16 autocast where the CPU has it
natively, fp32 otherwise). With --parallel the two run at once, one thread each.

The claim to check: at every evaluation, our held-out loss is no worse than the reference's by more than 0.05 nats.
Report: <out>/vs_transformers.json, .md (the table) and .png (both curves). torch, transformers and the modules that
load torch are imported in the functions that train or evaluate: the results page imports this module for its table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import study_utils as su
from bench.pretrain_sweep import bf16_flags_text
from bert_recipe.io.atomic_io import atomic_write_text
from bert_recipe.training.dist_env import DistEnv, set_seed
from bert_recipe.training.precision_policy import autocast, resolve
from tokenization import load_vocab

REPO = su.REPO
TOLERANCE = 0.05  # nats: ours may be worse than the reference by at most this much at equal steps


def ours_command(args, out: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "run_pretraining.py"),
        "--input_dir",
        str(args.train_dir),
        "--eval_dir",
        str(args.eval_dir),
        "--max_eval_samples",
        str(args.max_eval_samples),
        "--eval_steps",
        str(args.eval_every),
        "--config_file",
        str(args.config),
        "--vocab_file",
        str(args.vocab),
        "--output_dir",
        str(out),
        "--do_train",
        "--max_seq_length",
        str(args.max_seq_length),
        "--max_predictions_per_seq",
        str(args.max_predictions_per_seq),
        "--train_batch_size",
        str(args.batch),
        "--max_steps",
        str(args.steps),
        "--learning_rate",
        str(args.lr),
        "--optimizer",
        "adamw",
        "--warmup_proportion",
        str(args.warmup),
        "--lr_schedule",
        "linear",
        "--seed",
        str(args.seed),
        "--precision",
        args.precision,
        "--skip_checkpoint",
        "--log_freq",
        "10",
        "--num_workers",
        "1",
        "--disable_progress_bar",
        "--json-summary",
        str(out / "log.json"),
    ]


# --------------------------------------------------------------------------------------------------------------
# The reference: transformers' model, a plain loop, its own reader and evaluation


def read_arrays(
    path: Path,
    keys=("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"),
) -> dict:
    import h5py

    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in keys}


def labels_of(positions, ids, seq_len: int):
    """[B, S] labels, -100 where nothing is predicted; a row's slots end at its first 0 after index 0 (NVIDIA)."""
    labels = np.full((len(positions), seq_len), -100, dtype=np.int64)
    for row, (pos, tok) in enumerate(zip(positions, ids)):
        for p, t in zip(pos, tok):
            if p == 0:
                break
            labels[row, p] = t
    return labels


def reference_batches(train_dir: Path, batch: int, seed: int):
    """Forever: shards in a seeded order each epoch, each shard's rows in a seeded order, batches of `batch`."""
    shards = sorted(train_dir.glob("*.hdf5"))
    rng = np.random.default_rng(seed)
    while True:
        for shard in rng.permutation(len(shards)):
            arrays = read_arrays(shards[shard])
            order = rng.permutation(len(arrays["input_ids"]))
            for start in range(0, len(order) - batch + 1, batch):
                yield {k: v[order[start : start + batch]] for k, v in arrays.items()}


def hf_losses(model, rows: dict, precision_dtype):
    """transformers' pre-training loss of a batch, its heads run on the labelled positions only."""
    import torch  # on use (see the module docstring)
    import torch.nn.functional as F

    tensors = {k: torch.from_numpy(v.astype("int64")) for k, v in rows.items()}
    labels = torch.from_numpy(labels_of(rows["masked_lm_positions"], rows["masked_lm_ids"], rows["input_ids"].shape[1]))
    with torch.autocast("cpu", dtype=precision_dtype, enabled=precision_dtype is not None):
        out = model.bert(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["input_mask"],
            token_type_ids=tensors["segment_ids"],
            return_dict=True,
        )
        picked = labels >= 0  # [B, S]
        scores = model.cls.predictions(out.last_hidden_state[picked])  # [M, V]
        relationship = model.cls.seq_relationship(out.pooler_output)  # [B, 2]
    mlm = F.cross_entropy(scores.float(), labels[picked])
    nsp = F.cross_entropy(relationship.float(), tensors["next_sentence_labels"])
    return mlm + nsp, mlm, scores, labels[picked]


def hf_evaluate(model, heldout: dict, mask_id: int, cls_id: int, sep_id: int, precision_dtype) -> dict:
    """Held-out loss over every prediction slot, and [MASK]-slot accuracy with and without the context."""
    import torch  # on use (see the module docstring)

    model.eval()
    loss_sum = slots = right = right_bare = masked = 0.0
    with torch.no_grad():
        for start in range(0, len(heldout["input_ids"]), 64):
            rows = {k: v[start : start + 64] for k, v in heldout.items()}
            _, _, scores, targets = hf_losses(model, rows, precision_dtype)
            loss_sum += float(torch.nn.functional.cross_entropy(scores.float(), targets, reduction="sum"))
            slots += len(targets)
            ids, mask = rows["input_ids"].astype(np.int64), rows["input_mask"]
            labels = labels_of(rows["masked_lm_positions"], rows["masked_lm_ids"], ids.shape[1])
            is_mask = torch.from_numpy((labels >= 0) & (ids == mask_id))[torch.from_numpy(labels >= 0)]  # [M]
            bare = {**rows, "input_ids": np.where((mask == 1) & (ids != cls_id) & (ids != sep_id), mask_id, ids)}
            _, _, bare_scores, _ = hf_losses(model, bare, precision_dtype)
            right += float((scores.argmax(-1) == targets)[is_mask].sum())
            right_bare += float((bare_scores.argmax(-1) == targets)[is_mask].sum())
            masked += float(is_mask.sum())
    model.train()
    return {
        "eval_mlm_loss": loss_sum / slots,
        "eval_mask_accuracy": right / masked,
        "eval_mask_accuracy_without_context": right_bare / masked,
        "eval_context_gain": (right - right_bare) / masked,
    }


def run_reference(args, start_dir: Path, out: Path) -> dict:
    """The plain transformers loop; returns its evaluations and throughput (also written to out/reference.json)."""
    import torch  # on use, as transformers (see the module docstring)
    from transformers import BertForPreTraining as HFBertForPreTraining

    torch.manual_seed(args.seed)
    name = resolve(args.precision, "cpu").name
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
    model = HFBertForPreTraining.from_pretrained(str(start_dir), attn_implementation="sdpa").train()
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.999),
        eps=1e-6,
    )
    warm = args.warmup * args.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: k / warm if k < warm else max(0.0, (args.steps - k) / (args.steps - warm))
    )
    vocab = load_vocab(str(args.vocab))
    heldout = su.read_shards(args.eval_dir, args.max_eval_samples)
    evals, losses = [], []
    batches = reference_batches(args.train_dir, args.batch, args.seed)
    started = time.time()
    for step in range(1, args.steps + 1):
        loss, mlm, _, _ = hf_losses(model, next(batches), dtype)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            losses.append([step, float(mlm)])
        if step % args.eval_every == 0 or step == args.steps:
            result = hf_evaluate(model, heldout, vocab["[MASK]"], vocab["[CLS]"], vocab["[SEP]"], dtype)
            evals.append({"step": step, **result})
            print(
                f"reference: step {step}: held-out loss {result['eval_mlm_loss']:.3f}, context gain "
                f"{100 * result['eval_context_gain']:+.1f} points",
                flush=True,
            )
    seconds = time.time() - started
    result = {
        "evals": evals,
        "losses": losses,
        "seconds": seconds,
        "precision": name,
        "sequences_per_second": args.steps * args.batch / seconds,
    }
    atomic_write_text(out / "reference.json", json.dumps(result, indent=1))
    return result


# --------------------------------------------------------------------------------------------------------------


def initial_weights(args, out: Path) -> Path:
    """Our BertForPreTraining at --seed (what run_pretraining.py starts from), as a transformers directory."""
    from bert_recipe.io.checkpoint_io import save_hf_directory
    from modeling import BertConfig, BertForPreTraining

    set_seed(args.seed)
    model = BertForPreTraining(BertConfig.from_json_file(args.config))
    save_hf_directory(model, out / "initial_hf", args.vocab)
    return out / "initial_hf"


def step_zero(args, start_dir: Path) -> dict:
    """Both evaluations of the shared initial weights (before any step): ours by validation.Validator on our
    model, the reference's by its own code on transformers' model. Equal up to float rounding when the two models
    compute the same function."""
    import torch  # on use, as transformers and the torch-backed modules (see the module docstring)
    from transformers import BertForPreTraining as HFBertForPreTraining

    from bert_recipe.io.checkpoint_io import from_pretrained
    from bert_recipe.pretraining.validation import SpecialIds, Validator
    from modeling import BertForPreTraining

    name = resolve(args.precision, "cpu").name
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
    vocab = load_vocab(str(args.vocab))
    heldout = su.read_shards(args.eval_dir, args.max_eval_samples)
    ours = from_pretrained(BertForPreTraining, start_dir, log=None).eval()
    validator = Validator(
        heldout,
        SpecialIds.from_vocab(vocab),
        64,
        lambda: autocast(name, torch.device("cpu")) if dtype else contextlib.nullcontext(),
        DistEnv(),
    )
    reference = HFBertForPreTraining.from_pretrained(str(start_dir), attn_implementation="sdpa")
    return {
        "ours": validator(ours),
        "reference": hf_evaluate(reference, heldout, vocab["[MASK]"], vocab["[CLS]"], vocab["[SEP]"], dtype),
    }


def ours_result(out: Path) -> dict:
    run = su.run_log(out / "log.json")
    final = run["final"] or {}
    return {
        "evals": run["evals"],
        "losses": run["losses"],
        "seconds": final.get("e2e_train_time"),
        "sequences_per_second": final.get("training_sequences_per_second"),
        "precision": run["params"].get("precision"),
    }


def compare(ours: dict, reference: dict, zero: dict | None = None) -> list[dict]:
    by_step = {e["step"]: e for e in reference["evals"]}
    rows = []
    if zero:
        ours = {**ours, "evals": [{"step": 0, **zero["ours"]}, *ours["evals"]]}
        by_step[0] = {"step": 0, **zero["reference"]}
    for e in ours["evals"]:
        ref = by_step.get(e["step"])
        if ref is None:
            continue
        rows.append(
            {
                "step": e["step"],
                "ours_loss": e["eval_mlm_loss"],
                "reference_loss": ref["eval_mlm_loss"],
                "difference": e["eval_mlm_loss"] - ref["eval_mlm_loss"],
                "ours_context_gain": e["eval_context_gain"],
                "reference_context_gain": ref["eval_context_gain"],
                "unigram_entropy": e.get(
                    "eval_unigram_entropy", zero["ours"]["eval_unigram_entropy"] if zero else None
                ),
            }
        )
    return rows


def markdown(report: dict) -> str:
    lines = [
        f"# Ours against transformers, same shards, steps, batch and initial weights ({report['date']})",
        "",
        f"{Path(report['config']).name}, {report['steps']} steps x batch {report['batch']}, AdamW lr "
        f"{report['lr']:g}, linear warm-up {report['warmup']} then linear decay, precision "
        f"{report['ours']['precision']} (both); held-out: {report['max_eval_samples']} sequences of "
        f"{report['eval_dir']}. Machine: {report['cpu']} ({bf16_flags_text(report)}).",
        "",
        f"Command: `{report['command']}`",
        "",
        "| step | ours: held-out loss | transformers: held-out loss | ours - transformers | ours: context gain | "
        "transformers: context gain |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['step']} | {r['ours_loss']:.3f} | {r['reference_loss']:.3f} | {r['difference']:+.3f} | "
            f"{100 * r['ours_context_gain']:+.1f} | {100 * r['reference_context_gain']:+.1f} |"
        )
    verdict = "holds" if report["holds"] else "does NOT hold"
    lines += [
        "",
        f"Unigram entropy of the held-out targets: {report['rows'][-1]['unigram_entropy']:.3f} nats. "
        f"The claim (ours no worse than transformers by more than {TOLERANCE} nats at every evaluation) "
        f"**{verdict}** (largest difference {report['worst']:+.3f}). Throughput: ours "
        f"{report['ours']['sequences_per_second'] or 0:.1f} sequences/s, transformers "
        f"{report['reference']['sequences_per_second']:.1f}.",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path:
    plt = su._pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, run in (("ours", report["ours"]), ("transformers", report["reference"])):
        left.plot([e["step"] for e in run["evals"]], [e["eval_mlm_loss"] for e in run["evals"]], "o-", label=name)
        right.plot(
            [e["step"] for e in run["evals"]], [100 * e["eval_context_gain"] for e in run["evals"]], "o-", label=name
        )
    if report["rows"]:
        left.axhline(report["rows"][-1]["unigram_entropy"], color="tab:gray", linestyle="--", label="unigram entropy")
    left.set_ylabel("held-out masked-LM loss (nats)")
    right.set_ylabel("context gain (points)")
    for ax in (left, right):
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=8)
    fig.suptitle("ours vs transformers: same shards, steps, batch, initial weights")
    fig.tight_layout()
    return su.save_figure(plt, fig, path)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=su.HelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a folder with training/ and test/ HDF5 shards")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", type=Path, default=REPO / "configs" / "bert-mini.json")
    p.add_argument("--vocab", type=Path, default=su.VOCAB)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--eval_every", type=int, default=250)
    p.add_argument("--max_eval_samples", type=int, default=1024)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--parallel", action="store_true", help="run both at once, one thread each")
    args = p.parse_args(argv)
    su.require_matplotlib("pretrain_vs_transformers")
    args.train_dir, args.eval_dir = args.data / "training", args.data / "test"
    if not (args.train_dir.is_dir() and args.eval_dir.is_dir()):
        raise SystemExit(f"--data {args.data} needs training/ and test/ folders of HDF5 shards")
    args.out.mkdir(parents=True, exist_ok=True)
    start_dir = initial_weights(args, args.out)
    zero = step_zero(args, start_dir)
    threads = "1" if args.parallel else str(os.cpu_count() or 1)
    ours_out = args.out / "ours"
    (ours_out / "log.json").unlink(missing_ok=True)
    ours_out.mkdir(parents=True, exist_ok=True)
    with open(ours_out / "output.txt", "w") as console:
        proc = subprocess.Popen(
            ours_command(args, ours_out),
            cwd=REPO,
            stdout=console,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": threads},
        )
        if not args.parallel:
            proc.wait()
        import torch  # on use (see the module docstring)

        torch.set_num_threads(int(threads))
        reference = run_reference(args, start_dir, args.out)
        if proc.wait():
            raise SystemExit(f"pretrain_vs_transformers: run_pretraining.py failed; see {ours_out / 'output.txt'}")
    ours = ours_result(ours_out)
    rows = compare(ours, reference, zero)
    cpu, flags = su.cpu_description()
    report = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "bf16_flags": flags,
        "config": str(args.config),
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "warmup": args.warmup,
        "max_eval_samples": args.max_eval_samples,
        "eval_dir": str(args.eval_dir),
        "command": "python -m bench.pretrain_vs_transformers " + " ".join(argv if argv is not None else sys.argv[1:]),
        "ours": ours,
        "reference": reference,
        "rows": rows,
        "worst": max((r["difference"] for r in rows), default=math.nan),
        "holds": bool(rows) and all(r["difference"] <= TOLERANCE for r in rows),
    }
    report["plot"] = str(plot(report, args.out / "vs_transformers.png"))
    su.write_report(args.out, "vs_transformers", report, markdown(report))
    return report


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
