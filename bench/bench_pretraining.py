"""Pre-training throughput: our BertForPreTraining + NVLAMB step against Hugging Face transformers' BertForPreTraining.

Run from the repository root (5-10 minutes on 2 idle CPU cores before the ours+packed row, which adds a fourth
model to every case; a loaded machine stretches it):

    .venv/bin/python -m bench.bench_pretraining [--compile] [--profile] [--no_unpad] [--no_packed] \\
        [--out results/bench_pretraining.json]
    .venv/bin/python -m bench.bench_pretraining --configs base --precisions fp32   # BERT-base: padded, unpadded, packed

What is timed: one optimizer step = forward (masked-LM + next-sentence loss) + backward + NVLAMB step + zero_grad,
wall clock, per model, in train mode (dropout 0.1 on, as in pre-training). The models get
  * the same config (configs/bert-mini.json: 4 layers, hidden 256; configs/bert-base.json), sequence length 128;
  * the same weights: Hugging Face's model is built first and its state dict is loaded into ours with
    checkpoint_io.load_checkpoint_state; the step-0 loss of each (eval mode, same batch) is printed and must agree;
  * the same batches of real data: WikiText-2 (../shared/data) made into an HDF5 shard by the recipe's own pipeline
    (scripts/text_to_documents.py, then create_pretraining_data.py with the real uncased vocabulary: sequence
    pairs of real lengths zero-padded to 128, 15% masked, at most 20 predictions); labels -1 (ours, NVIDIA's
    convention) / -100 (Hugging Face's) where nothing is predicted;
  * the same optimizer: our NVLAMB with param_groups_for_bert (lr 1e-3, weight decay 0.01, clip 1.0);
  * the same precision: fp32, or torch.autocast(cpu, bfloat16).
Runs alternate in one process (the order rotates every step); warm-up steps are left out; the median step time
gives sequences per second, and the ratio is the median of the per-step ratios (transformers' step time over ours
in the same round: the models of a round see the same machine load). "model only" leaves NVLAMB's time out of both
(the same optimizer code, so it only dilutes the comparison of the models). The load average is recorded.

Threads: one by default. On a 2-core machine shared with other jobs, torch's 2 OpenMP threads stall at every
parallel op whenever the OS deschedules one of them: measured here, a mini step took 2.7-5.3 s with 2 threads
(bimodal, NVLAMB alone 0.05 or 1.05 s) and a steady 1.8 s with one. One thread measures the models' work; on an
idle machine pass --threads 0 for torch's default.

"ours" is modeling.py with unpad "never" (modeling.set_execution: every op on the padded [B, S, H] batch);
"ours+unpad" is the same model and weights with unpad "always", measured in the same alternation (--no_unpad
leaves it out): the encoder's embeddings, Linear layers, LayerNorm, GELU and dropout run on the real tokens only,
[T, H] with T = real tokens, and attention goes through bert_attention.varlen_attention (on CPU: padded around
one SDPA call). Its step-0 loss equals ours to rounding. run_pretraining.py gets the unpadded path by default
(unpad "auto").

"ours+packed" (--no_packed leaves it out) is the same model and weights again, unpadded, on packed rows: the first
--pack_pool sequences of the shard packed first-fit-decreasing, at most --pack_k a row, by pretraining_format's
own packer (what `--pack_sequences` writes), the rows shuffled, --batch rows a step. Each packed sequence attends
only to itself (its own cu_seqlens entry), positions restart, NSP at its own [CLS]; the labels are the same sparse
masked_lm_labels as the other rows. A packed step holds more sequences than the others, so this row is compared in
sequences/s and real (non-padding) tokens/s: the ratios are medians over rounds of (ours+packed per second) /
(transformers per second) in the same round. Its step-0 check: the packed loss of the first packed batch against
ours on the same sequences unpadded (they must agree).

--compile adds torch.compile rows (both models compiled; mini config, fp32 unless --compile_precisions: one compile
takes 1-6 minutes on 2 cores). --profile prints torch.profiler's top
operators of each model (mini, fp32). Writes JSON (default results/bench_pretraining.json) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

import create_pretraining_data
import modeling
from bench import study_utils as su
from bert_recipe.io import checkpoint_io
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.checkpoint_io import CheckpointError
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.pretraining import shard_format
from bert_recipe.pretraining.data_stream import mlm_labels
from bert_recipe.training.precision_policy import autocast, cpu_model
from optimization import NVLAMB, param_groups_for_bert
from scripts.text_to_documents import write_documents

REPO, SHARED = su.REPO, su.DATA
CPU = torch.device("cpu")
GOALS = {("mini", "fp32"): 2.5, ("mini", "bf16"): 2.0, ("base", "fp32"): 1.3, ("base", "bf16"): 1.3}


# --------------------------------------------------------------------------------------------------------------
# Real data: a WikiText-2 shard from create_pretraining_data.py


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, S] int64, masked, zero-padded
    token_type_ids: torch.Tensor  # [B, S]
    attention_mask: torch.Tensor  # [B, S] 1 = real token
    labels_ours: torch.Tensor  # [B, S] original id at masked positions, -1 elsewhere
    labels_hf: torch.Tensor  # [B, S] the same with -100
    next_sentence_labels: torch.Tensor  # [B] 1 = B is a random next


def make_shard(data_dir: Path, vocab_file: Path, workdir: Path) -> Path:
    """WikiText-2 valid + test -> sentences -> one HDF5 shard (seq 128, 20 predictions, dupe factor 1)."""
    text, shard = workdir / "wikitext2_sentences.txt", workdir / "wikitext2_seq128.hdf5"
    write_documents([data_dir / "valid.txt", data_dir / "test.txt"], text, sentences=True)
    with contextlib.redirect_stdout(sys.stderr):
        create_pretraining_data.main(
            [
                "--input_file",
                str(text),
                "--output_file",
                str(shard),
                "--vocab_file",
                str(vocab_file),
                "--do_lower_case",
                "--max_seq_length",
                "128",
                "--max_predictions_per_seq",
                "20",
                "--masked_lm_prob",
                "0.15",
                "--dupe_factor",
                "1",
                "--random_seed",
                "12345",
                "--num_workers",
                "1",
                "--no_progress",
            ]
        )
    return shard


def load_batches(shard: Path, n_batches: int, batch_size: int, start: int = 0) -> list[Batch]:
    """Consecutive batches from the shard; labels from masked_lm_positions / masked_lm_ids (NVIDIA's layout:
    unused slots are 0, and position 0 is [CLS], never masked)."""
    rows = slice(start, start + n_batches * batch_size)
    with h5py.File(shard, "r") as f:
        arrays = {
            k: f[k][rows]
            for k in (
                "input_ids",
                "segment_ids",
                "input_mask",
                "masked_lm_positions",
                "masked_lm_ids",
                "next_sentence_labels",
            )
        }
    if len(arrays["input_ids"]) < n_batches * batch_size:
        raise InputError(f"{shard} holds too few sequences for {n_batches} x {batch_size}: lower --batches")
    labels = torch.from_numpy(
        mlm_labels(arrays["masked_lm_positions"], arrays["masked_lm_ids"], arrays["input_ids"].shape[1])
    )
    arrays = {k: torch.from_numpy(v).long() for k, v in arrays.items()}
    batches = []
    for i in range(n_batches):
        part = slice(i * batch_size, (i + 1) * batch_size)
        lab = labels[part]
        batches.append(
            Batch(
                arrays["input_ids"][part],
                arrays["segment_ids"][part],
                arrays["input_mask"][part],
                lab,
                lab.masked_fill(lab < 0, -100),
                arrays["next_sentence_labels"][part],
            )
        )
    return batches


# --------------------------------------------------------------------------------------------------------------
# The models, the same weights, one training step each.


def build_pair(config_path: Path, seed: int):
    """(hf_model, our_model) with identical weights: HF initialises, ours loads HF's state dict."""
    from transformers.models.bert.modeling_bert import BertConfig as HFConfig
    from transformers.models.bert.modeling_bert import BertForPreTraining as HFBertForPreTraining

    config = modeling.BertConfig.from_json_file(config_path)
    torch.manual_seed(seed)
    hf = HFBertForPreTraining(HFConfig(**checkpoint_io.hf_config(config, "BertForPreTraining")))
    ours = modeling.BertForPreTraining(config)
    report = checkpoint_io.load_checkpoint_state(ours, hf.state_dict(), source="transformers BertForPreTraining")
    if report.lines():  # a LoadReport is always truthy: its lines are empty when every tensor found its place
        raise CheckpointError(f"the weights did not map one to one: {report.lines()}")
    return hf, ours, hf.config._attn_implementation


