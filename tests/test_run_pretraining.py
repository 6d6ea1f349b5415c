"""run_pretraining.py: flags, the data stream, fp16 overflow handling, checkpoints and exact resume (also after
SIGKILL at random moments and on SIGTERM), phase 1 -> phase 2, and learning on real text.

Everything runs on the CPU with one intra-op thread: the shared 2-core machine is oversubscribed, and an exact
resume compares runs that must use the same thread count. The data-parallel tests (2 real gloo processes) are in
test_distributed_pretraining.py.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import (
    CLS,
    MASK,
    PRED,
    SEP,
    SEQ,
    VOCAB,
    args_for,
    disk_full_for_large_writes,
    make_shards,
    max_diff,
    read_log,
    shard_stream,
    subprocess_env,
    weights,
    write_config,
)

import create_pretraining_data as cpd
import run_pretraining as rp
from bert_recipe.io import atomic_io
from bert_recipe.io.checkpoint_io import from_pretrained, save_hf_directory
from bert_recipe.pretraining import data_stream, shard_format
from bert_recipe.pretraining.trainer import list_checkpoints
from bert_recipe.training import dist_env, parallelize, stop_signals, train_step
from bert_recipe.training.dist_env import DistEnv
from modeling import BertConfig, BertForPreTraining
from optimization import NVLAMB, BertAdam, param_groups_for_bert

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread_for_the_module")


# ---------------------------------------------------------------------------------------------------------------
# Flags


ISSUE_FLAGS = [
    "--input_dir",
    "--config_file",
    "--vocab_file",
    "--output_dir",
    "--init_checkpoint",
    "--max_seq_length",
    "--max_predictions_per_seq",
    "--train_batch_size",
    "--gradient_accumulation_steps",
    "--learning_rate",
    "--warmup_proportion",
    "--max_steps",
    "--steps_this_run",
    "--seed",
    "--precision",
    "--fp16",
    "--amp",
    "--bf16",
    "--loss_scale",
    "--allreduce_post_accumulation",
    "--allreduce_post_accumulation_fp16",
    "--log_freq",
    "--num_steps_per_checkpoint",
    "--skip_checkpoint",
    "--resume_from_checkpoint",
    "--resume_step",
    "--phase2",
    "--phase1_end_step",
    "--do_train",
    "--json-summary",
    "--num_workers",
    "--disable_progress_bar",
    "--checkpoint_activations",
    "--eval_dir",
    "--eval_steps",
    "--num_steps_per_eval",
    "--dynamic_masking",
    "--compile",
    "--no_compile",
    "--compile_mode",
]


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        rp.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ISSUE_FLAGS:
        assert flag in text, flag
    assert "micro-batch = train_batch_size / gradient_accumulation_steps" in " ".join(text.split())


@pytest.mark.parametrize("extra", [["--fp16", "--bf16"], ["--amp", "--precision", "fp32"]])
def test_two_precisions_are_refused_in_one_line(tmp_path, data, config, capsys, extra):
    with pytest.raises(SystemExit) as exc:
        rp.main(args_for(data, config, tmp_path / "out", *extra))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err and "not allowed with argument" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--train_batch_size", "8", "--gradient_accumulation_steps", "3"], "not divisible by --gradient_accumulation"),
        (["--resume_step", "3"], "--resume_step needs --resume_from_checkpoint"),
        (["--compile", "--no_compile"], "--compile and --no_compile contradict each other"),
        (["--max_seq_length", "64"], "has sequences of length 32 but --max_seq_length is 64"),
        (["--max_predictions_per_seq", "3"], "5 masked positions per sequence but --max_predictions_per_seq is 3"),
        (["--debug_inject_inf_at_step", "2"], "for --precision fp16 runs only"),
    ],
)
def test_bad_flags_give_one_line_errors(tmp_path, data, config, extra, message):
    with pytest.raises(SystemExit) as exc:
        rp.main(args_for(data, config, tmp_path / "out", *extra))
    text = str(exc.value.code)
    assert message in text and "\n" not in text and text.startswith("run_pretraining.py: error:")


def test_unknown_flag_and_missing_data_are_one_line(tmp_path, config, capsys):
    with pytest.raises(SystemExit) as exc:
        rp.main(
            [
                "--config_file",
                str(config),
                "--output_dir",
                str(tmp_path),
                "--do_train",
                "--input_dir",
                str(tmp_path),
                "--no_such_flag",
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unrecognized arguments: --no_such_flag" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        rp.main(
            [
                "--config_file",
                str(config),
                "--output_dir",
                str(tmp_path / "o"),
                "--do_train",
                "--input_dir",
                str(tmp_path),
            ]
        )
    assert "holds no .hdf5 shards" in str(exc.value.code) and "\n" not in str(exc.value.code)


# ---------------------------------------------------------------------------------------------------------------
# Data


def nvidia_labels(positions: np.ndarray, ids: np.ndarray, seq: int) -> np.ndarray:
    """NVIDIA's pretraining_dataset.__getitem__ rule, written out: the slots before the first 0 after index 0."""
    labels = np.full((len(positions), seq), -1, dtype=np.int64)
    for row, (pos, tok) in enumerate(zip(positions, ids)):
        zeros = np.nonzero(pos == 0)[0]
        count = zeros[0] if len(zeros) else len(pos)
        labels[row, pos[:count]] = tok[:count]
    return labels


def test_mlm_labels_follow_nvidia_rule_with_padded_slots(tmp_path):
    folder = make_shards(tmp_path / "d", n_shards=1, short_rows=7)
    with h5py.File(folder / "shard_00.hdf5") as f:
        positions, ids = f["masked_lm_positions"][()], f["masked_lm_ids"][()]
    labels = data_stream.mlm_labels(positions, ids, SEQ)
    np.testing.assert_array_equal(labels, nvidia_labels(positions, ids, SEQ))
    assert (labels[-7:] >= 0).sum() == 7 * 2 and (labels[:-7] >= 0).sum() == 33 * PRED


def stream(folder: Path, micro: int, rank: int = 0, world: int = 1, workers: int = 0, state=None, masker=None):
    return shard_stream(folder, micro, rank, world, state, num_workers=workers, masker=masker)


def take(data: data_stream.PretrainingData, count: int) -> list[dict[str, torch.Tensor]]:
    it = iter(data)
    return [next(it) for _ in range(count)]


def test_stream_is_independent_of_the_process_split_and_resumes_exactly(tmp_path):
    folder = make_shards(tmp_path / "d", n_shards=3, n=40, tag=True)  # G = 12: 3 full batches + 4 dropped/shard
    one = stream(folder, 12)
    single = take(one, 20)  # more than an epoch (3 shards x 3 batches)
    ranks = [take(stream(folder, 6, rank=r, world=2), 20) for r in range(2)]
    for k in range(20):
        for key in single[k]:
            torch.testing.assert_close(single[k][key], torch.cat([ranks[0][k][key], ranks[1][k][key]]), rtol=0, atol=0)
    # Epoch 0 sees every sample at most once; only a remainder < G per shard is left out; epoch 1 is reshuffled.
    ids = [int(i) for b in single[:9] for i in b["input_ids"][:, 1]]
    assert len(set(ids)) == 9 * 12 and set(ids) <= set(range(120))
    assert [int(i) for i in single[9]["input_ids"][:, 1]] != ids[:12]
    # Resuming from the position after batch 5 gives batches 6, 7, ... again, with any worker count.
    first = stream(folder, 12)
    it = iter(first)
    for _ in range(5):
        next(it)
    resumed = take(stream(folder, 12, state=first.state_dict(), workers=2), 15)
    for k in range(15):
        for key in resumed[k]:
            assert torch.equal(resumed[k][key], single[5 + k][key])
    assert first.position == data_stream.DataPosition(epoch=0, shard_index=1, sample_offset=24)
    first.close()


