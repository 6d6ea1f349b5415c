"""The shared training core (parallelize.py, train_step.py, meter.py, checkpoint_io.CheckpointManager,
recipe.fit): gradients are the same with activation checkpointing and under torch.compile as
in plain eager mode; micro-batch accumulation equals one big batch; the checkpoint manager keeps the newest N, never
deletes the file it just wrote, and falls back past a damaged newest file; the fine-tuning loop learns and logs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import SEQ, VOCAB

from bert_recipe.finetuning import recipe
from bert_recipe.io import checkpoint_io
from bert_recipe.training import dist_env, meter, parallelize, train_step
from modeling import BertConfig, BertForPreTraining, set_execution


def tiny_model(dropout: float = 0.0) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
    )


def batch_of(n: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[n // 2 :, SEQ // 2 :] = 0  # half the rows padded
    labels = torch.full_like(ids, -1)
    labels[:, 3 : SEQ // 2 : 4] = ids[:, 3 : SEQ // 2 : 4]
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "masked_lm_labels": labels,
        "next_sentence_labels": torch.randint(0, 2, (n,), generator=g),
    }


def loss_fn(model, batch):
    out = model(**batch)
    return torch.stack([out.loss, out.mlm_loss, out.nsp_loss])


def grads(model, batches, precision, accum=1) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    for batch in batches:
        train_step.forward_backward(model, batch, loss_fn, precision, accum, sync=True)
    return {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a, b, atol):
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, worst


@pytest.fixture
def fp32():
    model, precision = parallelize.apply_parallelism_and_precision(tiny_model(), dist_env.DistEnv(), "fp32")
    return precision


def test_activation_checkpointing_gives_the_same_gradients(fp32):
    """With dropout on: the recomputed forward must draw the same dropout masks (RNG state preserved)."""
    plain = tiny_model(dropout=0.1).train()
    checkpointed = tiny_model(dropout=0.1).train()
    checkpointed, _ = parallelize.apply_parallelism_and_precision(
        checkpointed, dist_env.DistEnv(), "fp32", checkpoint_activations=True
    )
    assert checkpointed.bert.encoder.checkpoint_activations
    batch = batch_of(8)
    torch.manual_seed(5)
    a = grads(plain, [batch], fp32)
    torch.manual_seed(5)
    b = grads(checkpointed, [batch], fp32)
    assert_same_grads(a, b, atol=1e-6)


@pytest.mark.parametrize("unpad", ["never", "always"])
@pytest.mark.parametrize("scope", ["layers", "model"])
def test_compiled_model_gives_the_same_gradients(fp32, monkeypatch, scope, unpad):
    """--compile: by default each encoder layer, the embeddings and the masked-LM head are compiled in place
    (regional compilation: one graph serves every layer); --compile_scope model wraps the whole model after DDP.
    Either is traced by Dynamo and differentiated by AOT autograd with the gradients of eager mode, on the padded
    and on the unpadded path (whose layers see [T, H] with T changing from batch to batch: recompiled once with T
    symbolic, then no more). The backend here is aot_eager (seconds, not a minute of C++ builds on 2 cores);
    inductor's own numerics are checked once, with fullgraph=True, in tests/test_padding.py."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    eager = set_execution(tiny_model().train(), unpad=unpad)
    bare = set_execution(tiny_model().train(), unpad=unpad)
    compiled, _ = parallelize.apply_parallelism_and_precision(
        bare, dist_env.DistEnv(), "fp32", compile=True, compile_scope=scope
    )
    assert parallelize.compiled(compiled) == scope and parallelize.compiled(eager) is None
    assert hasattr(compiled, "_orig_mod") == (scope == "model")
    assert list(dict(compiled.named_parameters())) == [n for n, _ in eager.named_parameters()] or scope == "model"
    for n, seed in ((8, 1), (6, 2), (4, 3)):  # three batches of other real-token counts
        batch = batch_of(n, seed)
        assert_same_grads(grads(eager, [batch], fp32), grads(compiled, [batch], fp32), atol=1e-4)
    if scope == "layers":  # 3 regions, each compiled at most twice (static, then T symbolic) over 3 batches
        assert 3 <= counters["stats"]["unique_graphs"] <= 6, dict(counters["stats"])
    torch._dynamo.reset()


