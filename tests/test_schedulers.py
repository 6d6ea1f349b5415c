"""LR schedules against their formulas written out here, and exact continuation after a state_dict round trip."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from optimization import NVLAMB
from schedulers import (
    ConstantWarmUpScheduler,
    CosineWarmUpScheduler,
    LinearWarmUpScheduler,
    PolyWarmUpScheduler,
    get_scheduler,
)

TOTAL, WARMUP = 100, 0.1  # 10 warm-up steps, decay over steps 10..99, LR 0 from step 100 on
BASES = (0.5, 0.02)  # two groups with different base LRs


def expected(name: str, k: int, base: float, degree: float = 0.5) -> float:
    """The LR of optimizer step k (0-based), written out independently for each schedule."""
    warm = WARMUP * TOTAL
    if k >= TOTAL:
        return 0.0
    if k < warm:
        return base * k / warm
    if name == "poly":
        return base * (1 - k / TOTAL) ** degree
    if name == "linear":
        return base * (TOTAL - k) / (TOTAL - warm)
    if name == "constant":
        return base
    if name == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * (k - warm) / (TOTAL - warm)))
    raise AssertionError(name)


def make_optimizer() -> torch.optim.Optimizer:
    params = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))]
    return torch.optim.SGD([{"params": params[:1], "lr": BASES[0]}, {"params": params[1:], "lr": BASES[1]}])


def lrs_over(sched, opt, steps: int) -> list[list[float]]:
    """The LRs the optimizer steps use, one entry per step; the scheduler steps after the optimizer."""
    seen = []
    for _ in range(steps):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()  # no gradients: a no-op, but it keeps the usual call order
        sched.step()
    return seen


@pytest.mark.parametrize("name", ["poly", "linear", "constant", "cosine"])
def test_schedule_values_match_formula(name):
    opt = make_optimizer()
    sched = get_scheduler(name, opt, WARMUP, TOTAL)
    seen = lrs_over(sched, opt, 130)  # past the end, too
    for k, lrs in enumerate(seen):
        for lr, base in zip(lrs, BASES):
            assert lr == pytest.approx(expected(name, k, base), rel=1e-12, abs=1e-15), (name, k)
    # Spot checks: start, inside warm-up, the warm-up boundary, past the end.
    assert seen[0] == [0.0, 0.0]
    assert seen[5][0] == pytest.approx(0.25)
    boundary = {"poly": 0.5 * math.sqrt(0.9), "linear": 0.5, "constant": 0.5, "cosine": 0.5}[name]
    assert seen[10][0] == pytest.approx(boundary)
    assert all(lr == 0.0 for lrs in seen[100:] for lr in lrs)
    assert all(math.isfinite(lr) and lr >= 0 for lrs in seen for lr in lrs)
    assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]


def test_cosine_is_half_base_at_decay_midpoint_and_decreasing():
    opt = make_optimizer()
    sched = CosineWarmUpScheduler(opt, warmup=0.2, total_steps=50)  # decay over steps 10..50: midpoint 30
    seen = [lrs[0] for lrs in lrs_over(sched, opt, 51)]
    assert seen[10] == pytest.approx(0.5)
    assert seen[30] == pytest.approx(0.25)
    assert all(a > b for a, b in zip(seen[10:50], seen[11:50]))
    assert seen[50] == 0.0


def test_poly_degree_and_no_warmup():
    opt = make_optimizer()
    sched = PolyWarmUpScheduler(opt, warmup=0.0, total_steps=20, degree=2.0)
    seen = [lrs[0] for lrs in lrs_over(sched, opt, 25)]
    assert seen == pytest.approx([0.5 * max(0.0, 1 - k / 20) ** 2 for k in range(25)])


def test_full_warmup_then_zero():
    opt = make_optimizer()
    sched = LinearWarmUpScheduler(opt, warmup=1.0, total_steps=10)
    seen = [lrs[0] for lrs in lrs_over(sched, opt, 12)]
    assert seen == pytest.approx([0.05 * k for k in range(10)] + [0.0, 0.0])


@pytest.mark.parametrize(
    "cls", [PolyWarmUpScheduler, LinearWarmUpScheduler, ConstantWarmUpScheduler, CosineWarmUpScheduler]
)
@pytest.mark.parametrize("optimizer_first", [True, False])
def test_state_dict_round_trip_continues_identically(cls, optimizer_first):
    opt = make_optimizer()
    sched = cls(opt, WARMUP, TOTAL)
    uninterrupted = lrs_over(sched, opt, 60)

    opt = make_optimizer()
    sched = cls(opt, WARMUP, TOTAL)
    first = lrs_over(sched, opt, 33)
    buf = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)

    # A fresh process: new optimizer and scheduler, restored in either order.
    opt = make_optimizer()
    if optimizer_first:
        opt.load_state_dict(saved["optimizer"])
        sched = cls(opt, WARMUP, TOTAL)  # construction resets the LR to step 0 ...
        sched.load_state_dict(saved["scheduler"])  # ... and loading puts step 33's LR back
    else:
        sched = cls(opt, WARMUP, TOTAL)
        sched.load_state_dict(saved["scheduler"])
        opt.load_state_dict(saved["optimizer"])
    assert sched.last_epoch == 33
    rest = lrs_over(sched, opt, 27)
    assert first + rest == uninterrupted


@pytest.mark.parametrize("name", ["poly", "constant"])
def test_loading_keeps_this_schedule_and_takes_only_the_step(name):
    """A run extended on resume (total 50 -> 100, rates halved -> BASES): from the saved step on, the LRs are this
    scheduler's written-out curve, not the saved one's (which would be 0 from step 50); changes() names the
    differences."""
    opt = make_optimizer()
    for group in opt.param_groups:
        group["lr"] /= 2
    short = get_scheduler(name, opt, WARMUP, 50)
    lrs_over(short, opt, 50)
    saved = short.state_dict()
    opt = make_optimizer()
    sched = get_scheduler(name, opt, WARMUP, TOTAL)
    assert sched.changes(saved) == {"total_steps": (50, TOTAL), "base_lrs": ([b / 2 for b in BASES], list(BASES))}
    sched.load_state_dict(saved)
    assert sched.last_epoch == 50 and sched.total_steps == TOTAL
    for k, lrs in enumerate(lrs_over(sched, opt, 60), start=50):
        for lr, base in zip(lrs, BASES):
            assert lr == pytest.approx(expected(name, k, base), rel=1e-12, abs=1e-15), (name, k)


def test_bad_arguments():
    opt = make_optimizer()
    with pytest.raises(ValueError, match="unknown scheduler"):
        get_scheduler("step", opt, 0.1, 10)
    with pytest.raises(ValueError, match="warmup"):
        PolyWarmUpScheduler(opt, warmup=10, total_steps=100)  # a step count, not a proportion
    with pytest.raises(ValueError, match="total_steps"):
        CosineWarmUpScheduler(opt, warmup=0.1, total_steps=0)


def test_works_with_nvlamb():

    p = nn.Parameter(torch.ones(4))
    opt = NVLAMB([p], lr=1e-3)
    sched = get_scheduler("poly", opt, 0.5, 4)
    lrs = []
    for _ in range(4):
        p.grad = torch.ones(4)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.0, 0.5e-3, 1e-3 * math.sqrt(0.5), 1e-3 * math.sqrt(0.25)])