def test_mixed_shards_are_shuffled_together_as_written_and_resume_exactly(tmp_path):
    """--mix_shards 2 over 5 shards of 40: epoch e visits groups of 2 consecutive shards of its shard order (the
    last group is one shard), each group's rows (its shards' rows one after the other) in the permutation drawn
    from (seed, e, first shard, 1), written out here with numpy; split across processes and resumed exactly."""
    folder = make_shards(tmp_path / "d", n_shards=5, n=40, tag=True)

    def mixed(micro, rank=0, world=1, state=None, workers=0):
        return shard_stream(folder, micro, rank, world, state, num_workers=workers, mix_shards=2)

    single = take(mixed(12), 17)  # epoch 0: 2 groups of 80 rows (6 batches each) + 1 of 40 (3): 15 batches
    shard_order = np.random.default_rng([7, 0]).permutation(5)
    expected = []
    for group in (shard_order[0:2], shard_order[2:4], shard_order[4:5]):
        rows = np.concatenate([s * 40 + np.arange(40) for s in group])  # the tags, shard after shard
        order = np.random.default_rng([7, 0, int(group[0]), 1]).permutation(len(rows))
        expected += rows[order][: len(rows) // 12 * 12].tolist()
    tags = [int(t) for b in single[:15] for t in b["input_ids"][:, 1]]
    assert tags == expected
    mixing = [len({t // 40 for t in b["input_ids"][:, 1].tolist()}) for b in single[:12]]
    assert all(m <= 2 for m in mixing) and sum(m == 2 for m in mixing) >= 10  # each batch from both of its shards
    ranks = [take(mixed(6, rank=r, world=2), 17) for r in range(2)]
    for k in range(17):
        for key in single[k]:
            assert torch.equal(single[k][key], torch.cat([ranks[0][k][key], ranks[1][k][key]])), (k, key)
    first = mixed(12)
    it = iter(first)
    for _ in range(8):
        next(it)
    assert first.position == data_stream.DataPosition(epoch=0, shard_index=1, sample_offset=24)
    resumed = take(mixed(12, state=first.state_dict(), workers=1), 9)
    first.close()
    for k in range(9):
        for key in resumed[k]:
            assert torch.equal(resumed[k][key], single[8 + k][key])


def test_the_stream_refuses_a_position_in_another_stream(tmp_path):
    """load_state_dict checks the state first: other shard files, another --mix_shards, or a binned order of
    another global micro-batch are ResumeErrors naming the flag, and the position stays where it was."""
    folder = make_shards(tmp_path / "d", n_shards=3, n=40)
    state = stream(folder, 8).state_dict()
    assert state["files"] == ["shard_00.hdf5", "shard_01.hdf5", "shard_02.hdf5"] and state["sample_offset"] == 0
    fewer = make_shards(tmp_path / "e", n_shards=2, n=40)
    data = stream(fewer, 8)
    with pytest.raises(
        data_stream.ResumeError,
        match=rf"--input_dir {fewer} does not hold the shards .*\(3 "
        r"then, 2 now\)",
    ):
        data.load_state_dict({**state, "sample_offset": 16})
    assert data.position == data_stream.DataPosition()
    with pytest.raises(data_stream.ResumeError, match="groups of 2 .*this run in groups of 1"):
        stream(folder, 8).load_state_dict({**state, "mix_shards": 2})
    binned = {**state, "length_bins": 4, "global_micro_batch": 16}
    with pytest.raises(data_stream.ResumeError, match="global micro-batch of 16, this run with 0 and 8"):
        stream(folder, 8).load_state_dict(binned)
    with pytest.raises(data_stream.DataError, match=r"\(64 = micro-batch 8 x 8 processes\)"):
        stream(folder, 8, world=8)
    moved = stream(folder, 8)
    moved.load_state_dict({**state, "shard_index": 1, "sample_offset": 16})
    assert moved.position == data_stream.DataPosition(0, 1, 16)


def test_group_rows_pad_narrower_masked_slots_with_unused_slots(tmp_path):
    wide = make_shards(tmp_path / "a", n_shards=1, pred=5)
    narrow = make_shards(tmp_path / "b", n_shards=1, pred=3, seed=1)
    paths = [wide / "shard_00.hdf5", narrow / "shard_00.hdf5"]
    rows = np.array([41, 3, 79, 0, 40])
    got = data_stream.read_group_rows(paths, [40, 40], rows)
    a, b = (data_stream.read_rows(p, np.arange(40)) for p in paths)
    for key in a:
        for out, r in zip(got[key], rows):
            src = np.atleast_1d(a[key][r] if r < 40 else b[key][r - 40])
            out = np.atleast_1d(out)
            assert np.array_equal(out[: len(src)], src) and not out[len(src) :].any(), (key, r)
    assert got["masked_lm_positions"].shape == (5, 5)


def test_mixed_run_resumes_exactly_and_refuses_another_mix(tmp_path, data, config):
    common = ["--max_steps", "6", "--seed", "5", "--mix_shards", "2", "--log_freq", "1"]
    reference, part = tmp_path / "reference", tmp_path / "part"
    assert rp.main(args_for(data, config, reference, *common)) == 0
    assert rp.main(args_for(data, config, part, *common, "--steps_this_run", "3")) == 0
    text = one_line_error(args_for(data, config, part, "--max_steps", "6", "--resume_from_checkpoint"))
    assert "read its shards in groups of 2 (--mix_shards), this run in groups of 1" in text
    assert rp.main(args_for(data, config, part, *common, "--resume_from_checkpoint")) == 0
    assert max_diff(weights(part / "ckpt_6.pt"), weights(reference / "ckpt_6.pt")) == 0.0
    assert torch.load(part / "ckpt_6.pt", weights_only=True)["data"]["mix_shards"] == 2
    assert "--mix_shards 0 must be at least 1" in one_line_error(
        args_for(data, config, tmp_path / "x", "--mix_shards", "0")
    )


def test_an_abandoned_or_closed_stream_ends_its_workers(tmp_path):
    """DataLoader workers ignore SIGTERM, so nothing else would end them: a stream dropped half-way (or closed)
    must end its workers at once, or the interpreter's exit waits for them forever."""
    import multiprocessing

    folder = make_shards(tmp_path / "d", n_shards=1, n=40)

    def workers_gone() -> bool:
        deadline = time.time() + 10
        while multiprocessing.active_children() and time.time() < deadline:
            time.sleep(0.05)
        return not multiprocessing.active_children()

    batches = iter(stream(folder, 8, workers=1))
    next(batches)
    assert multiprocessing.active_children()
    del batches  # abandoned mid-epoch
    assert workers_gone()
    data = stream(folder, 8, workers=1)
    next(iter(data))
    data.close()
    assert workers_gone()


ORIGINAL_IGNORE = data_stream._ignore_stop_signals


def _sigterm_then_ignore(worker_id: int) -> None:
    """A preemption landing in a new worker before it ignores the stop signals: SIGTERM from a process other
    than its parent (here the worker itself; Slurm's in a real job) while torch's worker handler is in place."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # an unblocked SIGTERM would have killed the worker by now
    ORIGINAL_IGNORE(worker_id)


def test_a_stop_signal_while_workers_start_does_not_kill_them(tmp_path, monkeypatch):
    """A new DataLoader (and new workers) starts at every shard; a SIGTERM sent to the job's process group while
    one starts must not kill its worker (the training process would crash with exit 1 instead of checkpointing
    and exiting 75: CI saw it once in the preemption test). Two shards: the signal lands in both shards' workers."""
    folder = make_shards(tmp_path / "d", n_shards=2, n=40)
    monkeypatch.setattr(data_stream, "_ignore_stop_signals", _sigterm_then_ignore)
    data = stream(folder, 8, workers=1)
    try:
        batches = take(data, 12)  # 5 micro-batches a shard: three DataLoaders, three workers signalled
    finally:
        data.close()
    assert len(batches) == 12


def test_dynamic_masking_new_masks_each_epoch_same_on_resume(tmp_path):
    folder = make_shards(tmp_path / "d", n_shards=1, n=40, vocab=VOCAB, unmasked=True)
    masker = data_stream.Masker(
        vocab_size=VOCAB, special_ids=(CLS, SEP, MASK, 0), mask_id=MASK, masked_lm_prob=0.15, max_predictions=PRED
    )
    batches = take(stream(folder, 8, masker=masker), 10)  # 5 batches an epoch
    with h5py.File(folder / "shard_00.hdf5") as f:
        originals = {tuple(row) for row in f["input_ids"][()].tolist()}
    masks = [{}, {}]  # per epoch: original row -> its labels
    for k, b in enumerate(batches):
        labels = torch.from_numpy(
            data_stream.mlm_labels(b["masked_lm_positions"].numpy(), b["masked_lm_ids"].numpy(), SEQ)
        )
        inputs = b["input_ids"]
        counts = (labels >= 0).sum(1)
        expected = np.minimum(PRED, np.maximum(1, np.rint(b["attention_mask"].sum(1).numpy() * 0.15)))
        assert counts.tolist() == expected.tolist()
        assert not np.isin(labels[labels >= 0].numpy(), [CLS, SEP, MASK, 0]).any()
        assert (inputs[labels >= 0] == MASK).float().mean() > 0.5  # ~80% [MASK]
        restored = torch.where(labels >= 0, labels, inputs)
        for row, label in zip(restored.tolist(), labels):
            assert tuple(row) in originals  # masking only replaces tokens it labels
            masks[k // 5][tuple(row)] = label
    assert len(masks[0]) == len(masks[1]) == 40
    assert sum(not torch.equal(masks[0][r], masks[1][r]) for r in masks[0]) > 30  # new masks in epoch 1
    resumed = stream(folder, 8, masker=masker)
    resumed.position = data_stream.DataPosition(0, 0, 16)  # as load_state_dict sets it from a checkpoint
    resumed = take(resumed, 3)
    for a, b in zip(resumed, batches[2:5]):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_unmasked_shards_need_dynamic_masking_and_train_with_it(tmp_path, config):
    folder = make_shards(tmp_path / "d", n_shards=1, unmasked=True)
    with pytest.raises(SystemExit, match="pass --dynamic_masking"):
        rp.main(args_for(folder, config, tmp_path / "a", "--max_steps", "2"))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]) + "\n")
    assert (
        rp.main(
            args_for(
                folder, config, tmp_path / "b", "--max_steps", "2", "--dynamic_masking", "--vocab_file", str(vocab)
            )
        )
        == 0
    )
    final = [r for r in read_log(tmp_path / "b" / "log.json") if r["step"] == "FINAL"][0]["data"]
    assert np.isfinite(final["final_loss"]) and final["step"] == 2


def one_line_error(argv) -> str:
    with pytest.raises(SystemExit) as exc:
        rp.main(argv)
    text = str(exc.value.code)
    assert "\n" not in text and text.startswith("run_pretraining.py: error:"), text
    return text


def test_bad_shards_vocabularies_and_lengths_are_refused_before_training(tmp_path, config):
    """Float token ids, a vocabulary that is not the config's (beyond padding to a multiple of 8), and a sequence
    length the position table does not have: one line each, before any step."""
    floats = make_shards(tmp_path / "floats", n_shards=1)
    with h5py.File(floats / "shard_00.hdf5", "r+") as f:
        ids = f["input_ids"][()].astype(np.float32)
        del f["input_ids"]
        f["input_ids"] = ids
    assert "must be integers" in one_line_error(args_for(floats, config, tmp_path / "a", "--max_steps", "2"))
    good = make_shards(tmp_path / "good", n_shards=1)
    small = tmp_path / "vocab.txt"  # 50 tokens against the config's 100
    small.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]) + "\n")
    assert "has 50 tokens but the config's vocab_size is 100" in one_line_error(
        args_for(good, config, tmp_path / "b", "--max_steps", "2", "--vocab_file", str(small))
    )
    long = make_shards(tmp_path / "long", n_shards=1, seq=128, pred=5)  # the tiny config has 64 positions
    assert "--max_seq_length 128 exceeds the config's max_position_embeddings 64" in one_line_error(
        args_for(long, config, tmp_path / "c", "--max_steps", "2", seq=128)
    )