def clone_ours(model, unpad: str):
    """A deep copy with its own parameters (the MLM decoder re-tied to the copy's word embeddings), whose unpad
    setting is `unpad`."""
    twin = copy.deepcopy(model)
    twin.cls.predictions.decoder.weight = twin.bert.embeddings.word_embeddings.weight
    return modeling.set_execution(twin, unpad=unpad)


def hf_loss(model, batch: Batch) -> torch.Tensor:
    return model(
        input_ids=batch.input_ids,
        token_type_ids=batch.token_type_ids,
        attention_mask=batch.attention_mask,
        labels=batch.labels_hf,
        next_sentence_label=batch.next_sentence_labels,
    ).loss


def our_loss(model, batch: Batch) -> torch.Tensor:
    return model(
        batch.input_ids, batch.token_type_ids, batch.attention_mask, batch.labels_ours, batch.next_sentence_labels
    ).loss


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [R, S] several sequences a row, back to back, zero-padded after the last
    token_type_ids: torch.Tensor  # [R, S] each sequence's own
    attention_mask: torch.Tensor  # [R, S] 1 = a real token of any sequence
    labels_ours: torch.Tensor  # [R, S] original id at masked positions, -1 elsewhere
    next_sentence_labels: torch.Tensor  # [R, K] -1 in unused slots
    next_sentence_positions: torch.Tensor  # [R, K] each sequence's [CLS] column (a later slot at 0: unused)
    sequences: int  # real sequences in the batch
    members: list[int]  # their rows in the shard (for the step-0 check)


