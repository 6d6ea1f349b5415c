"""bert_attention.py: the rules that pick an attention kernel, checked for every combination of what a machine has.

The variable-length kernel rule never picks a dropout-free kernel when dropout is configured, and a kernel named by
--varlen_kernel gives way where it cannot run; the padded path's rule keeps attention dropout at the rate asked for
(on a GPU, a rate that is not a multiple of 1/16 goes to the kernels that apply any rate, never to cuDNN's), and its
restriction, when it applies, changes which kernel runs, not what is computed, and compiles into one graph. The
first use of a kernel is said in one line. Whether a kernel's rate is exact is measured on a GPU by
bench/gpu_speed.py dropout_probe (tests/test_gpu_speed.py runs it on the CPU's kernels)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import bert_config
from torch.nn.attention import SDPBackend

import bert_attention
import modeling
from modeling import BertForPreTraining, set_execution

FLASH, EFFICIENT, CUDNN, MATH = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
)
ALL = frozenset({FLASH, EFFICIENT, CUDNN, MATH})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_rule_never_drops_a_configured_dropout(device, dtype, monkeypatch):
    """The rule, for every combination of what is importable: varlen_attn (no dropout argument) only at dropout 0;
    with dropout, torch's own FlashAttention varlen entry (flash_varlen, which applies it) where the GPU has it,
    else flash_attn's, else SDPA around padding; fp32 and CPUs always pad around SDPA."""
    for torch_flash in (False, True):
        for flash in (False, True):
            monkeypatch.setattr(bert_attention, "_importable", lambda m, flash=flash: m != "flash_attn" or flash)
            monkeypatch.setattr(bert_attention, "_torch_flash_available", lambda tf=torch_flash: tf)
            bert_attention.choose_kernel.cache_clear()
            with_dropout = bert_attention.choose_kernel(device, dtype, 0.1)
            without = bert_attention.choose_kernel(device, dtype, 0.0)
            assert with_dropout.name != "varlen_attn"  # torch's varlen_attn has no dropout argument
            assert with_dropout.reason and "\n" not in with_dropout.reason
            if device == "cpu" or dtype == torch.float32:
                assert with_dropout.name == without.name == "padded_sdpa"
            else:
                assert without.name == "varlen_attn"
                assert with_dropout.name == (
                    "flash_varlen" if torch_flash else "flash_attn" if flash else "padded_sdpa"
                )
    bert_attention.choose_kernel.cache_clear()


def test_the_kernel_rule_carries_torchs_constant_mark_without_importing_dynamo():
    """choose_kernel is marked as torch.compiler.assume_constant_result marks a function (the reference: torch's
    decorator applied to a probe sets these attributes and nothing else), and the scripts start without importing
    torch._dynamo, which that decorator would import (1.6 s at every start on 2 cores)."""

    def probe():
        return None

    assert torch.compiler.assume_constant_result(probe) is probe
    assert vars(probe) and all(getattr(bert_attention.choose_kernel, k, None) == v for k, v in vars(probe).items())
    code = (
        "import sys, modeling, run_pretraining, run_glue, run_squad, run_swag, inference, extract_features; "
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=modeling.__file__.rsplit("/", 1)[0],
    )
    assert out.stdout.strip() == "False"


def test_a_named_kernel_is_used_where_it_can_run_and_gives_way_where_it_cannot(monkeypatch):
    """--varlen_kernel: a kernel named there is taken when this device, dtype and dropout allow it; otherwise the
    rule's choice runs and the reason names what was asked for (a run set up for a GPU still runs on a CPU). Names
    outside the list are refused by set_execution; cuDNN's ragged kernel is not among them."""
    monkeypatch.setattr(bert_attention, "_torch_flash_available", lambda: True)
    bert_attention.choose_kernel.cache_clear()
    assert bert_attention.choose_kernel("cuda", torch.bfloat16, 0.1, "padded_sdpa").name == "padded_sdpa"
    assert bert_attention.choose_kernel("cuda", torch.bfloat16, 0.0, "flash_varlen").name == "flash_varlen"
    gave_way = bert_attention.choose_kernel("cuda", torch.bfloat16, 0.1, "varlen_attn")  # it has no dropout
    assert gave_way.name == "flash_varlen" and "varlen_attn" in gave_way.reason
    on_cpu = bert_attention.choose_kernel("cpu", torch.float32, 0.1, "flash_varlen")
    assert on_cpu.name == "padded_sdpa" and "flash_varlen" in on_cpu.reason
    bert_attention.choose_kernel.cache_clear()
    assert "cudnn_varlen" not in bert_attention.KERNELS
    with pytest.raises(ValueError, match="varlen_kernel 'cudnn_varlen'"):
        set_execution(BertForPreTraining(bert_config()), varlen_kernel="cudnn_varlen")


