"""fp8.py: the encoder's feed-forward products in float8 (torchao), checked on the CPU, where torch emulates them.

The forward products are the written-out float8 product (each operand scaled by 448 / its absolute maximum, rounded
to e4m3, multiplied, unscaled), the input's gradient the written-out e5m2-by-e4m3 product, and the weight's gradient
the plain product (no float8 rounding, any token count); attention's products stay plain; the state dict keeps its
names, so an fp8 run's checkpoint loads into the plain model, and its config holds the architecture only; a run's
first loss is the fp32 run's within float8's error; where torchao is missing, --fp8 is one line.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import torchao  # noqa: F401 - requirements-test.txt installs it: without it these tests fail, they do not skip
from helpers import args_for, bert_config, make_shards, read_log, write_config

import run_pretraining as rp
from bert_recipe.io.checkpoint_io import load_checkpoint_state
from bert_recipe.training import fp8
from modeling import BertConfig, BertForPreTraining, set_execution

E4M3_MAX = 448.0  # the largest float8 e4m3fn value
E5M2_MAX = 57344.0  # the largest float8 e5m2 value: gradients


def float8(t: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """t as float8 with one scale for the whole tensor, back in fp32: what the product multiplies."""
    top = E4M3_MAX if dtype == torch.float8_e4m3fn else E5M2_MAX
    scale = top / t.abs().max().clamp(min=1e-12)
    return (t * scale).clamp(-top, top).to(dtype).float() / scale


def converted_model() -> BertForPreTraining:
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config(hidden_size=64, intermediate_size=128, num_attention_heads=4))
    assert fp8.convert(model) == 2 * model.config.num_hidden_layers  # the two feed-forward products a layer
    return model


def test_the_feed_forward_products_are_float8_products_and_attention_stays_plain():
    model = converted_model()
    layer = model.bert.encoder.layer[0]
    x = torch.randn(48, 64) * 3.0  # [T, H]
    h = torch.randn(48, 128) * 2.0  # [T, I]
    with torch.no_grad():
        fc1 = layer.intermediate.dense(x)  # [T, I]
        fc2 = layer.output.dense(h)  # [T, H]
        query = layer.attention.self.query(x)
    for out, inp, dense in ((fc1, x, layer.intermediate.dense), (fc2, h, layer.output.dense)):
        torch.testing.assert_close(out, float8(inp) @ float8(dense.weight).T + dense.bias, rtol=1e-5, atol=1e-5)
        assert (out - (inp @ dense.weight.T + dense.bias)).abs().max() > 1e-3  # the 3-bit mantissa shows
    attention = layer.attention.self
    assert type(attention.query) is type(attention.key) is type(layer.attention.output.dense) is torch.nn.Linear
    torch.testing.assert_close(query, x @ attention.query.weight.T + attention.query.bias, rtol=0, atol=0)


def test_the_weight_gradient_is_a_plain_product_of_any_token_count():
    """The weight's gradient is gy^T x without float8 rounding, over 37 tokens (not a multiple of 16: its inner
    dimension); the input's gradient is e5m2(gy) e4m3(W), the written-out float8 product."""
    dense = converted_model().bert.encoder.layer[0].intermediate.dense
    x = (torch.randn(37, 64) * 3.0).requires_grad_()  # [T, H], T = 37
    gy = torch.randn(37, 128)  # [T, I]
    dense(x).backward(gy)
    torch.testing.assert_close(dense.weight.grad, gy.T @ x.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense.bias.grad, gy.sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        x.grad, float8(gy, torch.float8_e5m2) @ float8(dense.weight.detach()), rtol=1e-5, atol=1e-5
    )
    assert (x.grad - gy @ dense.weight.detach()).abs().max() > 1e-3  # the input's gradient is a float8 product


def test_the_state_dict_keeps_its_names_and_the_gradients_reach_every_weight():
    model = converted_model()
    torch.manual_seed(0)
    plain = BertForPreTraining(model.config)
    assert list(model.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(model.state_dict(), strict=True)
    ids = torch.randint(5, model.config.vocab_size, (4, 24))
    positions = torch.randint(1, 24, (4, 3))
    batch = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        masked_lm_positions=positions,
        masked_lm_ids=torch.randint(5, 100, (4, 3)),
        next_sentence_labels=torch.tensor([0, 1, 0, 1]),
    )
    for m in (model, plain):
        m(**batch).loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    # The float8 gradients point where the fp32 ones do (e5m2 rounding: a few percent of each), in every layer.
    for name, p in plain.named_parameters():
        if ".attention.self.key.bias" in name:  # softmax ignores it: its gradient is rounding noise in both
            continue
        cos = torch.nn.functional.cosine_similarity(grads[name].flatten(), p.grad.flatten(), dim=0)
        assert cos > 0.98, (name, float(cos))