def load_packed_batches(
    shard: Path, n_batches: int, rows: int, pool: int, k: int, seed: int
) -> tuple[list[PackedBatch], Batch]:
    """The first `pool` sequences of the shard packed (shard_format.pack_sequences: first-fit-decreasing,
    at most k a row), the rows shuffled (FFD opens rows longest first), `rows` rows a batch; and the first packed
    batch's sequences as a plain unpacked Batch (the step-0 check)."""
    with h5py.File(shard, "r") as f:
        arrays = {key: f[key][:pool] for key in shard_format.SHARD_KEYS}
    n, seq = arrays["input_ids"].shape
    width = shard_format.packed_predictions(seq, arrays["masked_lm_positions"].shape[1], 0.15, k)
    packed = shard_format.pack_sequences(arrays, k, width)
    row, _, _ = shard_format.first_fit_decreasing(arrays["input_mask"].sum(1), seq, k)
    order = np.random.default_rng(seed).permutation(len(packed["input_ids"]))  # [R_total]
    if len(order) < n_batches * rows:
        raise InputError(
            f"{pool} sequences pack into {len(order)} rows, fewer than {n_batches} x {rows}: raise --pack_pool"
        )
    batches = []
    for i in range(n_batches):
        take = order[i * rows : (i + 1) * rows]  # [rows] packed rows of this batch
        labels = mlm_labels(packed["masked_lm_positions"][take], packed["masked_lm_ids"][take], seq)
        t = {key: torch.from_numpy(packed[key][take]).long() for key in packed}
        batches.append(
            PackedBatch(
                t["input_ids"],
                t["segment_ids"],
                t["input_mask"],
                torch.from_numpy(labels),
                t["next_sentence_labels"],
                t["next_sentence_positions"],
                int((t["next_sentence_labels"] >= 0).sum()),
                np.flatnonzero(np.isin(row, take)).tolist(),
            )
        )
    first = batches[0].members
    plain = {key: torch.from_numpy(value[first]).long() for key, value in arrays.items()}
    labels = mlm_labels(arrays["masked_lm_positions"][first], arrays["masked_lm_ids"][first], seq)
    labels = torch.from_numpy(labels)
    unpacked = Batch(
        plain["input_ids"],
        plain["segment_ids"],
        plain["input_mask"],
        labels,
        labels.masked_fill(labels < 0, -100),
        plain["next_sentence_labels"],
    )
    return batches, unpacked


def packed_loss(model, batch: PackedBatch) -> torch.Tensor:
    return model(
        batch.input_ids,
        batch.token_type_ids,
        batch.attention_mask,
        batch.labels_ours,
        batch.next_sentence_labels,
        next_sentence_positions=batch.next_sentence_positions,
    ).loss


