"""The GPU speed call, prepared here: BERT-large pre-training speed on one GPU, path by path, beside transformers.

    python -m bench.gpu_speed prepare --out .gpu_speed     # here, on the CPU: real shards, vocabulary, configs
    OUT=<folder> bash bench/gpu_pretraining.sh .gpu_speed   # on the GPU machine, .gpu_speed carried (one call)
    python -m bench.gpu_speed summarize <folder>            # summary.json / summary.md (the call script runs it)

`prepare` turns the first --files files of the Wikipedia slice (../shared/data) into documents
(scripts.text_to_documents), then into four folders of HDF5 shards with the recipe's own create_pretraining_data.py
and the uncased vocabulary: phase 1 (sequence 128, 20 predictions) and phase 2 (512, 80), each plain and packed
(--pack_sequences 3). It writes BERT-large's config (bert_config.json) as config_base.json and, with attention
dropout 0, config_nodrop.json; and each again with two layers (config_<name>_smoke.json), for the call's smoke.
How a row runs (unpadding, kernels, graphs) is run_pretraining.py's flags, set by the call script.

The call script runs one process per row, each through run_pretraining.py itself (the data loader, NVLAMB, bf16
autocast, the Trainer) with --profile_steps (the profile lands in the row's summary). The peer rows run `hf` below.

`hf`: transformers' BertForPreTraining (sdpa attention) trained on the same shards with the same micro-batch,
accumulation, steps, warm-up, precision (bf16 autocast), optimizer (our NVLAMB) and compilation (torch.compile of
the whole model, transformers' own way): its forward with dense labels (-100 where nothing is predicted), so its
masked-LM head scores every position, as transformers does. Its FLOPs for MFU are counted as ours (trainer.batch_flops:
the model's work on real tokens, the head on the labelled positions), so MFU and real tokens/s compare directly.
It writes run_pretraining.py's kind of JSON lines, with the FINAL record the summary reads.

`dropout_probe`: each attention kernel's effective dropout rate and scale, measured (dropout.json): queries and keys
all equal, so every probability is 1/S, and one-hot values, so each output element is one probability, kept and
scaled or dropped. The share of zeros is the rate the kernel applied; the kept value times S is 1 / (1 - p). Padded
SDPA as torch routes it and as bert_attention.sdpa restricts it, each SDPA kernel alone, and the varlen kernels.

`summarize DIR`: every row's FINAL numbers and profile, the ratio of each row's real tokens/s to transformers' in the
same phase, as summary.json and a Markdown table (summary.md).

torch, transformers and the modules that load torch are imported in the functions that use them: `prepare`,
`summarize` and the results page (which imports this module) need none of them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

from bench import study_utils as su
from bench.study_utils import fmt
from bert_recipe.io.atomic_io import JsonLogger, read_json_lines
from create_pretraining_data import main as create_pretraining_data
from scripts.text_to_documents import main as text_to_documents

REPO = su.REPO
SHARED = su.DATA
PHASES = {1: (128, 20), 2: (512, 80)}  # sequence length, predictions per sequence
CONFIGS = {"base": {}, "nodrop": {"attention_probs_dropout_prob": 0.0}}  # architectures; how rows run is flags


# --------------------------------------------------------------------------------------------------------------
# prepare (CPU)


def prepare(args) -> dict:
    slice_dir = Path(args.slice)
    files = sorted(p for p in slice_dir.iterdir() if p.name.startswith("wiki_"))[: args.files]
    if not files:
        raise SystemExit(f"gpu_speed: error: --slice {slice_dir} holds no wiki_* files")
    vocab = Path(args.vocab)
    if not vocab.is_file():
        raise SystemExit(f"gpu_speed: error: --vocab {vocab} not found")
    out = Path(args.out)
    stage = out.with_name(out.name + ".part")  # renamed to --out only when complete
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    started = time.time()
    text = stage / "train.txt"
    if text_to_documents(["--input", *map(str, files), "--sentences", "--output", str(text)]) not in (0, None):
        raise SystemExit("gpu_speed: error: text_to_documents failed")
    shutil.copy(vocab, stage / "vocab.txt")
    for phase, (seq, pred) in PHASES.items():
        for kind in ("plain", "packed"):
            folder = stage / f"p{phase}_{kind}"
            folder.mkdir()
            extra = ["--pack_sequences", "3"] if kind == "packed" else []
            code = create_pretraining_data(
                [
                    "--input_file",
                    str(text),
                    "--output_file",
                    str(folder / "train.hdf5"),
                    "--vocab_file",
                    str(vocab),
                    "--do_lower_case",
                    "--max_seq_length",
                    str(seq),
                    "--max_predictions_per_seq",
                    str(pred),
                    "--dupe_factor",
                    str(args.dupe_factor),
                    "--random_seed",
                    "12345",
                    "--num_workers",
                    str(args.workers),
                    "--no_progress",
                    *extra,
                ]
            )
            if code not in (0, None):
                raise SystemExit(f"gpu_speed: error: create_pretraining_data failed for p{phase}_{kind}")
    write_tasks(stage / "tasks", text)
    text.unlink()
    base = json.loads(Path(args.config).read_text())
    for name, fields in CONFIGS.items():
        (stage / f"config_{name}.json").write_text(json.dumps({**base, **fields}, indent=2) + "\n")
        smoke = {**base, **fields, "num_hidden_layers": min(2, base.get("num_hidden_layers", 2))}  # two layers
        (stage / f"config_{name}_smoke.json").write_text(json.dumps(smoke, indent=2) + "\n")
    report = {
        "command": "python -m bench.gpu_speed " + " ".join(args.argv),
        "files": len(files),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "wall_s": round(time.time() - started, 1),
        "rows": {p.name: su.count_samples(p) for p in sorted(stage.glob("p*_*"))},
    }
    (stage / "prepare.json").write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)
    print(json.dumps(report, indent=2))
    return report


def write_tasks(folder: Path, text: Path) -> None:
    """Tiny real inputs for bench/gpu_user_paths.sh: GLUE MRPC (16 + 8 pairs), SQuAD (the first article's first
    three paragraphs to train on, the fourth to answer), SWAG's layout made of consecutive sentences of the prepared
    text (16 + 8 examples) and 4 lines for extract_features.py."""
    import csv
    import random

    (folder / "MRPC").mkdir(parents=True)
    for name, n in (("train.tsv", 16), ("dev.tsv", 8)):
        rows = (SHARED / "glue-mrpc" / name).read_text(encoding="utf-8").splitlines()[: n + 1]
        (folder / "MRPC" / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    dev = json.loads((SHARED / "squad-v1.1-dev" / "dev-v1.1.json").read_text(encoding="utf-8"))
    article = dev["data"][0]
    (folder / "squad").mkdir()
    for name, paragraphs in (("train.json", article["paragraphs"][:3]), ("dev.json", article["paragraphs"][3:4])):
        squad = {"version": dev["version"], "data": [{"title": article["title"], "paragraphs": paragraphs}]}
        (folder / "squad" / name).write_text(json.dumps(squad), encoding="utf-8")
    sentences = [s for s in text.read_text(encoding="utf-8").splitlines() if 5 <= len(s.split()) <= 30][:200]
    rng = random.Random(0)
    (folder / "swag").mkdir()
    for name, n in (("train.csv", 16), ("val.csv", 8)):
        with open(folder / "swag" / name, "w", encoding="utf-8", newline="") as f:
            out = csv.writer(f)
            out.writerow(
                [
                    "",
                    "video-id",
                    "fold-ind",
                    "startphrase",
                    "sent1",
                    "sent2",
                    "gold-source",
                    "ending0",
                    "ending1",
                    "ending2",
                    "ending3",
                    "label",
                ]
            )
            for i in range(n):
                k = rng.randrange(len(sentences) - 1)
                endings = [sentences[k + 1], *rng.sample(sentences, 3)]
                label = rng.randrange(4)
                endings[0], endings[label] = endings[label], endings[0]
                out.writerow([i, "wiki", i, sentences[k], sentences[k], "", "gold", *endings, label])
    (folder / "lines.txt").write_text("\n".join(sentences[:4]) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------------------------
# hf: the peer


def hf_model(args, ours, device):
    """transformers' BertForPreTraining of our config (sdpa attention), on `device`, compiled when asked, and our
    NVLAMB over its parameters. Returns (the model to step, the optimizer)."""
    import torch  # on use, as transformers and the torch-backed modules (see the module docstring)
    import transformers

    from bert_recipe.io.checkpoint_io import hf_config
    from optimization import make_optimizer, param_groups_for_bert

    hf_cfg = transformers.BertConfig(**hf_config(ours, "BertForPreTraining"))
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.BertForPreTraining(hf_cfg).to(device).train()
    optimizer = make_optimizer("nvlamb", param_groups_for_bert(model, 0.01), lr=args.learning_rate)
    return (torch.compile(model) if args.compile else model), optimizer


def hf_tensors(args) -> tuple:
    """The shards as transformers' inputs (CPU tensors, every row), the masked positions (for the FLOP count),
    and the micro-batch."""
    import torch  # on use (see the module docstring)

    arrays = su.read_shards(args.input_dir)
    n, seq = arrays["input_ids"].shape
    micro = args.train_batch_size // args.gradient_accumulation_steps
    if n < micro:
        raise SystemExit(
            f"gpu_speed hf: error: --input_dir {args.input_dir} holds {n} rows, fewer than a micro-batch of {micro}"
        )
    as_long = lambda key: torch.from_numpy(arrays[key].astype(np.int64))  # noqa: E731
    tensors = {
        "input_ids": as_long("input_ids"),
        "attention_mask": as_long("input_mask"),
        "token_type_ids": as_long("segment_ids"),
        "next_sentence_label": as_long("next_sentence_labels"),
        "labels": torch.from_numpy(hf_labels(arrays["masked_lm_positions"], arrays["masked_lm_ids"], seq)),
    }
    return tensors, as_long("masked_lm_positions"), micro


def hf_labels(positions: np.ndarray, ids: np.ndarray, seq: int) -> np.ndarray:
    """[B, S] masked-LM labels in transformers' convention, -100 where nothing is predicted."""
    from bert_recipe.pretraining.data_stream import mlm_labels

    labels = mlm_labels(positions, ids, seq)
    labels[labels == -1] = -100
    return labels


