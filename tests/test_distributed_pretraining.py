"""run_pretraining.py with 2 real processes (torchrun, gloo on the CPU) against 1 process with the same global
batch: plain DDP, gradient accumulation with an all-reduce after every micro-batch, with DDP no_sync until the last
micro-batch (--allreduce_post_accumulation), with fp16-compressed all-reduce, and a 1-process checkpoint resumed by 2
processes.

Dropout is off so that the runs are comparable (each rank draws its own dropout masks), and every sample has the
same number of masked positions: each rank averages the MLM loss over its own positions and DDP averages the ranks,
which equals the 1-process average only when the ranks hold equally many positions (true of NVIDIA's recipe too).
All 2-process runs happen in one torchrun launch (starting Python and torch twice is most of the cost).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import args_for, make_shards, max_diff, read_log, subprocess_env, weights, write_config

import run_pretraining as rp
from bert_recipe.training import train_step

REPO = Path(__file__).resolve().parent.parent
STEPS = 6

WORKER = """
import json, sys
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(1)
torch.distributed.init_process_group("gloo")  # main() then leaves the group alone: several runs share it
import run_pretraining
from bert_recipe.training import dist_env
for argv in json.loads(sys.argv[1]):
    assert run_pretraining.main(argv) == 0
dist_env.end_process_group()  # barrier, destroy: no rank tears gloo down while its peer is still in a collective
dist_env.exit_script(lambda: 0)  # as the entry scripts end: without finalisation under gloo's live threads
"""


pytestmark = pytest.mark.usefixtures("one_thread_for_the_module")


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    data = make_shards(tmp_path / "data", n_shards=3, n=40)
    config = write_config(tmp_path / "bert_config.json", dropout=0.0)
    common = ["--max_steps", str(STEPS), "--log_freq", "1", "--num_steps_per_checkpoint", "100"]

    def run_args(name: str, batch: int, accum: int, *extra: str) -> list[str]:
        # The comparisons below are at fp32 tolerances unless a run names fp16 or bf16: name fp32 for the others,
        # whatever --precision auto would pick on this CPU.
        named = {"--fp16", "--bf16"} & set(extra)
        args = args_for(data, config, tmp_path / name, *common, *extra, *([] if named else ["--precision", "fp32"]))
        return args + ["--train_batch_size", str(batch), "--gradient_accumulation_steps", str(accum)]

    # One process: global batch 8 in one micro-batch, and in two micro-batches of 4.
    assert rp.main(run_args("one_plain", 8, 1)) == 0
    assert rp.main(run_args("one_accum", 8, 2)) == 0
    # One process trains the first 3 steps; two processes resume its checkpoint for the rest.
    assert rp.main(run_args("handover", 8, 2, "--steps_this_run", "3")) == 0
    fp16 = ["--allreduce_post_accumulation", "--fp16", "--init_loss_scale", "1024", "--debug_inject_inf_at_step", "2"]
    assert rp.main(run_args("one_fp16", 8, 2, *fp16)) == 0
    assert rp.main(run_args("one_bf16", 8, 2, "--bf16")) == 0

    two = {
        "two_plain": run_args("two_plain", 4, 1),
        "two_accum_every_micro": run_args("two_accum_every_micro", 4, 2),
        "two_no_sync": run_args("two_no_sync", 4, 2, "--allreduce_post_accumulation"),
        "two_no_sync_fp16": run_args(
            "two_no_sync_fp16", 4, 2, "--allreduce_post_accumulation", "--allreduce_post_accumulation_fp16"
        ),
        "handover": run_args("handover", 4, 2, "--resume_from_checkpoint"),
        "two_fp16": run_args("two_fp16", 4, 2, *fp16),  # both ranks overflow at step 2 and skip it together
        "two_bf16_compressed": run_args(
            "two_bf16_compressed", 4, 2, "--bf16", "--allreduce_post_accumulation", "--allreduce_post_accumulation_fp16"
        ),
    }
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.format(repo=str(REPO)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(worker),
        json.dumps(list(two.values())),
    ]
    done = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    final = f"ckpt_{STEPS}.pt"
    plain, accum = weights(tmp_path / "one_plain" / final), weights(tmp_path / "one_accum" / final)
    reference = {
        "two_plain": plain,
        "two_fp16": weights(tmp_path / "one_fp16" / final),
        "two_bf16_compressed": weights(tmp_path / "one_bf16" / final),
    }
    diffs = {name: max_diff(weights(tmp_path / name / final), reference.get(name, accum)) for name in two}
    print("max |w_2proc - w_1proc| after", STEPS, "steps:", diffs)
    for name in ("two_plain", "two_accum_every_micro", "two_no_sync", "handover"):
        assert diffs[name] <= 1e-5, name
    # Gradients rounded to 16 bits on the wire, or computed in 16 bits on half the batch: close, not equal (LAMB's
    # normalised steps keep the error small).
    assert diffs["two_no_sync_fp16"] <= 2e-3 and diffs["two_fp16"] <= 2e-3 and diffs["two_bf16_compressed"] <= 1e-2
    assert [
        r["data"]["skipped_steps"] for r in read_log(tmp_path / "two_fp16" / "log.json") if isinstance(r["step"], int)
    ] == [0, 1, 1, 1, 1, 1]
    assert max_diff(weights(tmp_path / "handover" / "ckpt_3.pt"), accum) > 1e-2  # steps 4-6 moved the weights

    # The logged losses are the means over both ranks: the same as the single process's.
    def losses(name: str) -> list[float]:
        return [r["data"]["average_loss"] for r in read_log(tmp_path / name / "log.json") if isinstance(r["step"], int)]

    assert losses("two_no_sync") == pytest.approx(losses("one_accum"), abs=1e-5)
    assert losses("two_plain") == pytest.approx(losses("one_plain"), abs=1e-5)
    ckpt = torch.load(tmp_path / "two_no_sync" / final, weights_only=True)
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    ckpt1 = torch.load(tmp_path / "one_accum" / final, weights_only=True)
    assert ckpt["data"] == ckpt1["data"]  # one global data position, whatever the number of processes


def test_grad_sync_turns_off_the_all_reduce_on_accumulation_micro_steps(tmp_path):
    """The mechanism under --allreduce_post_accumulation: DDP's no_sync() for all but the last micro-batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Linear(2, 2))
        with train_step.grad_sync(model, sync=False):
            assert model.require_backward_grad_sync is False
        with train_step.grad_sync(model, sync=True):
            assert model.require_backward_grad_sync is True
        plain = train_step.grad_sync(torch.nn.Linear(2, 2), sync=False)
        assert isinstance(plain, type(train_step.grad_sync(model, sync=True)))
    finally:
        torch.distributed.destroy_process_group()