def sequences_in(batch) -> int:
    return batch.sequences if isinstance(batch, PackedBatch) else batch.input_ids.shape[0]


def real_tokens_in(batch) -> int:
    return int(batch.attention_mask.sum())


LOSS_FNS = {
    "hf": hf_loss,
    "ours": our_loss,
    "ours_unpad": our_loss,  # ours_unpad: the model's unpad setting
    "ours_packed": packed_loss,
}


def train_step(model, loss_fn, optimizer, batch: Batch, precision: str) -> tuple[float, float]:
    """One optimizer step; returns (loss, seconds spent in optimizer.step + zero_grad)."""
    with autocast(precision, CPU):
        loss = loss_fn(model, batch)
    loss.backward()
    start = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), time.perf_counter() - start


def step_zero_loss(model, loss_fn, batch: Batch, precision: str) -> float:
    """The loss on a batch in eval mode (no dropout), before any update."""
    model.eval()
    with torch.no_grad(), autocast(precision, CPU):
        loss = loss_fn(model, batch).item()
    model.train()
    return loss


def make_optimizer(model):
    return NVLAMB(param_groups_for_bert(model, 0.01), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)


@dataclass(frozen=True)
class Case:
    """One row of the table: the model config (its name and file), the precision, the timed and warm-up steps per
    model, torch.compile or not, the ours+unpad row or not, and the seed of the shared initial weights."""

    name: str
    config_path: Path
    precision: str
    steps: int
    warmup: int
    compile_models: bool
    unpad: bool
    seed: int

    @property
    def tag(self) -> str:
        """The case's prefix on its printed lines, e.g. [mini fp32 compiled]."""
        return f"[{self.name} {self.precision}{' compiled' if self.compile_models else ''}]"


@dataclass
class Timed:
    """Per model key, what the alternating steps measured: every timed step's seconds, the optimizer's share of
    them, the (sequences, real tokens) it trained on; the first step's seconds and the last step's loss."""

    times: dict[str, list[float]]
    opt_times: dict[str, list[float]]
    work: dict[str, list[tuple[int, int]]]
    first_step: dict[str, float]
    last_loss: dict[str, float]


def case_models(case: Case, packed: tuple[list[PackedBatch], Batch] | None) -> tuple[dict, str]:
    """The models of one case with the same weights (hf, ours padded, and as asked ours+unpad and ours+packed),
    and transformers' attention implementation."""
    hf, ours, attn = build_pair(case.config_path, case.seed)
    modeling.set_execution(ours, unpad="never")  # the padded row
    models = {"hf": hf, "ours": ours}
    if case.unpad:
        models["ours_unpad"] = clone_ours(ours, "always")
    if packed is not None:
        models["ours_packed"] = clone_ours(ours, "always")
    return models, attn


def step_zero_losses(
    case: Case, models: dict, batches_of: dict[str, list], packed: tuple[list[PackedBatch], Batch] | None, attn: str
) -> dict[str, float]:
    """Every model's loss on its first batch before any update (eval mode), printed: ours and transformers' must
    agree; with `packed`, also ours on the first packed batch's sequences unpacked, which the packed loss must equal."""
    loss0 = {
        key: step_zero_loss(model, LOSS_FNS[key], batches_of[key][0], case.precision) for key, model in models.items()
    }
    print(
        f"{case.tag} step-0 loss: "
        + "  ".join(f"{k} {v:.6f}" for k, v in loss0.items() if k != "ours_packed")
        + f"  (|ours - transformers| {abs(loss0['hf'] - loss0['ours']):.2e}; transformers attention: {attn})",
        flush=True,
    )
    if packed is not None:
        loss0["packed_check_unpacked"] = step_zero_loss(models["ours"], our_loss, packed[1], case.precision)
        print(
            f"{case.tag} step-0 loss of the first packed batch: packed {loss0['ours_packed']:.6f}, the same "
            f"{packed[0][0].sequences} sequences unpacked {loss0['packed_check_unpacked']:.6f}",
            flush=True,
        )
    return loss0