def test_an_fp8_run_starts_where_the_fp32_run_does_and_its_checkpoint_loads_into_the_plain_model(tmp_path):
    data = make_shards(tmp_path / "data")
    config = write_config(tmp_path / "config.json", dropout=0.0, hidden=64)
    losses = {}
    for name, extra in (("fp32", []), ("fp8", ["--fp8"])):
        out = tmp_path / name
        assert (
            rp.main(
                args_for(
                    data,
                    config,
                    out,
                    "--max_steps",
                    "3",
                    "--log_freq",
                    "1",
                    "--precision",
                    "fp32",
                    "--seed",
                    "7",
                    *extra,
                )
            )
            == 0
        )
        losses[name] = [r["data"]["average_loss"] for r in read_log(out / "log.json") if isinstance(r["step"], int)]
    assert abs(losses["fp8"][0] - losses["fp32"][0]) < 0.02 * losses["fp32"][0], losses  # the same first batch
    assert losses["fp8"] != losses["fp32"]  # and not the same arithmetic
    for name in losses:  # the saved config is the architecture: BertConfig's fields, nothing of how it ran
        saved = torch.load(tmp_path / name / "ckpt_3.pt", map_location="cpu", weights_only=True)["config"]
        assert set(saved) <= {f.name for f in dataclasses.fields(BertConfig)}, saved
    state = torch.load(tmp_path / "fp8" / "ckpt_3.pt", map_location="cpu", weights_only=True)["model"]
    plain = BertForPreTraining(BertConfig.from_json_file(config))
    load_checkpoint_state(plain, state)  # raises on any missing or unexpected tensor
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in state.items())


def test_fp8_without_torchao_is_one_line(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    data, config = make_shards(tmp_path / "data"), write_config(tmp_path / "config.json")
    with pytest.raises(SystemExit) as exc:
        rp.main(args_for(data, config, tmp_path / "out", "--fp8", "--precision", "fp32"))
    text = str(exc.value.code)
    assert (
        text == "run_pretraining.py: error: --fp8 needs the torchao package (pip install torchao), which is not "
        "installed"
    ), text
    assert not list((tmp_path / "out").glob("ckpt_*.pt"))  # refused before the first step


def test_check_refuses_where_float8_cannot_run(monkeypatch):
    """--fp8's device checks, each a one-line error that says what to do: a GPU older than compute capability 8.9
    (an A100 is 8.0: no fp8 tensor cores), a device that is neither CUDA nor a CPU; a CPU passes (emulated)."""
    fp8.check(torch.device("cpu"))
    with pytest.raises(fp8.FP8Unavailable, match="not on mps") as exc:
        fp8.check(torch.device("mps"))
    assert "\n" not in str(exc.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(fp8.FP8Unavailable, match=r"8\.9 or newer.*A100-SXM4-80GB has 8\.0: drop --fp8") as exc:
        fp8.check(torch.device("cuda"))
    assert "\n" not in str(exc.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fp8.check(torch.device("cuda"))  # Hopper


def test_an_unpadded_batch_of_any_token_count_trains():
    """The unpadded layout's 37 real tokens go through the float8 products as they are (no rounding of the layout:
    the token count is the inner dimension of no float8 product)."""
    model = converted_model()
    lengths = [5, 24, 8]  # 37 real tokens
    mask = torch.tensor([[1] * n + [0] * (24 - n) for n in lengths])
    ids = torch.randint(5, model.config.vocab_size, (3, 24)) * mask
    batch = dict(
        input_ids=ids,
        attention_mask=mask,
        masked_lm_positions=torch.tensor([[1, 2], [3, 9], [1, 4]]),
        masked_lm_ids=torch.randint(5, 100, (3, 2)),
        next_sentence_labels=torch.tensor([0, 1, 0]),
    )
    set_execution(model, unpad="always")
    rows = []
    model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, a, out: rows.append(a[0].shape[0]))
    model(**batch).loss.backward()
    assert rows == [37]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
