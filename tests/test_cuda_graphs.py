"""What replaying steps as CUDA graphs needs (bert_recipe/training/cuda_graphs.py), checked on the CPU.

The step rule with stable gradient buffers (the graph path) accumulates the same gradients as the plain rule, bit for
bit in fp32, over 4 micro-batches of different padding, and keeps every `.grad` in the same memory from step to step
(what a graph replay needs: pytorch#169545); evaluation between steps runs compiled layers eagerly; and a
pre-training run in reduce-overhead mode (here compiled with aot_eager, where no graph exists) trains, evaluates and
reports its graph skips. The static-shape layout itself is tested in tests/test_padding.py."""

from __future__ import annotations

import torch
from helpers import args_for, make_shards, read_log, write_config
from test_train_step import batch_of, loss_fn, tiny_model

import run_pretraining as rp
from bert_recipe.training import cuda_graphs, dist_env, parallelize, train_step


class Schedule:
    def step(self):
        pass


def rule_for(model, stable: bool) -> train_step.StepRule:
    _, precision = parallelize.apply_parallelism_and_precision(model, dist_env.DistEnv(), "fp32")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = train_step.DivergenceWatch(torch.device("cpu"), "step", "", "")
    return train_step.StepRule(model, loss_fn, optimizer, Schedule(), precision, watch, stable_grads=stable)


def test_stable_gradient_buffers_accumulate_the_same_gradients_in_the_same_memory():
    batches = [batch_of(n, seed) for n, seed in ((8, 1), (6, 2), (4, 3), (8, 4))]  # 4 micro-batches
    seen = {}
    for stable in (False, True):
        model = tiny_model(dropout=0.1).train()
        rule = rule_for(model, stable)
        steps = []

        def record(model=model, steps=steps):
            steps.append({n: (p.grad.clone(), p.grad.data_ptr()) for n, p in model.named_parameters()})

        for step in range(2):
            torch.manual_seed(10 + step)  # the same dropout draws for both rules
            rule(iter(batches), accum=4, number=step + 1, before_update=record)
        seen[stable] = steps
        if stable:  # zeroed in place after the step, never freed
            assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    for step in range(2):
        plain, graph = seen[False][step], seen[True][step]
        assert plain.keys() == graph.keys()
        for name in plain:
            assert torch.equal(plain[name][0], graph[name][0]), (step, name)  # bit for bit
    first, second = seen[True]
    assert all(first[n][1] == second[n][1] for n in first)  # every .grad kept its memory across the steps


def test_evaluation_between_graph_steps_runs_compiled_layers_eagerly():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = tiny_model().eval()
    counter = CompileCounter()
    for layer in model.bert.encoder.layer:
        layer.compile(backend=counter)
    batch = batch_of(4)
    with torch.no_grad(), cuda_graphs.without_graphs():
        inside = model(**batch).loss
    assert counter.frame_count == 0
    with torch.no_grad():
        outside = model(**batch).loss
    assert counter.frame_count == 1 and torch.equal(inside, outside)
    torch._dynamo.reset()


def test_a_reduce_overhead_run_trains_evaluates_and_reports_its_graph_skips(tmp_path):
    """run_pretraining.py --compile --compile_mode reduce-overhead (aot_eager: no graph on a CPU) with accumulation,
    the static layout and an evaluation between steps: it finishes, its held-out numbers are logged, and FINAL says
    how many regions ran without graphs (0: nothing was skipped, there was nothing to record)."""
    data = make_shards(tmp_path / "data")
    config = write_config(tmp_path / "config.json", dropout=0.1)
    extra = ["--compile", "--compile_backend", "aot_eager", "--compile_mode", "reduce-overhead"]
    extra += ["--static_token_granule", "16", "--gradient_accumulation_steps", "2", "--train_batch_size", "8"]
    extra += ["--eval_dir", str(data), "--eval_steps", "2", "--max_steps", "3", "--precision", "fp32"]
    assert rp.main(args_for(data, config, tmp_path / "out", *extra)) == 0
    records = read_log(tmp_path / "out" / "log.json")
    final = next(r["data"] for r in records if r["step"] == "FINAL")
    assert final["cudagraph_skips"] == 0
    evaluated = [r["data"] for r in records if r["step"] == 2 and "eval_mlm_loss" in r["data"]]
    assert len(evaluated) == 1 and evaluated[0]["eval_mlm_loss"] > 0
    torch._dynamo.reset()


def test_a_static_layout_without_unpadding_is_refused_in_one_line(tmp_path, capsys):
    data = make_shards(tmp_path / "data")
    config = write_config(tmp_path / "config.json")
    for extra, message in (
        (["--static_token_granule", "16", "--unpad", "never"], "--static_token_granule rounds the unpadded layout"),
        (["--static_token_granule", "-1"], "--static_token_granule -1 must not be negative"),
    ):
        try:
            rp.main(args_for(data, config, tmp_path / "out", *extra))
        except SystemExit as e:
            assert str(e.code).startswith(f"run_pretraining.py: error: {message}") and "\n" not in str(e.code)
        else:
            raise AssertionError(f"{extra} was accepted")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("ckpt_*.pt"))


def test_a_config_file_of_an_earlier_version_runs_and_says_what_it_ignored(tmp_path, capsys):
    """A bert_config.json that still carries execution settings (unpad, dropout_mask_bits) trains; the log names
    them and the flags that replace them; the checkpoint's config holds the architecture only."""
    import json

    data = make_shards(tmp_path / "data")
    config = write_config(tmp_path / "config.json")
    old = {**json.loads(config.read_text()), "unpad": "never", "dropout_mask_bits": 1}
    config.write_text(json.dumps(old))
    assert rp.main(args_for(data, config, tmp_path / "out", "--max_steps", "1", "--precision", "fp32")) == 0
    said = capsys.readouterr()
    assert "dropout_mask_bits, unpad ignored (how a model runs is not its config" in said.out + said.err
    saved = torch.load(tmp_path / "out" / "ckpt_1.pt", map_location="cpu", weights_only=True)["config"]
    assert "unpad" not in saved and "dropout_mask_bits" not in saved
