"""Where a fine-tuning run first goes non-finite: run_glue.py's own run, watched after every micro-batch.

    python -m bench.nan_probe --out DIR -- <run_glue.py arguments>

run_glue.py stops a diverged run at the next log step (on a GPU; at once on a CPU) and names the step; this finds
the micro-batch and the cause. It runs run_glue.main in this process with train_step.forward_backward wrapped: after
each micro-batch it reads the loss and every gradient (a host sync per micro-batch: a diagnostic, not a training
run). At the first non-finite one it writes DIR/nan_probe.json (the micro-batch's index, its loss, the parameters
whose gradients are not finite, the sequence lengths) and DIR/bad_batch.pt (the batch and the weights it met, for a
replay on another device), then replays the same batch on the same weights: as run, in fp32, with the encoder's
unpadded path off and on, and on a GPU under each scaled_dot_product_attention backend alone. So the probe says
whether the NaN is the data's, the precision's or one attention kernel's. train_step.optimizer_step is wrapped too:
an update that turns finite weights non-finite from finite gradients is reported instead (`first_bad_update`,
the learning rate, the gradient norm, the parameters hit and their gradients' largest entries), with the weights
before it and the gradients in DIR/bad_update.pt. A run that stays finite to its end writes `"first_bad": null`.

For a NaN seen only on a GPU (bench/STUDIES.md, "Dropout in fine-tuning"): a CPU-pre-trained BERT-mini
fine-tuned on SST-2 in bf16 on an H200 went NaN within 10 steps at every seed, learning rate and dropout tried,
while the same runs in fp32 there, in bf16 on a CPU, and on MRPC stayed finite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

import run_glue
from bert_recipe.io.atomic_io import atomic_torch_save, atomic_write_json
from bert_recipe.io.cli import script_errors
from bert_recipe.training import train_step
from modeling import set_execution

REPLAYS = ("as_run", "fp32", "unpad_never", "unpad_always", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn")


class FoundNonFinite(Exception):
    """Raised out of run_glue.main at the first non-finite micro-batch, once the report is written."""


def all_finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def bare(model: torch.nn.Module) -> torch.nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DDP


def bad_parameters(model: torch.nn.Module) -> list[str]:
    return [n for n, p in bare(model).named_parameters() if p.grad is not None and not all_finite([p.grad])]


def replay(name: str, model, batch, loss_fn, precision) -> dict:
    """Forward and backward of `batch` on the current weights under one variant; the gradients are left zeroed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    inner = bare(model)
    bert = getattr(inner, "bert", None)
    saved_unpad = getattr(bert, "unpad", None)
    context = contextlib.nullcontext()
    autocast = precision.autocast()
    if name == "fp32":
        autocast = contextlib.nullcontext()
    elif name.startswith("unpad_") and bert is not None:
        set_execution(inner, unpad=name.removeprefix("unpad_"))
    elif name.startswith("sdpa_"):
        backend = {
            "math": SDPBackend.MATH,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
        }[name.removeprefix("sdpa_")]
        context = sdpa_kernel([backend])
    inner.zero_grad(set_to_none=True)
    try:
        with context:
            with autocast:
                loss = loss_fn(model, batch).reshape(-1)[0]
            loss.backward()
        result = {
            "loss": float(loss.detach()),
            "loss_finite": bool(torch.isfinite(loss.detach())),
            "grads_finite": not bad_parameters(model),
            "bad_parameters": bad_parameters(model)[:20],
        }
    except RuntimeError as e:  # a backend that cannot run this batch (no kernel for the shape, dtype or device)
        result = {"error": str(e).splitlines()[0][:300]}
    finally:
        if bert is not None:
            set_execution(inner, unpad=saved_unpad)
        inner.zero_grad(set_to_none=True)
    return result