def time_models(case: Case, models: dict, batches_of: dict[str, list]) -> Timed:
    """Warm-up then timed training steps, every model once a round with its own NVLAMB (compiled first with
    --compile), who goes first rotating every round."""
    runners = {}
    for key, model in models.items():
        optimizer = make_optimizer(model)
        runners[key] = (torch.compile(model) if case.compile_models else model, optimizer)
    keys = list(runners)
    timed = Timed({k: [] for k in keys}, {k: [] for k in keys}, {k: [] for k in keys}, {}, {})
    for i in range(case.warmup + case.steps):
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:  # rotate who goes first
            model, optimizer = runners[key]
            batch = batches_of[key][i % len(batches_of[key])]
            start = time.perf_counter()
            timed.last_loss[key], opt_s = train_step(model, LOSS_FNS[key], optimizer, batch, case.precision)
            elapsed = time.perf_counter() - start
            if i == 0:
                timed.first_step[key] = elapsed
            if i >= case.warmup:
                timed.times[key].append(elapsed)
                timed.opt_times[key].append(opt_s)
                timed.work[key].append((sequences_in(batch), real_tokens_in(batch)))  # (sequences, real tokens)
    return timed


def add_ratios(row: dict, timed: Timed, packed: tuple[list[PackedBatch], Batch] | None) -> None:
    """row's ratios to transformers: ours and ours+unpad per step (all of it, and the model alone), ours+packed
    per sequence and per real token, with the packed rows' shape."""
    times, opt_times, work = timed.times, timed.opt_times, timed.work
    # Ratios from pairs: the models of one iteration run back to back, so they see the same machine load; the median
    # of the per-iteration ratios is far steadier on a shared machine than the ratio of the medians.
    for key, label in (("ours", "ratio"), ("ours_unpad", "ratio_unpad")):
        if key in times:
            row[label] = statistics.median(h / o for h, o in zip(times["hf"], times[key]))
            row[label + "_model_only"] = statistics.median(  # forward + backward only, NVLAMB left out
                (h - ho) / (o - oo) for h, ho, o, oo in zip(times["hf"], opt_times["hf"], times[key], opt_times[key])
            )
    if "ours_packed" in times:  # more sequences a step than transformers': compare rates, round by round
        for unit, label in ((0, "ratio_packed"), (1, "ratio_packed_real_tokens")):
            row[label] = statistics.median(
                (p[unit] / tp) / (h[unit] / th)
                for p, tp, h, th in zip(work["ours_packed"], times["ours_packed"], work["hf"], times["hf"])
            )
        row["packed_rows_per_step"] = packed[0][0].input_ids.shape[0]
        row["packed_sequences_per_row"] = (
            statistics.mean(s for s, _ in work["ours_packed"]) / row["packed_rows_per_step"]
        )
        row["packed_real_token_fraction"] = float(torch.stack([b.attention_mask for b in packed[0]]).float().mean())


def run_case(case: Case, batches: list[Batch], packed: tuple[list[PackedBatch], Batch] | None = None) -> dict:
    """Alternating timed steps of every model; returns one result row. `packed`: the packed batches and the first
    one's sequences unpacked (adds the ours+packed row)."""
    models, attn = case_models(case, packed)
    batches_of = {key: packed[0] if key == "ours_packed" else batches for key in models}
    loss0 = step_zero_losses(case, models, batches_of, packed, attn)
    timed = time_models(case, models, batches_of)
    keys, times = list(models), timed.times
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {
        "config": case.name,
        "precision": case.precision,
        "compile": case.compile_models,
        "batch_size": batches[0].input_ids.shape[0],
        "seq_len": batches[0].input_ids.shape[1],
        "timed_steps": case.steps,
        "warmup_steps": case.warmup,
        "real_token_fraction": float(torch.stack([b.attention_mask for b in batches]).float().mean()),
        "hf_attn_implementation": attn,
        "goal": GOALS.get((case.name, case.precision)),
        "loss0_abs_diff": abs(loss0["hf"] - loss0["ours"]),
        "first_step_s": timed.first_step,
    }
    for key in keys:
        row[f"{key}_seq_per_s"] = statistics.median(s / t for (s, _), t in zip(timed.work[key], times[key]))
        row[f"{key}_real_tokens_per_s"] = statistics.median(n / t for (_, n), t in zip(timed.work[key], times[key]))
        row[f"{key}_median_step_s"] = med[key]
        row[f"{key}_median_optimizer_s"] = statistics.median(timed.opt_times[key])
        row[f"{key}_step_times_s"] = times[key]
        row[f"loss0_{key}"] = loss0[key]
        row[f"last_loss_{key}"] = timed.last_loss[key]
    add_ratios(row, timed, packed)
    if "ours_packed" in times:
        row["loss0_packed_check_unpacked"] = loss0["packed_check_unpacked"]
    print(
        f"{case.tag} "
        + ", ".join(
            f"{k} {row[f'{k}_seq_per_s']:.2f} seq/s (step {med[k]:.2f} s, NVLAMB "
            f"{row[f'{k}_median_optimizer_s']:.2f} s)"
            for k in keys
        )
        + f"; ratio {row['ratio']:.2f}x (model only {row['ratio_model_only']:.2f}x)"
        + (f", unpad {row['ratio_unpad']:.2f}x" if case.unpad else "")
        + (
            f", packed {row['ratio_packed']:.2f}x sequences/s, {row['ratio_packed_real_tokens']:.2f}x real tokens/s"
            if packed is not None
            else ""
        ),
        flush=True,
    )
    return row