def run_hf(args) -> dict:
    """The peer's loop: warm-up steps, profiled steps (not timed), timed steps; the same FLOP count as ours."""
    import torch  # on use, as the torch-backed modules (see the module docstring)

    from bert_recipe.pretraining.trainer import batch_flops
    from bert_recipe.training.meter import peak_flops
    from bert_recipe.training.profiling import StepProfiler
    from modeling import BertConfig

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    ours = BertConfig.from_json_file(args.config)
    step_model, optimizer = hf_model(args, ours, device)
    tensors, positions, micro = hf_tensors(args)
    n, untimed = len(positions), args.throughput_warmup_steps + args.profile_steps
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    logger = JsonLogger(args.json_summary, enabled=True)
    profiler = StepProfiler(args.profile_steps, device) if args.profile_steps else None
    timed, first_step_s, cursor = {"rows": 0, "tokens": 0, "flops": 0.0}, None, 0
    start = time.perf_counter()
    for step in range(1, args.max_steps + 1):
        if step == args.throughput_warmup_steps + 1 and profiler is not None:
            profiler.start()
        if step == untimed + 1:  # the clock starts after the profile is summarised
            if profiler is not None:
                logger.log("PROFILE", profiler.stop())
            sync(device)
            start = time.perf_counter()
        for _ in range(args.gradient_accumulation_steps):
            rows = torch.arange(cursor, cursor + micro) % n
            cursor += micro
            batch = {k: v[rows].to(device, non_blocking=True) for k, v in tensors.items()}
            with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
                loss = step_model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if step > untimed:
                mask = tensors["attention_mask"][rows]
                timed["rows"] += micro
                timed["tokens"] += int(mask.sum())
                timed["flops"] += batch_flops(ours, {"attention_mask": mask, "masked_lm_positions": positions[rows]})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 1:
            sync(device)
            first_step_s = time.perf_counter() - start
        if step % args.log_freq == 0:
            logger.log(step, {"average_loss": float(loss) * args.gradient_accumulation_steps})
    sync(device)
    final = hf_final(
        args, device, timed, time.perf_counter() - start, float(loss), first_step_s, peak_flops(device, args.precision)
    )
    logger.log("FINAL", final)
    logger.close()
    print(json.dumps(final))
    return final