def test_a_diverged_loss_is_caught_at_its_step_and_never_checkpointed(tmp_path, data, config):
    """--learning_rate 1e6 with --log_freq 10: the error names the step where the loss first went non-finite, long
    before the first log step, and no checkpoint on disk holds a non-finite tensor. Independently, the same run
    stopped one step earlier (--steps_this_run, same schedule) ends normally with a finite loss."""
    common = [
        "--learning_rate",
        "1e6",
        "--log_freq",
        "10",
        "--num_steps_per_checkpoint",
        "1",
        "--max_steps",
        "30",
        "--warmup_proportion",
        "0",
        "--seed",
        "3",
    ]
    text = one_line_error(args_for(data, config, tmp_path / "a", *common))
    assert "training diverged" in text
    step = int(text.split(" step ")[1].split(":")[0])
    assert 1 <= step < 10, text
    for path in list_checkpoints(tmp_path / "a").values():
        tensors = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in tensors.values()), path
    if step > 1:
        assert rp.main(args_for(data, config, tmp_path / "b", *common, "--steps_this_run", str(step - 1))) == 0
        final = [r for r in read_log(tmp_path / "b" / "log.json") if r["step"] == "FINAL"][-1]["data"]
        assert np.isfinite(final["final_loss"]) and final["step"] == step - 1


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, data, config, monkeypatch):
    """The disk fills during the third checkpoint write as a real full tmpfs does (torch.save's large writes fail
    with ENOSPC and it raises a RuntimeError chained to that OSError, the two chained tracebacks of issue 17; the
    file's close succeeds): one line naming the file and the error, no partial file, the second checkpoint
    intact and loadable."""
    real_save, calls = atomic_io.atomic_torch_save, []

    def save_until_full(obj, path):
        calls.append(path)
        if len(calls) == 3:
            disk_full_for_large_writes(monkeypatch)
        real_save(obj, path)

    monkeypatch.setattr(atomic_io, "atomic_torch_save", save_until_full)
    text = one_line_error(
        args_for(data, config, tmp_path / "out", "--max_steps", "5", "--num_steps_per_checkpoint", "1")
    )
    assert "ckpt_3.pt: No space left on device" in text and "intact" in text, text
    assert "RuntimeError" not in text and "enforce fail" not in text
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if "ckpt" in p.name) == ["ckpt_1.pt", "ckpt_2.pt"]
    assert torch.load(tmp_path / "out" / "ckpt_2.pt", weights_only=True)["step"] == 2


