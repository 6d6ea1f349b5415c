"""fp8.py: the encoder's matrix products in float8 (torchao), checked on the CPU, where torch emulates them.

The products are the written-out float8 product (each operand scaled by 448 / its absolute maximum, rounded to
e4m3, multiplied, unscaled), for the fused query/key/value projection (our own route through torchao's matmul) and
for a converted Linear layer; the state dict keeps its names, so an fp8 run's checkpoint loads into the plain model;
a run's first loss is the fp32 run's within float8's error; where torchao is missing, --fp8 is one line.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torchao  # noqa: F401 - requirements-test.txt installs it: without it these tests fail, they do not skip
from helpers import args_for, bert_config, make_shards, read_log, write_config

import run_pretraining as rp
from bert_recipe.io.checkpoint_io import load_checkpoint_state
from bert_recipe.training import fp8
from modeling import BertConfig, BertForPreTraining

E4M3_MAX = 448.0  # the largest float8 e4m3fn value


def float8(t: torch.Tensor) -> torch.Tensor:
    """t as float8 e4m3 with one scale for the whole tensor, back in fp32: what the product multiplies."""
    scale = E4M3_MAX / t.abs().max().clamp(min=1e-12)
    return (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() / scale


def converted_model() -> BertForPreTraining:
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config(hidden_size=64, intermediate_size=128, num_attention_heads=4))
    assert fp8.convert(model) == 4 * model.config.num_hidden_layers  # qkv, attention output, both FFN layers
    return model


def test_the_products_are_float8_products():
    model = converted_model()
    layer = model.bert.encoder.layer[0]
    x = torch.randn(48, 64) * 3.0  # [T, H]: T a multiple of 16, as the float8 products need
    attention = layer.attention.self
    weight = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight])  # [3H, H]
    bias = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])
    with torch.no_grad():
        qkv = attention.project_qkv(x, weight, bias)  # [T, 3H]
        ffn = layer.intermediate.dense(x)  # [T, I]
    torch.testing.assert_close(qkv, float8(x) @ float8(weight).T + bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        ffn, float8(x) @ float8(layer.intermediate.dense.weight).T + layer.intermediate.dense.bias, rtol=1e-5, atol=1e-5
    )
    exact = x @ weight.T + bias  # and it is not the fp32 product: the rounding to 3 mantissa bits shows
    assert (qkv - exact).abs().max() > 1e-3


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


def test_a_token_count_not_divisible_by_16_is_refused_and_the_unpadded_layout_is_rounded():
    """torch._scaled_mm needs the token count (the inner dimension of the weight gradient) divisible by 16: on an
    H200 the unpadded layout's 23,332 tokens failed deep inside compilation. A product is refused before it runs,
    naming the rule, and convert() makes the model round its unpadded layout to 16 rows, so a batch of 37 real
    tokens trains."""
    model = converted_model()
    assert model.config.unpad_token_multiple == 16
    with pytest.raises(ValueError, match="divisible by 16, got 40"):
        model.bert.encoder.layer[0].intermediate.dense(torch.randn(40, 64))
    attention = model.bert.encoder.layer[0].attention.self
    weight = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight])
    with pytest.raises(ValueError, match="divisible by 16, got 40"):
        attention.project_qkv(torch.randn(40, 64), weight, None)
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
    model.config.unpad = "always"
    model(**batch).loss.backward()  # 48 rows: 37 real, 11 zero
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.config.unpad_token_multiple = 1  # the layout unrounded: the products refuse it
    with pytest.raises(ValueError, match="divisible by 16, got 37"):
        model(**batch)