def profile_case(config_path: Path, batches: list[Batch], seed: int, row_limit: int = 12) -> dict:
    """torch.profiler's top operators (self CPU time) over 2 training steps of each model, fp32."""
    from torch.profiler import ProfilerActivity, profile

    hf, ours, _ = build_pair(config_path, seed)
    modeling.set_execution(ours, unpad="never")  # the padded model, as in the "ours" rows
    out = {}
    for key, model in (("hf", hf), ("ours", ours)):
        optimizer = make_optimizer(model)
        train_step(model, LOSS_FNS[key], optimizer, batches[0], "fp32")  # first-touch allocations out of the profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(2):
                train_step(model, LOSS_FNS[key], optimizer, batches[i % len(batches)], "fp32")
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        out[key] = [
            {
                "op": e.key,
                "self_cpu_ms": e.self_cpu_time_total / 1e3 / 2,
                "share": e.self_cpu_time_total / total,
                "calls_per_step": e.count / 2,
            }
            for e in events[:row_limit]
        ]
        print(f"\nprofile ({key}, {config_path.stem} fp32, per step): total {total / 2e3:.0f} ms")
        for e in out[key]:
            print(f"  {e['op']:<45} {e['self_cpu_ms']:9.1f} ms  {100 * e['share']:5.1f}%  x{e['calls_per_step']:.0f}")
    return out


# --------------------------------------------------------------------------------------------------------------
# Report