def test_resume_refuses_when_no_checkpoint_can_be_read(tmp_path, data, config):
    out = tmp_path / "out"
    out.mkdir()
    for step in (2, 3):
        (out / f"ckpt_{step}.pt").write_bytes(b"not a checkpoint")
    text = one_line_error(args_for(data, config, out, "--max_steps", "5", "--resume_from_checkpoint"))
    assert "none of this phase's checkpoints" in text and "ckpt_2.pt, ckpt_3.pt" in text
    assert sorted(p.name for p in out.glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_3.pt"]  # nothing deleted


# ---------------------------------------------------------------------------------------------------------------
# Start-up: an eager run does not import Dynamo


DYNAMO_PROBE = """
import sys, torch, optimization
model = torch.nn.Linear(4, 4)
for name in ("adamw", "nvlamb"):
    opt = optimization.make_optimizer(name, model.parameters(), lr=1e-3)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules, "sympy" in sys.modules)
"""


def test_optimizers_import_dynamo_only_when_a_run_compiles(monkeypatch):
    """torch.optim.Optimizer wraps add_param_group, zero_grad, state_dict and load_state_dict in
    torch._disable_dynamo, whose first call imports torch._dynamo and sympy (1.3 s of every training process's
    start). Ours call the methods themselves while Dynamo is not imported (nothing can be compiling): a fresh
    interpreter builds, steps, zeroes and reloads both optimizers without importing it; once it is imported,
    every call goes through torch's wrapper again (which then caches its disabled function)."""
    done = subprocess.run(
        [sys.executable, "-c", DYNAMO_PROBE],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=subprocess_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]
    import torch._dynamo  # a compiled run has imported it

    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        monkeypatch.delattr(getattr(torch.optim.Optimizer, name).__wrapped__, "__dynamo_disable", raising=False)
    model = torch.nn.Linear(4, 4)
    opt = BertAdam(model.parameters(), lr=1e-3)
    opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        assert hasattr(getattr(torch.optim.Optimizer, name).__wrapped__, "__dynamo_disable"), name


# ---------------------------------------------------------------------------------------------------------------
# fp16 overflow


def test_overflow_step_is_skipped_scale_halves_weights_unchanged(config):

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_json_file(config))

    model, precision = parallelize.apply_parallelism_and_precision(model, DistEnv(), "fp16", init_loss_scale=1024)
    optimizer = NVLAMB(param_groups_for_bert(model, 0.01), lr=1e-2)
    batch = data_stream.to_model_inputs(
        {
            "input_ids": np.full((2, 8), 7, np.int32),
            "input_mask": np.ones((2, 8), np.int8),
            "segment_ids": np.zeros((2, 8), np.int8),
            "masked_lm_positions": np.array([[1, 3], [2, 0]], np.int32),
            "masked_lm_ids": np.array([[9, 11], [12, 0]], np.int32),
            "next_sentence_labels": np.array([0, 1], np.int8),
        },
        slice(0, 2),
    )

    def backward():
        with precision.autocast():
            loss = model(**batch).loss
        precision.scaler.scale(loss).backward()

    before = {k: v.clone() for k, v in model.state_dict().items()}
    backward()
    rp._inject_inf(model)
    assert train_step.optimizer_step(optimizer, precision) is False
    assert precision.loss_scale == 512.0  # halved
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(optimizer.state) == 0  # no moments, no step count: the step never happened
    optimizer.zero_grad(set_to_none=True)
    backward()
    assert train_step.optimizer_step(optimizer, precision) is True
    assert precision.loss_scale == 512.0  # grows only after 2000 good steps
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(float(s["step"]) == 1 for s in optimizer.state.values())


def test_fp16_run_counts_only_taken_steps_and_resumes_exactly(tmp_path, data, config):
    # An initial scale of 2^20 (the default) overflows this tiny model's first steps by itself; start lower so
    # that the injected overflow is the only one.
    common = [
        "--fp16",
        "--init_loss_scale",
        "1024",
        "--debug_inject_inf_at_step",
        "2",
        "--max_steps",
        "5",
        "--log_freq",
        "1",
        "--gradient_accumulation_steps",
        "2",
    ]
    assert rp.main(args_for(data, config, tmp_path / "full", *common)) == 0
    log = [r for r in read_log(tmp_path / "full" / "log.json") if isinstance(r["step"], int)]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5]
    assert [r["data"]["skipped_steps"] for r in log] == [0, 1, 1, 1, 1]
    assert [r["data"]["loss_scale"] for r in log] == [1024.0] + [512.0] * 4
    ckpt = torch.load(tmp_path / "full" / "ckpt_5.pt", weights_only=True)
    assert ckpt["phase_step"] == 5 and ckpt["scheduler"]["last_epoch"] == 5 and ckpt["skipped_steps"] == 1
    assert ckpt["grad_scaler"]["scale"] == 512.0
    assert all(float(s["step"]) == 5 for s in ckpt["optimizer"]["state"].values())
    # 6 optimizer attempts x 2 micro-batches x 8 sequences consumed: the skipped step's data is used up.
    assert ckpt["data"]["epoch"] * 120 + ckpt["data"]["shard_index"] * 40 + ckpt["data"]["sample_offset"] >= 6 * 8
    # The same run in two invocations (3 steps, then resume) ends with the same weights and loss scale.
    part = tmp_path / "part"
    assert rp.main(args_for(data, config, part, *common, "--steps_this_run", "3")) == 0
    assert sorted(list_checkpoints(part)) == [3]
    assert rp.main(args_for(data, config, part, *common, "--resume_from_checkpoint")) == 0
    resumed = torch.load(part / "ckpt_5.pt", weights_only=True)
    assert max_diff(resumed["model"], ckpt["model"]) == 0.0
    assert resumed["grad_scaler"] == ckpt["grad_scaler"] and resumed["data"] == ckpt["data"]


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints, output folder, resume


