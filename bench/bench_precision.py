"""What --precision auto chose on this CPU, and whether it was right: one pre-training step (forward + backward +
NVLAMB) of the CPU demo's model in fp32 and in bf16 autocast, alternating in one process.

    .venv/bin/python -m bench.bench_precision [--config configs/bert-small-cpu.json] [--batch 32] [--seq 128]
        [--steps 6] [--threads 1] [--out results/bench_precision.json]

Records the CPU model, its bf16 flags (amx_bf16, avx512_bf16 from /proc/cpuinfo), what `precision_policy.resolve`
picked for `auto` and why, the median step time of each precision, and the ratio. On a CPU without native bf16
the bf16 step is emulated and much slower; where it is native, it is faster: auto must pick the faster one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from bench import study_utils as su
from bert_recipe.io.atomic_io import atomic_write_text
from bert_recipe.training import precision_policy
from modeling import BertConfig, BertForPreTraining
from optimization import make_lamb, param_groups_for_bert

REPO = su.REPO


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "bert-small-cpu.json"))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=6, help="timed steps per precision (after one warm-up step each)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=str(REPO / "results" / "bench_precision.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    flags = precision_policy.cpu_flags() or set()
    auto = precision_policy.resolve("auto", torch.device("cpu"))
    torch.manual_seed(0)
    config = BertConfig.from_json_file(args.config)
    model = BertForPreTraining(config)
    optimizer = make_lamb(param_groups_for_bert(model, 0.01), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)
    ids = torch.randint(5, config.vocab_size, (args.batch, args.seq))
    labels = torch.full_like(ids, -1)
    labels[:, 1 : args.seq : 7] = ids[:, 1 : args.seq : 7]  # ~15% of the positions predicted, as a 20-prediction shard
    batch = {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids),
        "masked_lm_labels": labels,
        "next_sentence_labels": torch.randint(0, 2, (args.batch,)),
    }

    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for name in times:  # warm-up
        su.timed_step(model, batch, optimizer, name, torch.device("cpu"))
    for i in range(args.steps):
        for name in ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32"):
            times[name].append(su.timed_step(model, batch, optimizer, name, torch.device("cpu")))
    median = {k: statistics.median(v) for k, v in times.items()}
    faster = min(median, key=median.get)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": su.cpu_description()[0],
        "cores": torch.get_num_threads(),
        "bf16_flags": sorted(f for f in precision_policy.CPU_BF16_FLAGS if f in flags),
        "avx512f": "avx512f" in flags,
        "auto": auto.name,
        "auto_reason": auto.reason,
        "config": Path(args.config).name,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "seconds_per_step": median,
        "bf16_over_fp32": median["bf16"] / median["fp32"],
        "faster": faster,
        "auto_picked_the_faster": auto.name == faster,
        "load_average": list(os.getloadavg()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"{result['cpu']} ({result['cores']} threads), bf16 flags: {result['bf16_flags'] or 'none'}")
    print(f"auto -> {auto.name} ({auto.reason})")
    print("| precision | s/step (median) |\n|---|---|")
    for name, seconds in median.items():
        print(f"| {name} | {seconds:.3f} |")
    print(f"bf16 / fp32 = {result['bf16_over_fp32']:.1f}x; auto picked the faster: {result['auto_picked_the_faster']}")
    return result


if __name__ == "__main__":
    main()