def hf_final(
    args, device, timed: dict, seconds: float, loss: float, first_step_s: float | None, peak: float | None
) -> dict:
    """The FINAL record, in run_pretraining.py's keys."""
    import torch  # on use (see the module docstring)

    final = {
        "final_loss": loss * args.gradient_accumulation_steps,
        "training_sequences_per_second": timed["rows"] / seconds,
        "training_real_sequences_per_second": timed["rows"] / seconds,
        "training_real_tokens_per_second": timed["tokens"] / seconds,
        "first_step_s": first_step_s,
        "timed_steps": args.max_steps - args.throughput_warmup_steps - args.profile_steps,
    }
    if peak:
        final["mfu"] = timed["flops"] / seconds / peak
    if device.type == "cuda":
        final["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return final


def sync(device) -> None:
    import torch  # on use (see the module docstring)

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------------------------
# dropout_probe


def dropout_rate(out, seqlen: int) -> tuple[float, float]:
    """(the share of dropped probabilities, the rate implied by the kept ones' scale) of an attention output over
    equal scores (every probability 1/S) and one-hot values: each element is 0 or (1/S) / (1 - p)."""
    out = out.float()
    kept = out[out != 0]
    return 1.0 - kept.numel() / out.numel(), 1.0 - 1.0 / (float(kept.mean()) * seqlen)


def dropout_probe(args) -> dict:
    """Each attention path's dropout, measured (the module docstring); a path is exact when its rate is within 5
    standard deviations of --p and its scale within 1%."""
    import torch  # on use (see the module docstring)
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import bert_attention as ba
    import bert_padding as bp

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    B, N, S, p = args.batch, args.heads, 64, args.p
    q = torch.zeros(B, N, S, S, device=device, dtype=dtype)  # [B, N, S, D], D = S: equal scores
    v = torch.eye(S, device=device, dtype=dtype).expand(B, N, S, S)  # one-hot values
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)  # the padded path's key mask, all real
    qkv = torch.stack([q, q, v], 2).permute(0, 3, 2, 1, 4).reshape(B * S, 3, N, S)  # [T, 3, N, D]
    info = bp.unpad_info(torch.ones(B, S, dtype=torch.long, device=device))
    paths = {
        "sdpa_as_torch_routes": lambda: F.scaled_dot_product_attention(q, q, v, attn_mask=mask, dropout_p=p),
        "sdpa_as_the_recipe_runs": lambda: ba.sdpa(q, q, v, mask, p),
    }

    def alone(backend):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, q, v, dropout_p=p)

    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        paths[f"sdpa_{backend.name.lower()}"] = functools.partial(alone, backend)
    for kernel in ("flash_varlen", "flash_attn"):
        if ba.choose_kernel(device.type, dtype, p, kernel).name == kernel:
            paths[f"varlen_{kernel}"] = lambda kernel=kernel: ba.varlen_attention(qkv, info, p, kernel)
    sigma = (p * (1 - p) / (B * N * S * S)) ** 0.5
    report = {
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "device": str(device),
        "p": p,
        "dtype": str(dtype),
        "elements": B * N * S * S,
        "paths": {},
    }
    for name, run in paths.items():
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                rate, scale_rate = dropout_rate(run(), S)
        except RuntimeError as e:  # a kernel this device or torch has not
            report["paths"][name] = {"error": str(e).splitlines()[0][:200]}
            continue
        exact = abs(rate - p) < 5 * sigma and abs(scale_rate - p) < 0.01
        report["paths"][name] = {"rate": rate, "scale_rate": scale_rate, "exact": exact}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dropout.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