def test_checkpoints_contents_rotation_refusal_and_resume_step(tmp_path, data, config):
    out = tmp_path / "out"
    assert rp.main(args_for(data, config, out, "--max_steps", "7", "--num_steps_per_checkpoint", "2")) == 0
    assert sorted(list_checkpoints(out)) == [4, 6, 7]  # every 2 steps and at the end, newest three kept
    ckpt = torch.load(out / "ckpt_7.pt", map_location="cpu", weights_only=True)  # no pickled code needed
    for key in ("model", "config", "optimizer", "scheduler", "grad_scaler", "rng", "data", "phase", "step"):
        assert key in ckpt
    assert ckpt["phase"] == 1 and ckpt["step"] == 7 and len(ckpt["rng"]) == 1
    assert set(ckpt["data"]) >= {"epoch", "shard_order", "shard_index", "sample_offset"}
    assert {"python", "numpy", "torch"} <= set(ckpt["rng"][0])
    # The checkpoint is what checkpoint_io.from_pretrained reads (Hugging Face names).
    model = from_pretrained(BertForPreTraining, out / "ckpt_7.pt", log=None)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ckpt["model"].items())
    assert "bert.encoder.layer.1.attention.self.query.weight" in ckpt["model"]
    # A used folder is refused without --resume_from_checkpoint, in one line.
    with pytest.raises(SystemExit) as exc:
        rp.main(args_for(data, config, out, "--max_steps", "9"))
    assert "already holds checkpoints" in str(exc.value.code) and "--resume_from_checkpoint" in str(exc.value.code)
    # --resume_step picks an older one; a missing one is a one-line error.
    with pytest.raises(SystemExit, match="--resume_step 5"):
        rp.main(args_for(data, config, out, "--max_steps", "9", "--resume_from_checkpoint", "--resume_step", "5"))
    assert (
        rp.main(
            args_for(
                data,
                config,
                out,
                "--max_steps",
                "9",
                "--resume_from_checkpoint",
                "--resume_step",
                "6",
                "--num_steps_per_checkpoint",
                "100",
            )
        )
        == 0
    )
    first = [r for r in read_log(out / "log.json") if r["step"] == "PARAMETER"][-1]
    assert first["data"]["start_step"] == 6
    # A corrupt newest checkpoint (not one of ours: ours are atomic) is passed over for the previous one.
    (out / "ckpt_9.pt").write_bytes(b"garbage")
    (out / ".ckpt_10.pt.abc.tmp").write_bytes(b"half")
    assert rp.main(args_for(data, config, out, "--max_steps", "10", "--resume_from_checkpoint")) == 0
    assert not (out / ".ckpt_10.pt.abc.tmp").exists()
    assert torch.load(out / "ckpt_10.pt", weights_only=True)["step"] == 10


def test_resumed_run_follows_its_own_schedule_and_hyperparameters(tmp_path, data, config, capsys):
    """Extending a finished run (a larger --max_steps) or changing its rate on resume: the checkpoint gives the step
    and the optimizer's moments, the command gives the schedule. (Restoring the saved schedule, as torch's
    load_state_dict does, left the extended steps at the old schedule's end: learning rate 0, silently.)"""
    out = tmp_path / "out"
    assert rp.main(args_for(data, config, out, "--max_steps", "4", "--log_freq", "1")) == 0
    capsys.readouterr()
    assert (
        rp.main(
            args_for(
                data,
                config,
                out,
                "--max_steps",
                "8",
                "--log_freq",
                "1",
                "--resume_from_checkpoint",
                "--learning_rate",
                "2e-2",
                "--weight_decay",
                "0.05",
            )
        )
        == 0
    )
    said = capsys.readouterr()
    assert "resumed with this run's hyper-parameters, not ckpt_4.pt's" in said.out + said.err
    assert "total_steps 4 -> 8" in said.out + said.err and "weight_decay 0.01 -> 0.05" in said.out + said.err
    rates = {
        r["step"]: r["data"]["learning_rate"]
        for r in read_log(out / "log.json")
        if isinstance(r["step"], int) and "learning_rate" in r["data"]
    }
    # The default poly schedule written out for this run (base 2e-2, warm-up 0.2 of 8 steps, degree 0.5): logged
    # step N used the rate of 0-based step k = N - 1, past the warm-up: base * (1 - k / 8) ** 0.5.
    for n in (5, 6, 7, 8):
        assert rates[n] == pytest.approx(2e-2 * (1 - (n - 1) / 8) ** 0.5, rel=1e-9)
    ckpt = torch.load(out / "ckpt_8.pt", map_location="cpu", weights_only=True)
    assert ckpt["scheduler"]["total_steps"] == 8
    assert {g["weight_decay"] for g in ckpt["optimizer"]["param_groups"]} == {0.0, 0.05}  # no decay: biases, LN