def test_compile_is_on_by_default_only_on_gpus_and_takes_its_mode(monkeypatch):
    """compile=None (run_pretraining.py without --compile or --no_compile): eager on the CPU; True compiles with
    the mode asked for (reduce-overhead: CUDA graphs), passed to torch.compile as is, for every region or for the
    whole model."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    parallelize.apply_parallelism_and_precision(tiny_model(), dist_env.DistEnv(), "fp32", compile=None)
    assert calls == []
    parallelize.apply_parallelism_and_precision(
        tiny_model(), dist_env.DistEnv(), "fp32", compile=True, compile_mode="reduce-overhead", compile_scope="model"
    )
    parallelize.apply_parallelism_and_precision(
        tiny_model(), dist_env.DistEnv(), "fp32", compile=True, compile_scope="model"
    )
    assert calls == [{"mode": "reduce-overhead"}, {}]
    calls.clear()
    parallelize.apply_parallelism_and_precision(
        tiny_model(), dist_env.DistEnv(), "fp32", compile=True, compile_mode="reduce-overhead"
    )
    assert calls == [{"mode": "reduce-overhead"}] * 4  # embeddings, 2 layers, the masked-LM head
    with pytest.raises(ValueError, match="compile_scope"):
        parallelize.apply_parallelism_and_precision(
            tiny_model(), dist_env.DistEnv(), "fp32", compile=True, compile_scope="heads"
        )


def test_accumulating_two_halves_equals_one_batch(fp32):
    """Every row holds the same number of labelled positions, so the mean of the two halves' mean losses is the
    whole batch's mean loss: the accumulated gradient must equal the big batch's."""
    model = tiny_model().train()
    batch = batch_of(8)
    halves = [{k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()}]
    assert_same_grads(grads(model, [batch], fp32), grads(model, halves, fp32, accum=2), atol=1e-6)


def test_checkpoint_manager_keeps_newest_and_falls_back(tmp_path):
    logged = []
    manager = checkpoint_io.CheckpointManager(tmp_path, keep=2, log=logged.append)
    for step in (1, 2, 3):
        manager.save(step, {"model": {}, "step": step})
    assert list(manager.all()) == [2, 3]  # the oldest went
    (tmp_path / "ckpt_3.pt").write_bytes(b"\x00 truncated")
    assert manager.newest_readable({"model", "step"})["step"] == 2
    assert any("ckpt_3.pt was refused" in line and "trying an older one" in line for line in logged)
    # Files numbered above a new run's step (an abandoned future) never push the file just written out.
    (tmp_path / "ckpt_9.pt").write_bytes(b"junk")
    manager.save(4, {"step": 4})
    assert 4 in manager.all()
    (tmp_path / ".ckpt_5.pt.abc.tmp").write_bytes(b"partial")
    manager.remove_interrupted_writes()
    assert not list(tmp_path.glob(".ckpt_*"))


def fit_parts(model: torch.nn.Module, tmp_path, lr: float):
    """What fit() needs beside the model and its batches: fp32 on this CPU, plain SGD at a constant rate, a log."""
    env = dist_env.DistEnv()
    _, precision = parallelize.apply_parallelism_and_precision(model, env, "fp32")
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    logger = meter.RunLogger(tmp_path / "log.json", None, enabled=True, progress=False)
    return env, precision, optimizer, scheduler, logger


def cross_entropy(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])


def test_fit_learns_and_logs_on_the_device(tmp_path):
    """A linear classifier trained by fit() with accumulation: the loss falls, every log line has the shared keys,
    and the step count follows epochs, batches and accumulation."""

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    batches = [{"input_ids": x[i : i + 8], "labels": y[i : i + 8]} for i in range(0, 64, 8)]  # 8 micro-batches
    model = Linear()
    env, precision, optimizer, scheduler, logger = fit_parts(model, tmp_path, lr=0.5)
    total = recipe.count_optimizer_steps(len(batches), accumulation=3, epochs=2, max_steps=-1)
    assert total == 6  # ceil(8 / 3) = 3 steps an epoch (the last one of 2 micro-batches)
    watch = recipe.fine_tuning_watch(env.device)
    rule = train_step.StepRule(model, cross_entropy, optimizer, scheduler, precision, watch)
    result = recipe.fit(rule, lambda epoch: batches, env, logger, total_steps=total, accumulation=3, log_freq=2)
    logger.close()
    records = [json.loads(line) for line in (tmp_path / "log.json").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert all({"loss", "learning_rate", "epoch", "loss_scale"} <= r["data"].keys() for r in records)
    assert records[-1]["data"]["loss"] < records[0]["data"]["loss"]
    assert result.steps == 6 and result.sequences == 2 * 64 and result.loss == records[-1]["data"]["loss"]


@pytest.mark.parametrize("every_step", [True, False], ids=["cpu-checks-every-step", "gpu-checks-at-log-steps"])
def test_fit_stops_at_a_non_finite_loss(tmp_path, every_step):
    """A NaN in the third micro-batch makes step 3's loss NaN: fit raises DivergedError naming step 3. Read every
    step (the CPU's way), the NaN gradients never reach the weights; read at log steps (the GPU's way: no host
    sync per step) it is still step 3 that is named, at the log step after it."""
    torch.manual_seed(0)
    x = torch.randn(40, 4)
    x[16] = float("nan")  # micro-batch 3 of 8 rows
    y = (x[:, 0] > 0).long()
    batches = [{"input_ids": x[i : i + 8], "labels": y[i : i + 8]} for i in range(0, 40, 8)]
    model = torch.nn.Linear(4, 2)
    env, precision, optimizer, scheduler, logger = fit_parts(model, tmp_path, lr=0.1)

    watch = recipe.fine_tuning_watch(env.device)
    watch.every_step = every_step  # the device decides it; here the test does
    rule = train_step.StepRule(model, cross_entropy, optimizer, scheduler, precision, watch)
    with pytest.raises(train_step.DivergedError, match="non-finite at fine-tuning step 3:"):
        recipe.fit(rule, lambda epoch: batches, env, logger, total_steps=5, accumulation=1, log_freq=2)
    logger.close()
    if every_step:
        assert all(torch.isfinite(p).all() for p in model.parameters())
    else:  # step 3 was taken before the log step read the flag at step 4
        assert not all(torch.isfinite(p).all() for p in model.parameters())


def overflowing_fit_parts(tmp_path, loss_scale: float, init_loss_scale: float):
    """fp16 parts whose scaled gradients overflow: the linear layer's backward runs in fp16 under autocast, whose
    largest value is 65504, and inputs of size ~100 make its weight gradients large, so a loss scale much above
    2^10 makes them inf."""
    torch.manual_seed(0)
    x = torch.randn(64, 4) * 100
    y = (x[:, 0] > 0).long()
    batches = [{"input_ids": x[i : i + 8], "labels": y[i : i + 8]} for i in range(0, 64, 8)]
    model = torch.nn.Linear(4, 2)
    env = dist_env.DistEnv()
    _, precision = parallelize.apply_parallelism_and_precision(
        model, env, "fp16", loss_scale=loss_scale, init_loss_scale=init_loss_scale
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    logger = meter.RunLogger(tmp_path / "log.json", None, enabled=True, progress=False)
    return model, batches, env, precision, optimizer, scheduler, logger


def test_fit_counts_the_optimizer_steps_taken(tmp_path):
    """fp16 with a dynamic loss scale of 2^24: the first steps overflow and are skipped (the scale halves each
    time, the schedule does not move), so --max_steps counts updates: fit takes exactly total_steps of them, and
    consumes one accumulation group more for each skip."""
    model, batches, env, precision, optimizer, scheduler, logger = overflowing_fit_parts(tmp_path, 0.0, 2.0**24)
    consumed = []

    def epoch_batches(epoch):
        for b in batches:
            consumed.append(b)
            yield b

    watch = recipe.fine_tuning_watch(env.device)
    rule = train_step.StepRule(model, cross_entropy, optimizer, scheduler, precision, watch)
    result = recipe.fit(rule, epoch_batches, env, logger, total_steps=6, accumulation=2, log_freq=3)
    logger.close()
    skipped = round(math.log2(2.0**24 / precision.loss_scale))  # a dynamic scale halves once per skip
    assert skipped >= 1 and result.steps == rule.taken == 6 and scheduler.last_epoch == 6
    assert len(consumed) == 2 * (6 + skipped)
    assert [json.loads(line)["step"] for line in (tmp_path / "log.json").read_text().splitlines()] == [3, 6]


def test_fit_stops_after_too_many_overflows_in_a_row(tmp_path):
    """A static loss scale of 1e38 overflows at every step: after StepRule.MAX_CONSECUTIVE_OVERFLOWS skipped steps
    the next one ends the run with one line, the weights untouched."""
    model, batches, env, precision, optimizer, scheduler, logger = overflowing_fit_parts(tmp_path, 1e38, 2.0**16)
    before = [p.detach().clone() for p in model.parameters()]
    watch = recipe.fine_tuning_watch(env.device)
    rule = train_step.StepRule(model, cross_entropy, optimizer, scheduler, precision, watch)
    limit = train_step.StepRule.MAX_CONSECUTIVE_OVERFLOWS
    with pytest.raises(train_step.DivergedError, match=f"{limit} fp16 overflows in a row at step 1: the loss diverged"):
        recipe.fit(rule, lambda epoch: batches, env, logger, total_steps=3, accumulation=1, log_freq=1)
    logger.close()
    assert rule.taken == 0 and rule.consecutive_skips == limit + 1 and scheduler.last_epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