def test_the_kernel_in_use_is_said_in_one_line(caplog):
    bert_attention._announce.cache_clear()
    model = set_execution(BertForPreTraining(bert_config(vocab_size=50)), unpad="always").eval()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with caplog.at_level(logging.INFO, logger="bert_attention"):
        model(torch.randint(5, 50, (2, 4)) * mask, attention_mask=mask)
    lines = [r.getMessage() for r in caplog.records if r.name == "bert_attention"]
    assert len(lines) == 1 and lines[0].startswith("variable-length attention: padded_sdpa (cpu:"), lines


# ---------------------------------------------------------------------------------------------------------------
# The padded path's dropout rule


@pytest.mark.parametrize("p", [0.0, 0.0625, 0.1, 0.125, 0.15, 0.5])
def test_on_a_gpu_a_rate_cudnn_would_round_goes_to_the_kernels_that_apply_it(p):
    """sdpa_backends for every rate and every set of enabled kernels: a rate that is not a multiple of 1/16 with
    cuDNN enabled gets the enabled kernels among FlashAttention and memory-efficient; a multiple of 1/16 (cuDNN
    applies it exactly), dropout 0 (eval), a CPU, or a caller that enabled neither exact kernel keep torch's choice."""
    rounded = not float(p * 16).is_integer()
    for size in range(1, 5):
        for enabled in {frozenset(s) for s in __import__("itertools").combinations(ALL, size)}:
            got = bert_attention.sdpa_backends("cuda", p, enabled)
            exact = tuple(b for b in (FLASH, EFFICIENT) if b in enabled)
            want = exact if rounded and CUDNN in enabled and exact else None
            assert got == want, (p, sorted(b.name for b in enabled), got)
            assert bert_attention.sdpa_backends("cpu", p, enabled) is None
    assert bert_attention.sdpa_backends("cuda", 0.1, ALL) == (FLASH, EFFICIENT)  # the recipe's 0.1, as configured


def test_the_restriction_changes_the_kernel_not_the_result_and_compiles_into_one_graph(monkeypatch, caplog):
    """Where the rule restricts the kernels (driven here on the CPU's math kernel), the call runs inside
    sdpa_kernel with those kernels, gives what F.scaled_dot_product_attention gives for the same draw, says so once
    in the log, and Dynamo takes the whole padded layer into one graph (fullgraph) with it."""
    from torch._dynamo.testing import CompileCounter

    entered = []
    real_sdpa_kernel = bert_attention.sdpa_kernel
    monkeypatch.setattr(bert_attention, "_backends_for", lambda device, p: (MATH,) if p > 0 else None)
    monkeypatch.setattr(
        bert_attention, "sdpa_kernel", lambda backends: entered.append(backends) or real_sdpa_kernel(backends)
    )
    bert_attention._announce_backends.cache_clear()
    q, k, v = torch.randn(3, 2, 4, 8, 16).unbind(0)  # each [B, N, S, D]
    mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    mask[1, ..., 5:] = False
    with caplog.at_level(logging.INFO, logger="bert_attention"):
        torch.manual_seed(5)
        ours = bert_attention.sdpa(q, k, v, mask, 0.1)
        bert_attention.sdpa(q, k, v, mask, 0.1)
    torch.manual_seed(5)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert entered == [[MATH], [MATH]]
    lines = [r.getMessage() for r in caplog.records if r.name == "bert_attention"]
    assert len(lines) == 1 and "not a multiple of 1/16" in lines[0], lines
    torch._dynamo.reset()
    config = bert_config(vocab_size=50, attention_probs_dropout_prob=0.1)
    model = set_execution(BertForPreTraining(config), unpad="never").train()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    ids = torch.randint(5, 50, (2, 8))
    compiled(ids, attention_mask=(ids > 0).long() * torch.tensor([[1] * 8, [1] * 5 + [0] * 3]))
    assert counter.frame_count == 1 and len(entered) > 2  # traced with the restriction, in one graph
    torch._dynamo.reset()