def test_evaluation_alone_matches_accuracy_computed_from_full_logits(tmp_path, data, config):
    out = tmp_path / "out"
    assert rp.main(args_for(data, config, out, "--max_steps", "3")) == 0
    argv = [
        "--config_file",
        str(config),
        "--output_dir",
        str(out),
        "--eval_dir",
        str(data),
        "--resume_from_checkpoint",
        "--max_seq_length",
        str(SEQ),
        "--max_predictions_per_seq",
        str(PRED),
        "--eval_batch_size",
        "7",
        "--max_eval_samples",
        "100",
        "--json-summary",
        str(tmp_path / "eval.json"),
    ]
    assert rp.main(argv) == 0
    result = read_log(tmp_path / "eval.json")[-1]["data"]
    # Reference: the model's full [B, S, V] scores (no labels given), argmax at every labelled position.
    model = from_pretrained(BertForPreTraining, out / "ckpt_3.pt", log=None).eval()
    correct = total = 0
    loss = 0.0
    for shard in sorted(data.glob("*.hdf5"))[:3]:
        with h5py.File(shard) as f:
            rows = {k: f[k][()] for k in shard_format.SHARD_KEYS}
        take = min(40, 100 - total // PRED)
        labels = torch.from_numpy(nvidia_labels(rows["masked_lm_positions"][:take], rows["masked_lm_ids"][:take], SEQ))
        with torch.no_grad():
            scores, _ = model(
                torch.from_numpy(rows["input_ids"][:take]).long(),
                torch.from_numpy(rows["segment_ids"][:take]).long(),
                torch.from_numpy(rows["input_mask"][:take]).long(),
            )
        picked = labels >= 0
        correct += int((scores.argmax(-1)[picked] == labels[picked]).sum())
        loss += float(torch.nn.functional.cross_entropy(scores[picked], labels[picked], reduction="sum"))
        total += int(picked.sum())
    assert result["eval_masked_positions"] == total == 100 * PRED
    assert result["eval_mlm_accuracy"] == pytest.approx(correct / total, abs=1e-9)
    assert result["eval_mlm_loss"] == pytest.approx(loss / total, rel=1e-5)
    # The unigram entropy of the same targets, written out: -sum p ln p over their frequencies; and the [MASK]ed
    # slots (these shards put [MASK] at every prediction slot) with and without the rest of the input, from the
    # full logits again, on inputs stripped by hand (every real token but [CLS] and [SEP] -> [MASK]).
    targets, hits, count = [], {"with": 0, "without": 0}, 0
    for shard in sorted(data.glob("*.hdf5"))[:3]:
        take = min(40, 100 - count // PRED)
        with h5py.File(shard) as f:
            rows = {k: f[k][()][:take] for k in shard_format.SHARD_KEYS}
        ids, mask = rows["input_ids"].astype(np.int64), rows["input_mask"].astype(np.int64)
        labels = torch.from_numpy(nvidia_labels(rows["masked_lm_positions"], rows["masked_lm_ids"], SEQ))
        picked = labels >= 0
        targets.append(labels[picked].numpy())
        inputs = {"with": ids, "without": np.where((mask == 1) & (ids != CLS) & (ids != SEP), MASK, ids)}
        for name, input_ids in inputs.items():
            with torch.no_grad():
                scores = model(
                    torch.from_numpy(input_ids), torch.from_numpy(rows["segment_ids"]).long(), torch.from_numpy(mask)
                )[0]  # [B, S, V]
            hits[name] += int((scores.argmax(-1)[picked] == labels[picked]).sum())
        count += int(picked.sum())
    p = np.unique(np.concatenate(targets), return_counts=True)[1] / count
    assert result["eval_unigram_entropy"] == pytest.approx(-(p * np.log(p)).sum(), rel=1e-9)
    assert result["eval_mask_slots"] == count
    assert result["eval_mask_accuracy"] == pytest.approx(hits["with"] / count, abs=1e-9)
    assert result["eval_mask_accuracy_without_context"] == pytest.approx(hits["without"] / count, abs=1e-9)
    assert result["eval_context_gain"] == pytest.approx((hits["with"] - hits["without"]) / count, abs=1e-9)
    assert result["eval_mask_accuracy_most_frequent"] == pytest.approx(p.max(), rel=1e-9)  # the commonest target


def test_init_checkpoint_accepts_a_hugging_face_folder(tmp_path, data, config):
    torch.manual_seed(3)
    source = BertForPreTraining(BertConfig.from_json_file(config))
    save_hf_directory(source, tmp_path / "hf")
    out = tmp_path / "out"
    assert (
        rp.main(
            args_for(
                data, config, out, "--max_steps", "1", "--learning_rate", "0", "--init_checkpoint", str(tmp_path / "hf")
            )
        )
        == 0
    )
    trained = weights(out / "ckpt_1.pt")
    expected = {k: v for k, v in source.state_dict().items() if k in trained}
    assert max_diff(trained, expected) == 0.0  # learning rate 0: the starting weights, untouched


def test_phase1_to_phase2_handoff(tmp_path, data, config):
    out = tmp_path / "out"
    data512 = make_shards(tmp_path / "p2", n_shards=2, seq=64, pred=10, seed=1)
    assert rp.main(args_for(data, config, out, "--max_steps", "4", "--num_steps_per_checkpoint", "1")) == 0
    phase1 = weights(out / "ckpt_4.pt")
    p2 = [
        "--phase2",
        "--phase1_end_step",
        "4",
        "--resume_from_checkpoint",
        "--num_steps_per_checkpoint",
        "1",
        "--gradient_accumulation_steps",
        "2",
    ]
    # With learning rate 0 the phase-2 weights are exactly phase 1's: the hand-off loads ckpt_4.pt.
    lr0 = tmp_path / "lr0"
    lr0.mkdir()
    (lr0 / "ckpt_4.pt").write_bytes((out / "ckpt_4.pt").read_bytes())
    assert (
        rp.main(args_for(data512, config, lr0, *p2, "--max_steps", "1", "--learning_rate", "0", seq=64, pred=10)) == 0
    )
    assert max_diff(weights(lr0 / "ckpt_5.pt"), phase1) == 0.0
    # A real phase 2: 2 steps, then resumed (from its own checkpoint, not phase 1's) to 5.
    assert (
        rp.main(args_for(data512, config, out, *p2, "--max_steps", "5", "--steps_this_run", "2", seq=64, pred=10)) == 0
    )
    ckpt = torch.load(out / "ckpt_6.pt", weights_only=True)
    assert ckpt["phase"] == 2 and ckpt["phase_step"] == 2 and ckpt["phase1_end_step"] == 4
    assert all(float(s["step"]) == 2 for s in ckpt["optimizer"]["state"].values())  # fresh optimizer state
    assert ckpt["scheduler"]["total_steps"] == 5 and ckpt["scheduler"]["last_epoch"] == 2
    with pytest.raises(SystemExit, match="already holds checkpoints"):
        rp.main(
            args_for(data512, config, out, "--phase2", "--phase1_end_step", "4", "--max_steps", "5", seq=64, pred=10)
        )
    assert rp.main(args_for(data512, config, out, *p2, "--max_steps", "5", seq=64, pred=10)) == 0
    steps = sorted(list_checkpoints(out))
    assert steps[-3:] == [7, 8, 9] and 4 in steps  # phase 2 keeps its newest three, never phase 1's
    logged = [r["step"] for r in read_log(out / "log.json") if isinstance(r["step"], int)]
    assert logged[-3:] == [7, 8, 9]  # phase 2 logs continue the global count
    # Re-running phase 1 with --resume_from_checkpoint (the launcher's resume_training=true) after phase 2 began
    # finds phase 1 complete and leaves everything as it is.
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("ckpt_*.pt")}
    assert rp.main(args_for(data, config, out, "--max_steps", "4", "--resume_from_checkpoint")) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("ckpt_*.pt")} == before
    with pytest.raises(SystemExit, match="phase 2 starts from phase 1's checkpoint"):
        rp.main(args_for(data512, config, tmp_path / "empty", "--phase2", "--phase1_end_step", "4", seq=64, pred=10))


# ---------------------------------------------------------------------------------------------------------------
# Preemption: SIGTERM, and SIGKILL at random moments


# Runs run_pretraining.main with checkpoint writes slowed down (64 KiB chunks, 40 ms apart) through the same
# atomic_io.atomic_open, so that a SIGKILL can be aimed at the middle of a write.
SLOW_WRITER = """
import io, sys, time
sys.path.insert(0, {repo!r})
import torch
from bert_recipe.io import atomic_io

def slow_torch_save(obj, path):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    with atomic_io.atomic_open(path, "wb") as f:
        for i in range(0, len(payload), 1 << 16):
            f.write(payload[i:i + (1 << 16)])
            f.flush()
            time.sleep(0.04)

atomic_io.atomic_torch_save = slow_torch_save
import run_pretraining
sys.exit(run_pretraining.main(sys.argv[1:]))
"""