# --------------------------------------------------------------------------------------------------------------
# summarize


def summarize(folder: Path, out: Path | None = None) -> list[dict]:
    """Every row of the call (folder/rows.txt: name, phase, path, mode, wall seconds, exit status, one a line; the
    rows' logs in folder/logs) with its FINAL numbers and profile, and the ratio of its real tokens/s to
    transformers' in the same phase and mode; written to out (default: folder) as summary.json and summary.md."""
    out = out or folder
    rows = []
    listing = folder / "rows.txt"
    for line in listing.read_text().splitlines() if listing.is_file() else []:
        name, phase, layout, mode, wall, status, micro = line.split()
        records = read_json_lines(folder / "logs" / f"{name}.json")  # a line cut by a killed row is skipped
        final = next((r["data"] for r in records if r.get("step") == "FINAL"), None)
        profile = next((r["data"] for r in records if r.get("step") == "PROFILE"), None)
        profile_file = folder / "logs" / f"{name}.profile.json"
        if profile is None and profile_file.is_file():
            profile = json.loads(profile_file.read_text())
        row = {
            "run": name,
            "phase": int(phase),
            "layout": layout,
            "mode": mode,
            "wall_s": int(wall),
            "exit": int(status),
            "finished": final is not None,
            "micro_batch": int(micro),
        }
        if final:
            row.update(
                rows_per_s=final["training_sequences_per_second"],
                sequences_per_s=final["training_real_sequences_per_second"],
                tokens_per_s=final["training_real_tokens_per_second"],
                mfu=final.get("mfu"),
                peak_memory_gib=final.get("peak_memory_gib"),
                final_loss=final.get("final_loss"),
                cudagraph_skips=final.get("cudagraph_skips"),
            )
        if profile:
            row["profile"] = profile
        rows.append(row)
    for row in rows:  # transformers' row of the same phase, mode and micro-batch
        peer = next(
            (
                r
                for r in rows
                if r["phase"] == row["phase"]
                and r["layout"] == "hf"
                and r["finished"]
                and r["mode"] == row["mode"]
                and r["micro_batch"] == row["micro_batch"]
            ),
            None,
        )
        if row["finished"] and peer:
            row["ratio_to_transformers"] = row["tokens_per_s"] / peer["tokens_per_s"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "summary.md").write_text(table(rows) + "\n")
    print(table(rows))
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| phase | path | mode | micro-batch | rows/s | sequences/s | real tokens/s | MFU | peak GiB | "
        "vs transformers | GPU busy | last loss | wall s |",
        "|" + "---|" * 13,
    ]
    for r in rows:
        head = f"| {r['phase']} | {r['layout']} | {r['mode']} | {fmt(r['micro_batch'], ',.0f')} |"
        if not r["finished"]:
            lines.append(f"{head} failed (exit {r['exit']}, see logs/{r['run']}.log) | | | | | | | | {r['wall_s']} |")
            continue
        busy = (r.get("profile") or {}).get("busy_share")
        lines.append(
            f"{head} {fmt(r['rows_per_s'], ',.1f')} | "
            f"{fmt(r['sequences_per_s'], ',.1f')} | {fmt(r['tokens_per_s'], ',.0f')} | "
            f"{fmt(r.get('mfu'), '.1f', 100, '%')} | {fmt(r.get('peak_memory_gib'), '.1f')} | "
            f"{fmt(r.get('ratio_to_transformers'), '.2f', 1, 'x')} | {fmt(busy, '.0f', 100, '%')} | "
            f"{fmt(r.get('final_loss'), '.3f')} | "
            f"{r['wall_s']} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# The results page's section (bench.results_page --gpu_speed DIR)


def steady_rates(folder: Path) -> dict[str, float]:
    """{row: rows/s between its last two step log lines}, read from the call's logs.tar.gz: a second estimate of
    each run_pretraining.py row's rate, independent of its FINAL line (it includes the one host sync of a log step).
    transformers' rows log no batch size and are left out."""
    rates = {}
    archive = folder / "logs.tar.gz"
    if not archive.is_file():
        return rates
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            if name.parent.name != "logs" or name.suffix != ".json" or name.name.endswith(".profile.json"):
                continue
            records = [
                json.loads(line) for line in tar.extractfile(member).read().decode().splitlines() if line.strip()
            ]
            batch = next((r["data"].get("train_batch_size") for r in records if r.get("step") == "PARAMETER"), None)
            steps = [r for r in records if isinstance(r.get("step"), int)]
            if batch and len(steps) >= 2:
                a, b = steps[-2], steps[-1]
                rates[name.stem] = (b["step"] - a["step"]) * batch / (b["timestamp"] - a["timestamp"])
    return rates


def markdown(folder: Path) -> str:
    """One call's section: what ran where (call.json, gpu.txt), the rows' table, and where each row's GPU time
    went (the profile's parts and its busy share)."""
    meta = json.loads((folder / "call.json").read_text()) if (folder / "call.json").is_file() else {}
    rows = json.loads((folder / "summary.json").read_text())
    gpu = (folder / "gpu.txt").read_text().strip().splitlines() if (folder / "gpu.txt").is_file() else []
    steady = steady_rates(folder)
    settings = ", ".join(f"{k} {v}" for k, v in (meta.get("settings") or {}).items() if k != "rows")
    lines = [
        f"**{meta.get('title', folder.name)}** ({meta.get('date', 'date not recorded')}). "
        f"{'; '.join(gpu[1:])}. Command: `{meta.get('command', 'OUT=<folder> bash bench/gpu_pretraining.sh')}`"
        f"{'; settings: ' + settings if settings else ''}.",
        "",
    ]
    if meta.get("note"):
        lines += [meta["note"], ""]
    lines += [
        "| phase | path | micro-batch | rows/s | sequences/s | real tokens/s | MFU | vs transformers | rows/s, "
        "last log steps | peak GiB | GPU busy (profile) | matmul / fused / attention / optimizer |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mistimed = set(meta.get("final_mistimed", []))  # rows whose FINAL rates a bug of that call's code spoilt
    for r in rows:
        if not r["finished"]:
            lines.append(
                f"| {r['phase']} | {r['layout']} {r['mode']} | {fmt(r['micro_batch'], ',.0f')} | failed "
                f"(exit {r['exit']}) | | | | | | | | |"
            )
            continue
        prof = r.get("profile") or {}
        parts = prof.get("parts") or {}

        def share(k: str, parts: dict = parts) -> str:
            return fmt((parts.get(k) or {}).get("share"), ".0f", 100, "%")

        cells = [
            fmt(r["rows_per_s"], ",.0f"),
            fmt(r["sequences_per_s"], ",.0f"),
            fmt(r["tokens_per_s"], ",.0f"),
            fmt(r.get("mfu"), ".1f", 100, "%"),
        ]
        ratio = fmt(r.get("ratio_to_transformers"), ".2f", 1, "x")
        if r["run"] in mistimed:
            cells = [f"~~{c}~~" for c in cells]  # struck out: the rate from the log lines stands instead
            peer = next((p for p in rows if p["phase"] == r["phase"] and p["layout"] == "hf" and p["finished"]), None)
            if peer and r["run"] in steady:  # real tokens a row are the run's own, whatever its clock
                tokens = steady[r["run"]] * r["tokens_per_s"] / r["rows_per_s"]
                ratio = f"{tokens / peer['tokens_per_s']:.2f}x (log)"
        lines.append(
            f"| {r['phase']} | {r['layout']} {r['mode']} | {fmt(r['micro_batch'], ',.0f')} | {' | '.join(cells)} | "
            f"{ratio} | {fmt(steady.get(r['run']), ',.0f')} | {fmt(r.get('peak_memory_gib'), '.1f')} | "
            f"{fmt(prof.get('busy_share'), '.0f', 100, '%')} | {share('matmul')} / {share('fused (compiled)')} / "
            f"{share('attention')} / {share('optimizer')} |"
        )
    return "\n".join(lines + waits_table(rows))


def waits_table(rows: list[dict]) -> list[str]:
    """Where the GPU waited for the host (profiling.py's host_while_idle), for the rows whose profile has it."""
    waited = [r for r in rows if r["finished"] and "idle_by_host" in (r.get("profile") or {})]
    if not waited:
        return []
    lines = [
        "",
        "Where the GPU waited for the host, in the profiled steps (ms a step; the host's outermost ranges "
        "that overlapped the GPU's idle time, on any thread, so one moment can count twice; 'none' is idle "
        "time under no recorded range, the host in Python between operators):",
        "",
        "| phase | path | micro-batch | kernels a step | idle ms a step | idle under (top 3) | none |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in waited:
        prof = r["profile"]
        under = "; ".join(f"{name[:60]} {ms:.1f}" for name, ms in list(prof["idle_by_host"].items())[:3])
        lines.append(
            f"| {r['phase']} | {r['layout']} {r['mode']} | {fmt(r['micro_batch'], ',.0f')} | "
            f"{fmt(prof.get('kernels_per_step'), ',.0f')} | {fmt(prof.get('idle_ms_per_step'), '.1f')} | "
            f"{under} | {fmt(prof.get('idle_uncovered_ms_per_step'), '.1f')} |"
        )
    return lines


# --------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_speed",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prepare", help="real shards, vocabulary and configs for the device call (CPU)")
    pr.add_argument("--out", default=str(REPO / ".gpu_speed"))
    pr.add_argument(
        "--slice",
        default=str(SHARED / "wikipedia-en-slice" / "text" / "AA"),
        help="WikiExtractor folder of wiki_* files",
    )
    pr.add_argument("--files", type=int, default=6, help="the first this many files of --slice (about 1 MB each)")
    pr.add_argument("--vocab", default=str(SHARED / "bert-vocab" / "bert-base-uncased-vocab.txt"))
    pr.add_argument("--config", default=str(REPO / "bert_config.json"))
    pr.add_argument("--dupe_factor", type=int, default=1)
    pr.add_argument("--workers", type=int, default=2)
    hf = sub.add_parser("hf", help="train transformers' BertForPreTraining on the shards and time it")
    hf.add_argument("--input_dir", required=True)
    hf.add_argument("--config", required=True, help="our bert_config.json (converted to transformers' config)")
    hf.add_argument("--json-summary", dest="json_summary", required=True)
    hf.add_argument("--train_batch_size", type=int, required=True, help="rows per optimizer step")
    hf.add_argument("--gradient_accumulation_steps", type=int, default=1)
    hf.add_argument("--max_steps", type=int, required=True)
    hf.add_argument("--throughput_warmup_steps", type=int, default=3)
    hf.add_argument("--profile_steps", type=int, default=0)
    hf.add_argument("--learning_rate", type=float, default=6e-3)
    hf.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    hf.add_argument("--compile", action="store_true")
    hf.add_argument("--cpu", action="store_true", help="on the CPU even when a GPU is present (the tests)")
    hf.add_argument("--log_freq", type=int, default=5)
    hf.add_argument("--seed", type=int, default=42)
    dp = sub.add_parser("dropout_probe", help="each attention kernel's dropout rate and scale, measured")
    dp.add_argument("--out", required=True, help="where dropout.json goes")
    dp.add_argument("--p", type=float, default=0.1, help="the dropout probability asked for (BERT's 0.1)")
    dp.add_argument("--batch", type=int, default=8)
    dp.add_argument("--heads", type=int, default=16)
    dp.add_argument("--cpu", action="store_true", help="on the CPU even when a GPU is present (the tests)")
    sm = sub.add_parser("summarize", help="summary.json and summary.md of a call's rows")
    sm.add_argument("folder")
    sm.add_argument("--out", help="where summary.json and summary.md go (default: the folder)")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    return args


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    if args.command == "prepare":
        return prepare(args)
    if args.command == "hf":
        if args.gradient_accumulation_steps < 1 or args.train_batch_size % args.gradient_accumulation_steps:
            raise SystemExit(
                "gpu_speed hf: error: --train_batch_size must be a multiple of --gradient_accumulation_steps"
            )
        if args.max_steps <= args.throughput_warmup_steps + args.profile_steps:
            raise SystemExit("gpu_speed hf: error: --max_steps must exceed the warm-up and profiled steps")
        return run_hf(args)
    if args.command == "dropout_probe":
        return dropout_probe(args)
    return summarize(Path(args.folder), Path(args.out) if args.out else None)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
