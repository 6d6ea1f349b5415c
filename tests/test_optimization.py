"""NVLAMB and BertAdam against their algorithms written out step by step, per tensor, in float64.

The reference below is deliberately naive (one tensor at a time, the formulas of the issue verbatim) and shares no
code with optimization.py.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from optimization import NVLAMB, BertAdam, make_lamb, param_groups_for_bert, small_batch_learning_rate

B1, B2, EPS, MAX_NORM = 0.9, 0.999, 1e-6, 1.0
STEPS = 50
CLIP_STEPS = {3, 17, 31}  # steps whose gradients are scaled up so that the global clip triggers
NONE_GRAD_STEPS = {4, 5, 20, 21, 22, 40}  # steps where "sometimes" gets no gradient


# --------------------------------------------------------------------------------------------------------------
# A small parameter set in two groups, with an all-zero tensor, a tensor whose gradient is always zero, and a tensor
# that has no gradient on some steps.


def make_params(dtype=torch.float64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "w1": (16, 8),
        "w2": (8, 4),
        "zeros": (5, 3),
        "dead": (6,),
        "sometimes": (7, 2),  # decay group
        "b1": (16,),
        "ln": (8,),
    }  # no-decay group
    params = {
        name: (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5).to(dtype) for name, shape in shapes.items()
    }
    params["zeros"].zero_()  # ||p|| = 0 on the first step: r must be 1
    params["dead"].zero_()  # zero p and zero grads: ||u|| = 0 on every step: r must be 1, p stays 0
    return {name: p.requires_grad_(True) for name, p in params.items()}


DECAY = ["w1", "w2", "zeros", "dead", "sometimes"]
NO_DECAY = ["b1", "ln"]


def grads_for_step(step: int, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """Deterministic gradients for 1-based `step`: small (G < 1) except on CLIP_STEPS (G >> 1)."""
    gen = torch.Generator().manual_seed(1000 + step)
    scale = 30.0 if step in CLIP_STEPS else 0.02
    grads = {name: torch.randn(p.shape, generator=gen, dtype=torch.float64) * scale for name, p in params.items()}
    grads["dead"].zero_()
    if step in NONE_GRAD_STEPS:
        grads["sometimes"] = None
    return grads


def lr_for_step(step: int, group: int) -> float:
    # A changing LR per group, as a scheduler would set it.
    return (0.01 if group == 0 else 0.003) * (1.0 + 0.5 * math.sin(step))


# --------------------------------------------------------------------------------------------------------------
# The reference: the six steps of the issue, per tensor, float64.


def reference_lamb(
    steps: int, weight_decays: tuple[float, float], use_nvlamb: bool, max_grad_norm: float | None = MAX_NORM
) -> tuple[dict[str, torch.Tensor], list[float]]:
    params = {k: v.detach().clone().double() for k, v in make_params().items()}
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    t = {k: 0 for k in params}
    global_norms = []
    for step in range(1, steps + 1):
        grads = {k: g for k, g in grads_for_step(step, params).items() if g is not None}
        # 1. global norm over all gradients of both groups together
        G = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        global_norms.append(G)
        if max_grad_norm is not None and G > max_grad_norm:
            grads = {k: g / (G / max_grad_norm) for k, g in grads.items()}
        for group, names in enumerate((DECAY, NO_DECAY)):
            wd, lr = weight_decays[group], lr_for_step(step, group)
            for k in names:
                if k not in grads:
                    continue  # no gradient: no step for this tensor, its t does not move
                g = grads[k]
                t[k] += 1
                m[k] = B1 * m[k] + (1 - B1) * g  # 2.
                v[k] = B2 * v[k] + (1 - B2) * g * g
                m_hat = m[k] / (1 - B1 ** t[k])  # 3.
                v_hat = v[k] / (1 - B2 ** t[k])
                u = m_hat / (torch.sqrt(v_hat) + EPS) + wd * params[k]  # 4.
                r = 1.0  # 5.
                if use_nvlamb or wd != 0:
                    p_norm, u_norm = float(params[k].norm()), float(u.norm())
                    if p_norm > 0 and u_norm > 0:
                        r = p_norm / u_norm
                params[k] = params[k] - lr * r * u  # 6.
    return params, global_norms


def run_nvlamb(
    steps: int,
    weight_decays: tuple[float, float],
    use_nvlamb: bool,
    dtype=torch.float64,
    start: tuple[dict, dict] | None = None,
    first_step: int = 1,
    max_grad_norm: float | None = MAX_NORM,
    fused: bool | None = None,
):
    """Run NVLAMB from step `first_step` to `steps`; `start` = (params, optimizer state_dict) to resume from."""
    params = make_params(dtype)
    if start is not None:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(start[0][k])
    groups = [
        {"params": [params[k] for k in DECAY], "weight_decay": weight_decays[0]},
        {"params": [params[k] for k in NO_DECAY], "weight_decay": weight_decays[1]},
    ]
    opt = NVLAMB(
        groups, lr=0.0, betas=(B1, B2), eps=EPS, max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb, fused=fused
    )
    if start is not None:
        opt.load_state_dict(start[1])
    norms = []
    for step in range(first_step, steps + 1):
        for k, g in grads_for_step(step, params).items():
            params[k].grad = None if g is None else g.to(dtype)
        for i, group in enumerate(opt.param_groups):
            group["lr"] = lr_for_step(step, i)
        opt.step()
        norms.append(float(opt.last_grad_norm))
    return params, opt, norms


def assert_params_close(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], rtol: float) -> None:
    for k, r in ref.items():
        o = ours[k].detach().double()
        scale = float(r.abs().max())
        err = float((o - r).abs().max())
        assert err <= rtol * max(scale, 1e-30) or err == 0.0, f"{k}: max error {err:.3e}, max |p| {scale:.3e}"


# --------------------------------------------------------------------------------------------------------------


# fused=None: torch's fused Adam kernel for the Adam part (the default on CPU); fused=False: foreach ops only.
@pytest.mark.parametrize("fused", [None, False])
def test_nvlamb_matches_written_out_algorithm_fp64(fused):
    ours, opt, norms = run_nvlamb(STEPS, (0.01, 0.0), use_nvlamb=False, fused=fused)
    ref, ref_norms = reference_lamb(STEPS, (0.01, 0.0), use_nvlamb=False)
    assert_params_close(ours, ref, rtol=1e-6)
    # The clip really happened on CLIP_STEPS and only there; G is reported before clipping.
    assert norms == pytest.approx(ref_norms, rel=1e-9)
    assert all((n > MAX_NORM) == (i + 1 in CLIP_STEPS) for i, n in enumerate(norms))
    # The dead tensor (zero p, zero grads: ||u|| = 0) kept r = 1 and stayed exactly 0; "zeros" moved off 0.
    assert torch.count_nonzero(ours["dead"]) == 0
    assert torch.count_nonzero(ours["zeros"]) == ours["zeros"].numel()
    # Per-parameter step counts: only steps actually taken.
    assert float(opt.state[ours["w1"]]["step"]) == STEPS
    assert float(opt.state[ours["sometimes"]]["step"]) == STEPS - len(NONE_GRAD_STEPS)


@pytest.mark.parametrize("fused", [None, False])
def test_nvlamb_fp32_close_to_fp64_reference(fused):
    ours, _, _ = run_nvlamb(STEPS, (0.01, 0.0), use_nvlamb=False, dtype=torch.float32, fused=fused)
    ref, _ = reference_lamb(STEPS, (0.01, 0.0), use_nvlamb=False)
    assert all(p.dtype == torch.float32 for p in ours.values())
    assert_params_close(ours, ref, rtol=1e-5)


@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_use_nvlamb_switches_trust_ratio_for_zero_decay_group(use_nvlamb):
    ours, _, _ = run_nvlamb(5, (0.01, 0.0), use_nvlamb=use_nvlamb)
    ref, _ = reference_lamb(5, (0.01, 0.0), use_nvlamb=use_nvlamb)
    assert_params_close(ours, ref, rtol=1e-6)
    # And the two settings really differ on the weight_decay=0 group (trust ratio on vs r = 1) ...
    other, _ = reference_lamb(5, (0.01, 0.0), use_nvlamb=not use_nvlamb)
    for k in NO_DECAY:
        assert not torch.allclose(ours[k].double(), other[k], rtol=1e-3, atol=0)
    # ... but not on the decayed group before the groups interact: step 1 of w1 is the same either way.
    one_a, _, _ = run_nvlamb(1, (0.01, 0.0), use_nvlamb=use_nvlamb)
    one_b, _ = reference_lamb(1, (0.01, 0.0), use_nvlamb=not use_nvlamb)
    torch.testing.assert_close(one_a["w1"].double(), one_b["w1"], rtol=1e-12, atol=0)


@pytest.mark.parametrize("fused", [None, False])
def test_nvlamb_without_clipping_and_with_decay_everywhere(fused):
    ours, _, _ = run_nvlamb(10, (0.05, 0.02), use_nvlamb=False, max_grad_norm=None, fused=fused)
    ref, _ = reference_lamb(10, (0.05, 0.02), use_nvlamb=False, max_grad_norm=None)
    assert_params_close(ours, ref, rtol=1e-6)


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("step", [2, 3])  # step 3 clips, step 2 does not
def test_nvlamb_leaves_clipped_gradients_in_grad(fused, step):
    params = make_params()
    opt = NVLAMB([{"params": list(params.values())}], fused=fused)
    grads = grads_for_step(step, params)
    for k, g in grads.items():
        params[k].grad = None if g is None else g.clone()
    opt.step()
    G = math.sqrt(sum(float((g * g).sum()) for g in grads.values() if g is not None))
    assert (G > MAX_NORM) == (step in CLIP_STEPS)
    assert float(opt.last_grad_norm) == pytest.approx(G, rel=1e-12)
    for k, g in grads.items():
        if g is not None:  # exactly what torch.nn.utils.clip_grad_norm_ would leave (without its +1e-6)
            torch.testing.assert_close(params[k].grad, g / max(G / MAX_NORM, 1.0), rtol=1e-7, atol=0)


@pytest.mark.parametrize("fused", [None, False])
def test_state_dict_round_trip_resumes_exactly(tmp_path, fused):
    full, _, _ = run_nvlamb(30, (0.01, 0.0), use_nvlamb=False, fused=fused)
    half, opt, _ = run_nvlamb(15, (0.01, 0.0), use_nvlamb=False, fused=fused)
    path = tmp_path / "opt.pt"
    torch.save({"params": {k: p.detach() for k, p in half.items()}, "optimizer": opt.state_dict()}, path)
    saved = torch.load(path, weights_only=True)
    step_state = saved["optimizer"]["state"][0]["step"]
    assert isinstance(step_state, torch.Tensor) and float(step_state) == 15
    resumed, _, _ = run_nvlamb(
        30, (0.01, 0.0), use_nvlamb=False, start=(saved["params"], saved["optimizer"]), first_step=16, fused=fused
    )
    for k in full:
        assert torch.equal(resumed[k], full[k]), k


def test_nvlamb_rejects_bad_arguments():
    p = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="max_grad_norm"):
        NVLAMB(p, max_grad_norm=0.0)
    with pytest.raises(ValueError, match="betas"):
        NVLAMB(p, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="weight_decay"):
        NVLAMB(p, weight_decay=-1.0)


def test_make_lamb_falls_back_to_nvlamb_without_apex_or_cuda():
    opt = make_lamb([nn.Parameter(torch.zeros(2))], lr=0.1, prefer_fused=True)
    assert isinstance(opt, NVLAMB)


# --------------------------------------------------------------------------------------------------------------
# BertAdam.


def _adam_params(seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float64)) for shape in ((6, 5), (5,), (3,))]


def _adam_grads(step: int, params) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(500 + step)
    scale = 10.0 if step % 3 == 0 else 0.05  # every third step is clipped
    return [torch.randn(p.shape, generator=gen, dtype=torch.float64) * scale for p in params]


@pytest.mark.parametrize("fused", [None, False])
def test_bert_adam_matches_torch_adamw_with_global_clip(fused):
    ours, ref = _adam_params(), _adam_params()

    def groups(ps):
        return [{"params": ps[:1], "weight_decay": 0.01}, {"params": ps[1:], "weight_decay": 0.0}]

    opt = BertAdam(groups(ours), lr=1e-2, eps=1e-6, max_grad_norm=1.0, fused=fused)
    ref_opt = torch.optim.AdamW(groups(ref), lr=1e-2, eps=1e-6, foreach=False)
    for step in range(1, 13):
        grads = _adam_grads(step, ours)
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        # The global clip written out (torch.nn.utils.clip_grad_norm_ would add 1e-6 to G in its denominator).
        G = math.sqrt(sum(float((q.grad * q.grad).sum()) for q in ref))
        if G > 1.0:
            for q in ref:
                q.grad /= G / 1.0
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)


def test_bert_adam_without_bias_correction_is_the_original_update():
    ours = _adam_params()
    ref = [p.detach().clone() for p in ours]
    m = [torch.zeros_like(p) for p in ref]
    v = [torch.zeros_like(p) for p in ref]
    opt = BertAdam(ours, lr=1e-2, weight_decay=0.01, max_grad_norm=None, bias_correction=False)
    for step in range(1, 6):
        grads = _adam_grads(step, ours)
        for p, g in zip(ours, grads):
            p.grad = g
        opt.step()
        for i, g in enumerate(grads):  # pytorch-pretrained-bert's BertAdam, written out
            m[i] = B1 * m[i] + (1 - B1) * g
            v[i] = B2 * v[i] + (1 - B2) * g * g
            ref[i] = ref[i] - 1e-2 * (m[i] / (v[i].sqrt() + 1e-6) + 0.01 * ref[i])
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.detach(), q, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------------------------------------------
# Weight-decay groups.


class _TinyBert(nn.Module):
    """Hugging Face-like names, a tied decoder weight and a frozen parameter."""

    def __init__(self):
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(11, 4)
        self.embeddings.LayerNorm = nn.LayerNorm(4)
        self.encoder = nn.Module()
        layer = nn.Module()
        layer.attention = nn.Module()
        layer.attention.query = nn.Linear(4, 4)
        layer.output = nn.Module()
        layer.output.dense = nn.Linear(4, 4)
        layer.output.LayerNorm = nn.LayerNorm(4)
        self.encoder.layer = nn.ModuleList([layer])
        self.cls = nn.Module()
        self.cls.decoder = nn.Linear(4, 11, bias=False)
        self.cls.decoder.weight = self.embeddings.word_embeddings.weight  # tied
        self.cls.bias = nn.Parameter(torch.zeros(11))
        self.frozen = nn.Parameter(torch.zeros(3), requires_grad=False)


def test_param_groups_for_bert():
    model = _TinyBert()
    groups = param_groups_for_bert(model, weight_decay=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = sorted(names[id(p)] for p in groups[0]["params"])
    no_decay = sorted(names[id(p)] for p in groups[1]["params"])
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
    assert decay == [
        "embeddings.word_embeddings.weight",
        "encoder.layer.0.attention.query.weight",
        "encoder.layer.0.output.dense.weight",
    ]
    assert no_decay == [
        "cls.bias",
        "embeddings.LayerNorm.bias",
        "embeddings.LayerNorm.weight",
        "encoder.layer.0.attention.query.bias",
        "encoder.layer.0.output.LayerNorm.bias",
        "encoder.layer.0.output.LayerNorm.weight",
        "encoder.layer.0.output.dense.bias",
    ]
    # The tied weight appears once, and the groups load straight into the optimizers.
    all_params = groups[0]["params"] + groups[1]["params"]
    assert len({id(p) for p in all_params}) == len(all_params) == 10
    NVLAMB(groups)
    BertAdam(groups)


def test_state_survives_serialisation_with_param_groups(tmp_path):
    """The group hyper-parameters (betas tuple, use_nvlamb) load back with weights_only=True as well."""
    model = _TinyBert()
    opt = NVLAMB(param_groups_for_bert(model, 0.01), lr=1e-3)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    fresh = NVLAMB(param_groups_for_bert(model, 0.01), lr=1e-3)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.param_groups[0]["betas"] == (B1, B2)
    for p in fresh.state:
        assert torch.equal(fresh.state[p]["exp_avg"], opt.state[p]["exp_avg"])


@pytest.mark.parametrize("fused", [None, False])
def test_bf16_params_stay_finite_and_close(fused):
    """bf16 parameters and state (norms accumulate in fp32): finite, and close to the fp64 reference."""
    dtype = torch.bfloat16
    ours, _, _ = run_nvlamb(10, (0.01, 0.0), use_nvlamb=False, dtype=dtype, fused=fused)
    ref, _ = reference_lamb(10, (0.01, 0.0), use_nvlamb=False)
    for k, r in ref.items():
        o = ours[k].detach().double()
        assert ours[k].dtype == dtype and torch.isfinite(o).all(), k
        assert float((o - r).abs().max()) <= 0.02 * max(float(r.abs().max()), 1e-3), k


def test_small_batch_learning_rate_rule_gives_the_written_out_numbers():
    """1e-2 at 32 sequences a step, times the square root of the batch ratio: 64 -> 1e-2 * sqrt(2) = 0.014142,
    128 -> 2e-2, 256 -> 1e-2 * sqrt(8) = 0.028284, 8 -> 5e-3."""
    for batch, lr in ((32, 0.01), (64, 0.0141421356), (128, 0.02), (256, 0.0282842712), (8, 0.005)):
        assert small_batch_learning_rate(batch) == pytest.approx(lr, rel=1e-8), batch
    with pytest.raises(ValueError, match="at least 1"):
        small_batch_learning_rate(0)