def test_killed_and_preempted_run_resumes_to_identical_weights(tmp_path, data, config):
    """SIGKILL in the middle of a checkpoint write, SIGKILL between writes (during the steps), then SIGTERM
    (Slurm preemption: checkpoint, exit 75), each in a process of its own, then a run to the end: the weights equal
    an uninterrupted run's.
    Dropout is on and each micro-batch comes from a DataLoader worker, so RNG and data positions must resume.
    The signals go to the whole process group, workers included, as Slurm sends them."""
    steps = 24
    common = ["--max_steps", str(steps), "--gradient_accumulation_steps", "2", "--seed", "5"]
    reference = tmp_path / "reference"  # uninterrupted, in this process, no worker, checkpoint only at the end
    assert rp.main(args_for(data, config, reference, *common, "--num_steps_per_checkpoint", "1000")) == 0

    out = tmp_path / "killed"
    out.mkdir()
    runner = tmp_path / "runner.py"
    runner.write_text(SLOW_WRITER.format(repo=str(REPO)))
    cmd = [
        sys.executable,
        str(runner),
        *args_for(
            data,
            config,
            out,
            *common,
            "--num_steps_per_checkpoint",
            "1",
            "--resume_from_checkpoint",
            "--num_workers",
            "1",
        ),
    ]
    rng = random.Random(time.time_ns())
    events = []
    for mode in ("kill-in-write", "kill-in-steps", "sigterm"):
        before = max(list_checkpoints(out), default=0)
        strike_after = before + rng.randint(1, 4)  # a random number of steps into this run
        proc = subprocess.Popen(
            cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.time() + 150
        while proc.poll() is None:  # wait for progress, then for the moment to strike
            assert time.time() < deadline, "no progress"
            progressed = max(list_checkpoints(out), default=0) >= strike_after
            writing = bool(list(out.glob(".ckpt_*.tmp")))
            if progressed and (writing if mode == "kill-in-write" else not writing):
                break
            time.sleep(0.002)
        if mode == "sigterm":
            time.sleep(rng.uniform(0.0, 0.3))
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=60) == stop_signals.EXIT_STOPPED, proc.stderr.read().decode()[-2000:]
            final = [r for r in read_log(out / "log.json") if r["step"] == "FINAL"][-1]["data"]
            assert final["stopped_by_signal"] and final["step"] == max(list_checkpoints(out)) < steps
            assert torch.load(out / f"ckpt_{final['step']}.pt", weights_only=True)["step"] == final["step"]
            events.append((mode, before, final["step"], []))
        else:
            partial = sorted(p.name for p in out.glob(".ckpt_*.tmp"))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            events.append((mode, before, max(list_checkpoints(out)), partial))
    # The run to the end is struck by nothing: the same command in this process (one thread, as OMP_NUM_THREADS=1
    # gives the subprocesses; a DataLoader worker) with torch's own checkpoint writes, not the slowed ones that
    # only serve to aim a kill: no interpreter to start, no 40 ms pauses in each of its checkpoints.
    assert rp.main(cmd[2:]) == 0
    print("(how, newest checkpoint at launch, newest at the end, temporary files at the kill):", events)
    assert events[0][3] and not events[1][3]  # killed in the middle of a write, then between writes
    assert max(list_checkpoints(out)) == steps
    diff = max_diff(weights(out / f"ckpt_{steps}.pt"), weights(reference / f"ckpt_{steps}.pt"))
    print(f"max |w_resumed - w_uninterrupted| = {diff}")
    assert diff <= 1e-6
    a = torch.load(out / f"ckpt_{steps}.pt", weights_only=True)
    b = torch.load(reference / f"ckpt_{steps}.pt", weights_only=True)
    assert a["data"] == b["data"] and a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == steps
    torch.testing.assert_close(a["optimizer"], b["optimizer"], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Learning on real text


def wikitext_documents(path: Path, limit_chars: int) -> str:
    """WikiText-2 as create_pretraining_data's input: one sentence a line, a blank line between articles."""
    lines, size = [], 0
    for raw in path.read_text(encoding="utf-8").splitlines():
        text = raw.strip()
        if text.startswith("= ") and not text.startswith("= ="):  # " = Title = " starts an article
            lines.append("")
            continue
        if not text or text.startswith("="):
            continue
        for sentence in text.replace(" . ", " .\n").splitlines():
            lines.append(sentence.strip())
            size += len(sentence)
        if size > limit_chars:
            break
    return "\n".join(lines) + "\n"


def test_small_bert_learns_on_wikitext(tmp_path, shared_data, uncased_vocab):

    for split, chars in (("valid", 700_000), ("test", 60_000)):
        (tmp_path / f"{split}.txt").write_text(wikitext_documents(shared_data / "wikitext-2" / f"{split}.txt", chars))
        assert (
            cpd.main(
                [
                    "--input_file",
                    str(tmp_path / f"{split}.txt"),
                    "--output_file",
                    str(tmp_path / split / "wiki.hdf5"),
                    "--vocab_file",
                    str(uncased_vocab),
                    "--max_seq_length",
                    "64",
                    "--max_predictions_per_seq",
                    "10",
                    "--dupe_factor",
                    "1",
                    "--random_seed",
                    "1",
                    "--num_workers",
                    "1",
                    "--no_progress",
                ]
            )
            == 0
        )
    # Tuned to stay well under a minute of CPU: hidden 64, 2 layers, batch 16, 250 steps of LAMB at 2e-2, in the
    # precision --precision auto picks here (fp32 on a CPU without native bf16, bf16 on one with it).
    config = write_config(tmp_path / "bert_config.json", dropout=0.0, vocab=30522, hidden=64)
    out = tmp_path / "out"
    assert (
        rp.main(
            [
                "--input_dir",
                str(tmp_path / "valid"),
                "--config_file",
                str(config),
                "--output_dir",
                str(out),
                "--vocab_file",
                str(uncased_vocab),
                "--do_train",
                "--max_seq_length",
                "64",
                "--max_predictions_per_seq",
                "10",
                "--train_batch_size",
                "16",
                "--learning_rate",
                "2e-2",
                "--warmup_proportion",
                "0.05",
                "--max_steps",
                "250",
                "--num_workers",
                "0",
                "--log_freq",
                "25",
                "--precision",
                "auto",
                "--eval_dir",
                str(tmp_path / "test"),
                "--eval_steps",
                "125",
                "--max_eval_samples",
                "512",
                "--skip_checkpoint",
                "--disable_progress_bar",
                "--json-summary",
                str(out / "log.json"),
            ]
        )
        == 0
    )
    log = read_log(out / "log.json")
    train = [r["data"]["mlm_loss"] for r in log if isinstance(r["step"], int) and "mlm_loss" in r["data"]]
    evals = [r["data"] for r in log if "eval_mlm_accuracy" in r["data"]]
    # The unigram baseline: always predict the most frequent masked token of the held-out set.
    with h5py.File(tmp_path / "test" / "wiki.hdf5") as f:
        labels = data_stream.mlm_labels(f["masked_lm_positions"][:512], f["masked_lm_ids"][:512], 64)
    counts = np.bincount(labels[labels >= 0])
    baseline = counts.max() / counts.sum()
    accuracy = [e["eval_mlm_accuracy"] for e in evals]
    print(
        f"train MLM loss {train[0]:.3f} -> {train[-1]:.3f}; held-out accuracy {accuracy} (unigram baseline "
        f"{baseline:.3f} over {counts.sum()} positions), held-out loss {[e['eval_mlm_loss'] for e in evals]}"
    )
    assert len(evals) == 2 and evals[-1]["eval_masked_positions"] == counts.sum()
    assert train[-1] < train[0] - 3.0  # from ln(30522) = 10.3
    assert accuracy[-1] > accuracy[0] and evals[-1]["eval_mlm_loss"] < evals[0]["eval_mlm_loss"]
    assert accuracy[-1] > baseline + 0.03  # ~0.10 against ~0.05: 2 points of margin is ~4 standard errors
    final = [r["data"] for r in log if r["step"] == "FINAL"][0]
    assert final["training_sequences_per_second"] > 0 and final["e2e_train_time"] > 0


def reference_adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """torch.optim.AdamW as BERT decays: weight matrices at 0.01, biases and LayerNorm not at all (by name)."""
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.999),
        eps=1e-6,
    )