def watch_steps(out: Path, original, names: dict[int, str]):
    """An optimizer_step that checks the weights after every update; the first update that makes them non-finite
    from finite gradients is reported (the optimizer's fault, or the gradients' size) with the weights before it
    and the gradients it used."""
    count = [0]

    def optimizer_step(optimizer, precision):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        before = [p.detach().clone() for p in params]
        taken = original(optimizer, precision)
        count[0] += 1
        if all_finite(p.detach() for p in params):
            return taken
        bad = [i for i, p in enumerate(params) if not all_finite([p.detach()])]
        report = {
            "first_bad_update": count[0],
            "kind": "optimizer step",
            "learning_rate": optimizer.param_groups[0]["lr"],
            "grad_norm": float(optimizer.last_grad_norm)
            if getattr(optimizer, "last_grad_norm", None) is not None
            else None,
            "bad_parameters": [names.get(id(params[i]), f"parameter {i}") for i in bad][:20],
            "their_grad_max_abs": [
                float(params[i].grad.abs().max()) if params[i].grad is not None else None for i in bad
            ][:20],
        }
        atomic_torch_save(
            {
                "weights_before": [t.cpu() for t in before],
                "grads": [None if p.grad is None else p.grad.detach().cpu() for p in params],
            },
            out / "bad_update.pt",
        )
        atomic_write_json(out / "nan_probe.json", report)
        raise FoundNonFinite(f"update {count[0]}")

    return optimizer_step


def watch(out: Path, original, names: dict[int, str]):
    """A forward_backward that checks every micro-batch and reports the first non-finite one; it fills `names`
    (parameter id -> name) for watch_steps."""
    count = [0]

    def forward_backward(model, batch, loss_fn, precision, accum, sync):
        losses = original(model, batch, loss_fn, precision, accum, sync)
        count[0] += 1
        if not names:
            names.update({id(p): n for n, p in bare(model).named_parameters()})
        if all_finite([losses]) and all_finite(p.grad for p in bare(model).parameters() if p.grad is not None):
            return losses
        report = {
            "first_bad": count[0],
            "loss": float(losses[0] * accum),
            "bad_parameters": bad_parameters(model),
            "lengths": batch["attention_mask"].sum(-1).tolist() if "attention_mask" in batch else None,
            "device": str(batch["input_ids"].device),
            "precision": precision.name,
        }
        cpu_batch = {k: v.detach().cpu() for k, v in batch.items()}
        weights = {k: v.detach().cpu() for k, v in bare(model).state_dict().items()}
        atomic_torch_save({"batch": cpu_batch, "model": weights}, out / "bad_batch.pt")
        report["replays"] = {
            name: replay(name, model, batch, loss_fn, precision)
            for name in REPLAYS
            if not name.startswith("sdpa_") or batch["input_ids"].is_cuda
        }
        atomic_write_json(out / "nan_probe.json", report)
        raise FoundNonFinite(f"micro-batch {count[0]}")

    return forward_backward, count


def main(argv: list[str] | None = None) -> dict:
    """Bad input: one line on stderr ("nan_probe: error: ..."), exit status 1."""
    with script_errors("nan_probe", argv):
        return _main(argv)


def _main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    glue_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], usage="python -m bench.nan_probe --out DIR -- <run_glue.py arguments>"
    )
    p.add_argument("--out", type=Path, required=True, help="where nan_probe.json and bad_batch.pt go")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if not glue_args:
        p.error("give run_glue.py's arguments after --")
    args.out.mkdir(parents=True, exist_ok=True)
    originals = train_step.forward_backward, train_step.optimizer_step
    names: dict[int, str] = {}
    train_step.forward_backward, count = watch(args.out, originals[0], names)
    train_step.optimizer_step = watch_steps(args.out, originals[1], names)
    try:
        run_glue.main(glue_args + ["--debug"])  # --debug: run_glue's own errors keep their type and traceback
        report = {"first_bad": None, "micro_batches": count[0]}
        atomic_write_json(args.out / "nan_probe.json", report)
    except FoundNonFinite:
        report = json.loads((args.out / "nan_probe.json").read_text())
    finally:
        train_step.forward_backward, train_step.optimizer_step = originals
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