def table(rows: list[dict]) -> str:
    lines = [
        "| config | precision | compile | batch | ours seq/s | transformers seq/s | ratio | goal | "
        "ratio, model only | ours+unpad seq/s (ratio) | ours+packed seq/s (ratio; real tokens/s ratio) | "
        "step-0 loss ours / transformers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goal = f">= {r['goal']}x" if r["goal"] and not r["compile"] else "-"
        met = "" if goal == "-" else (" (met)" if r["ratio"] >= r["goal"] else " (missed)")
        unpad = f"{r['ours_unpad_seq_per_s']:.2f} ({r['ratio_unpad']:.2f}x)" if "ratio_unpad" in r else "-"
        packed = (
            f"{r['ours_packed_seq_per_s']:.2f} ({r['ratio_packed']:.2f}x; {r['ratio_packed_real_tokens']:.2f}x)"
            if "ratio_packed" in r
            else "-"
        )
        lines.append(
            f"| {r['config']} | {r['precision']} | {'yes' if r['compile'] else 'no'} | {r['batch_size']} | "
            f"{r['ours_seq_per_s']:.2f} | {r['hf_seq_per_s']:.2f} | {r['ratio']:.2f}x{met} | {goal} | "
            f"{r['ratio_model_only']:.2f}x | {unpad} | {packed} | {r['loss0_ours']:.5f} / "
            f"{r['loss0_hf']:.5f} |"
        )
    return "\n".join(lines)


def machine_info() -> dict:
    import transformers  # slow to import: only where the peer is built and the report written

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="mini,base", help="comma-separated: mini, base (default: both)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (default: both)")
    p.add_argument("--batch_mini", type=int, default=32, help="sequences per step, mini config")
    p.add_argument("--batch_base", type=int, default=8, help="sequences per step, BERT-base")
    p.add_argument("--steps", type=int, default=5, help="timed steps per model and case")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed steps per model and case (the first allocates the optimizer state)",
    )
    p.add_argument(
        "--no_unpad",
        "--no_proto",
        dest="no_unpad",
        action="store_true",
        help="leave out the ours+unpad row (modeling.py with unpad always)",
    )
    p.add_argument(
        "--no_packed", action="store_true", help="leave out the ours+packed row (unpadded modeling.py on packed rows)"
    )
    p.add_argument("--pack_k", type=int, default=3, help="sequences a packed row at most (MLPerf: 3)")
    p.add_argument("--pack_pool", type=int, default=2048, help="first sequences of the shard that are packed")
    p.add_argument("--compile", action="store_true", help="add torch.compile rows (mini config)")
    p.add_argument("--compile_precisions", default="fp32", help="precisions of the --compile rows")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top operators (mini, fp32)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1, see the module docstring; 0: torch's default)"
    )
    p.add_argument("--data_dir", default=str(SHARED / "wikitext-2"), help="WikiText-2 folder")
    p.add_argument("--vocab_file", default=str(SHARED / "bert-vocab" / "bert-base-uncased-vocab.txt"))
    p.add_argument("--out", default=str(REPO / "results" / "bench_pretraining.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Bad input or a failed step: one line on stderr ("bench_pretraining: error: ..."), exit status 1."""
    with script_errors("bench_pretraining", argv):
        return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    data_dir, vocab = Path(args.data_dir), Path(args.vocab_file)
    if not (data_dir / "valid.txt").is_file() or not vocab.is_file():
        raise SystemExit(
            f"bench_pretraining: need {data_dir}/valid.txt and {vocab} (../shared/data): "
            f"pass --data_dir and --vocab_file"
        )
    configs = {"mini": REPO / "configs" / "bert-mini.json", "base": REPO / "configs" / "bert-base.json"}
    names = [c for c in args.configs.split(",") if c]
    precisions = [p for p in args.precisions.split(",") if p]
    compile_precisions = [p for p in args.compile_precisions.split(",") if p] if args.compile else []
    bad = [c for c in names if c not in configs] + [
        p for p in precisions + compile_precisions if p not in ("fp32", "bf16")
    ]
    if bad:
        raise SystemExit(f"bench_pretraining: unknown --configs/--precisions entries {bad}")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_pretraining_") as tmp:
        shard = make_shard(data_dir, vocab, Path(tmp))
        data = {"mini": load_batches(shard, 4, args.batch_mini), "base": load_batches(shard, 4, args.batch_base)}
        packed = (
            {}
            if args.no_packed
            else {
                name: load_packed_batches(shard, 4, rows, args.pack_pool, args.pack_k, args.seed)
                for name, rows in (("mini", args.batch_mini), ("base", args.batch_base))
            }
        )
    fill = float(torch.stack([b.attention_mask for b in data["mini"]]).float().mean())
    preds = float(torch.stack([(b.labels_ours >= 0).sum(1) for b in data["mini"]]).float().mean())
    print(
        f"data: WikiText-2 shard from create_pretraining_data.py; {100 * fill:.0f}% real tokens, {preds:.1f} "
        f"predictions a sequence; batches of {args.batch_mini} (mini) and {args.batch_base} (base)",
        flush=True,
    )
    rows = []
    for name in names:
        for precision in precisions:
            case = Case(
                name,
                configs[name],
                precision,
                args.steps,
                args.warmup,
                compile_models=False,
                unpad=not args.no_unpad,
                seed=args.seed,
            )
            rows.append(run_case(case, data[name], packed.get(name)))
    for precision in compile_precisions:
        case = Case(
            "mini",
            configs["mini"],
            precision,
            args.steps,
            args.warmup + 1,
            compile_models=True,
            unpad=False,
            seed=args.seed,
        )
        rows.append(run_case(case, data["mini"]))
    profile = profile_case(configs["mini"], data["mini"], args.seed) if args.profile else None
    result = {
        "command": " ".join([".venv/bin/python -m bench.bench_pretraining"] + (sys.argv[1:] if argv is None else argv)),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "optimizer": "NVLAMB lr 1e-3 wd 0.01 clip 1.0 (every model)",
        "data": {"real_token_fraction": fill, "predictions_per_sequence": preds},
        "rows": rows,
        "profile": profile,
    }
    atomic_write_json(args.out, result)
    print("\n" + table(rows))
    print(
        f"\nload average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} (a shared machine slows every "
        f"model alike; the runs alternate); wall {result['wall_s']:.0f} s; JSON: {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