def batches_of(data: Path):
    """The batches of 8 that run_pretraining.py (seed 42, one process) trains on, in its order."""
    shards = data_stream.inspect_shards(
        sorted(data.glob("*.hdf5")), data_stream.ShardSpec(SEQ, PRED, False), "--input_dir"
    )
    return iter(data_stream.PretrainingData(shards, 42, 8))


def test_adamw_option_equals_torch_adamw_step_for_step(tmp_path, config):
    """--optimizer adamw: the weights after each of 6 steps equal a hand-written loop over the same batches with
    torch.optim.AdamW (decay on weight matrices only, by name), clip_grad_norm_ and the poly schedule written
    out: lr_k = lr * (k / 6) / 0.34 during warm-up, lr * (1 - k / 6) ** 0.5 after it."""
    from helpers import write_config

    config = write_config(tmp_path / "config.json", dropout=0.0)
    data = make_shards(tmp_path / "data", n_shards=1, n=48)
    steps, lr, warmup = 6, 3e-3, 0.34
    out = tmp_path / "out"
    assert (
        rp.main(
            args_for(
                data,
                config,
                out,
                "--optimizer",
                "adamw",
                "--max_steps",
                str(steps),
                "--learning_rate",
                str(lr),
                "--warmup_proportion",
                str(warmup),
                "--precision",
                "fp32",
                "--num_steps_per_checkpoint",
                "1",
                "--keep_checkpoints",
                str(steps),
            )
        )
        == 0
    )

    dist_env.set_seed(42)  # run_pretraining's --seed: the same initial weights
    model = BertForPreTraining(BertConfig.from_json_file(config)).train()
    reference, stream = reference_adamw(model, lr), batches_of(data)
    for k in range(steps):
        factor = (k / steps) / warmup if k / steps < warmup else (1 - k / steps) ** 0.5
        for group in reference.param_groups:
            group["lr"] = lr * factor
        model(**next(stream)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        reference.step()
        reference.zero_grad()
        ours = weights(out / f"ckpt_{k + 1}.pt")
        for name, value in model.state_dict().items():
            if name in ours:
                torch.testing.assert_close(ours[name], value, atol=2e-6, rtol=1e-5, msg=f"step {k + 1}: {name}")
    with pytest.raises(SystemExit, match="--use_nvlamb is a switch of --optimizer nvlamb"):
        rp.main(args_for(data, config, tmp_path / "x", "--optimizer", "adamw", "--use_nvlamb"))


def test_unigram_bias_init_starts_at_the_unigram_loss(tmp_path):
    """--mlm_bias_init unigram: the output bias is ln of the add-one-smoothed target frequencies (written out on a
    hand-made shard), and an untrained model's masked-LM loss on that shard is then the cross-entropy of those
    frequencies (the embeddings' small random logits aside), where the zero bias starts near ln V."""
    import h5py
    from helpers import write_config

    shard = tmp_path / "data" / "a.hdf5"
    shard.parent.mkdir()
    with h5py.File(shard, "w") as f:  # targets: 7 four times, 9 twice, 8 once, at used slots only
        f["input_ids"] = np.full((3, SEQ), MASK, np.int32)
        f["masked_lm_positions"] = np.array([[1, 2, 3], [4, 5, 0], [6, 7, 0]], np.int32)
        f["masked_lm_ids"] = np.array([[7, 7, 9], [7, 8, 55], [9, 7, 55]], np.int32)
    vocab = 12
    prior = shard_format.unigram_log_prior(shard, vocab)
    counts = np.ones(vocab)
    counts[7], counts[8], counts[9] = 5, 2, 3  # + 1 each
    np.testing.assert_allclose(prior, np.log(counts / counts.sum()), rtol=1e-6)

    data = make_shards(tmp_path / "shards", n_shards=1, n=40)
    config = write_config(tmp_path / "c.json", dropout=0.0)
    losses = {}
    for init in ("zero", "unigram"):
        out = tmp_path / init
        assert (
            rp.main(
                args_for(
                    data,
                    config,
                    out,
                    "--max_steps",
                    "1",
                    "--learning_rate",
                    "1e-9",
                    "--mlm_bias_init",
                    init,
                    "--precision",
                    "fp32",
                    "--log_freq",
                    "1",
                )
            )
            == 0
        )
        losses[init] = read_log(out / "log.json")[1]["data"]["mlm_loss"]
        if init == "unigram":
            bias = weights(out / "ckpt_1.pt")["cls.predictions.bias"].numpy()
            prior = shard_format.unigram_log_prior(sorted(data.glob("*.hdf5"))[0], VOCAB)
            np.testing.assert_allclose(bias, prior, atol=1e-6)
    with h5py.File(sorted(data.glob("*.hdf5"))[0]) as f:
        targets = f["masked_lm_ids"][()][f["masked_lm_positions"][()] > 0]
    p = (np.bincount(targets, minlength=VOCAB) + 1.0) / (len(targets) + VOCAB)
    cross_entropy = -np.log(p[targets]).mean()
    assert abs(losses["unigram"] - cross_entropy) < 0.05 and abs(losses["zero"] - np.log(VOCAB)) < 0.1


def test_no_nsp_trains_on_the_masked_lm_loss_alone(tmp_path):
    """--no_nsp: after 3 AdamW steps the encoder and masked-LM head equal a hand-written loop that minimises
    out.mlm_loss only (torch.optim.AdamW, constant lr, no clipping); the next-sentence head got zero gradients, so
    AdamW moved it by weight decay alone: W <- W * (1 - lr * 0.01) per step. The NSP loss is still logged."""
    from helpers import write_config

    config = write_config(tmp_path / "config.json", dropout=0.0)
    data = make_shards(tmp_path / "data", n_shards=1, n=32)
    steps, lr = 3, 1e-3
    out = tmp_path / "out"
    assert (
        rp.main(
            args_for(
                data,
                config,
                out,
                "--no_nsp",
                "--optimizer",
                "adamw",
                "--max_steps",
                str(steps),
                "--learning_rate",
                str(lr),
                "--lr_schedule",
                "constant",
                "--warmup_proportion",
                "0",
                "--max_grad_norm",
                "0",
                "--precision",
                "fp32",
                "--log_freq",
                "1",
            )
        )
        == 0
    )
    dist_env.set_seed(42)
    model = BertForPreTraining(BertConfig.from_json_file(config)).train()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    reference, stream = reference_adamw(model, lr), batches_of(data)
    for _ in range(steps):
        model(**next(stream)).mlm_loss.backward()
        reference.step()
        reference.zero_grad()
    ours = weights(out / f"ckpt_{steps}.pt")
    for name, value in model.state_dict().items():
        if name in ours:
            torch.testing.assert_close(ours[name], value, atol=2e-6, rtol=1e-5, msg=name)
    head = "cls.seq_relationship.weight"
    torch.testing.assert_close(ours[head], start[head] * (1 - lr * 0.01) ** steps, atol=1e-7, rtol=1e-6)
    logged = [r["data"] for r in read_log(out / "log.json") if isinstance(r["step"], int) and "nsp_loss" in r["data"]]
    assert logged and all(np.isfinite(r["nsp_loss"]) and r["average_loss"] == r["mlm_loss"] for r in logged)
