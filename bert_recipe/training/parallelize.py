"""Parallelism and precision, applied outside the model in one ordered function (torchtitan's way).

`apply_parallelism_and_precision` turns a bare model into what a training loop calls (TF32, activation
checkpointing, regional or whole-model torch.compile, device, DDP and its comm hook) and decides how its maths runs
(precision_policy.py's `Precision`: autocast, and a GradScaler for fp16); `compiled(model)` says how it was compiled.
Pre-training (run_pretraining.py) and fine-tuning (finetuning/recipe.py) both call it.
"""

from __future__ import annotations

import torch

from bert_recipe.training import dist_env
from bert_recipe.training.precision_policy import Precision, configure_tf32, resolve


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's switch for "no buffer broadcast before each forward": `forward_sync_buffers` since torch 2.13, which
    deprecates `broadcast_buffers` (still the only name in older torch, e.g. an NGC container's). The new switch
    still syncs buffers once at wrap time: harmless, BERT's buffers (position ids) are equal on every rank."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def apply_parallelism_and_precision(
    model: torch.nn.Module,
    env: dist_env.DistEnv,
    precision: str = "auto",
    *,
    loss_scale: float = 0.0,
    init_loss_scale: float = 2.0**16,
    checkpoint_activations: bool = False,
    allreduce_fp16: bool = False,
    compile: bool | None = False,
    compile_mode: str = "default",
    compile_backend: str = "inductor",
    compile_scope: str = "layers",
    fp8: bool = False,
    bit_dropout: bool = False,
) -> tuple[torch.nn.Module, Precision]:
    """Turn a bare model into the module the loop trains, and decide how its maths runs. The order matters; each
    step says why it comes where it does. Returns (the model to call, Precision); keep the bare model for saving.

    precision: --precision (auto picks from the hardware, see precision_policy.resolve); loss_scale > 0: a static
    fp16 loss scale, else dynamic from init_loss_scale; allreduce_fp16: all-reduce gradients in 16 bits;
    compile: True/False, or None for "on a GPU only"; compile_mode: torch.compile's mode ("reduce-overhead": CUDA
    graphs); compile_backend: torch.compile's backend (inductor, or a debugging one: aot_eager); compile_scope:
    "layers" compiles each region of modeling.COMPILE_REGIONS in place (regional compilation), "model" wraps the
    whole model (it then has `_orig_mod`). `compiled(model)` tells either.
    fp8: the encoder layers' feed-forward products in float8 (fp8.py; fp8.FP8Unavailable where it cannot run).
    bit_dropout: the encoder's hidden-dropout masks kept in 1 bit an element (bit_dropout.py).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if compile_scope not in COMPILE_SCOPES:
        raise ValueError(f"compile_scope {compile_scope!r} is not one of {COMPILE_SCOPES}")
    cuda = env.device.type == "cuda"
    if compile is None:  # on GPUs, where it was measured faster; not on CPUs, where compiling costs minutes
        compile = cuda
    kwargs = {} if compile_mode == "default" else {"mode": compile_mode}
    if compile_backend != "inductor":
        kwargs["backend"] = compile_backend
    # 0. Which precision runs: auto follows the hardware (bf16 only where it is native; precision_policy.resolve).
    choice = resolve(precision, env.device)
    # 1. TF32: fp32 matmuls (the tf32 run, and what autocast leaves in fp32) on tensor cores, on GPUs that have
    #    them, unless fp32 was asked for by name; a no-op on CPU.
    configure_tf32(cuda and choice.name != "fp32")
    # 2. Activation checkpointing is a property of the bare encoder: set it before anything wraps the module.
    if checkpoint_activations:
        model.bert.encoder.checkpoint_activations = True
    # 2b. FP8 swaps the encoder's Linear layers for float8 ones: a change of modules, so before compilation traces
    #     them (the float8 casts then fuse into the compiled layers) and before DDP registers their parameters.
    if fp8:
        from bert_recipe.training import fp8 as float8

        float8.check(env.device)
        float8.convert(model)
    # 2c. 1-bit dropout masks swap modules too (nn.Dropout for BitMaskDropout): likewise before compilation.
    if bit_dropout:
        from bert_recipe.training import bit_dropout as bits

        bits.convert(model)
    # 3. Regional compilation: each encoder layer (and the embeddings and the masked-LM head) is compiled in place,
    #    before DDP sees the module. The 24 layers of BERT-large share one graph, so compiling costs one layer's
    #    time instead of the whole model's (on this 2-core CPU: 44 s against 134 s for BERT-large), and the
    #    data-dependent work between regions (unpadding's nonzero, the sequences' lengths) stays in eager mode, so
    #    the unpadded path compiles too (its layers see [T, H]: recompiled once with T symbolic). In place, the
    #    state dict keeps its names.
    if compile and compile_scope == "layers":
        from modeling import COMPILE_REGIONS

        for module in model.modules():
            if isinstance(module, COMPILE_REGIONS):
                module.compile(**kwargs)
    # 4. Weights to the device, and they stay fp32: autocast casts per op, the optimizer updates fp32 weights.
    model.to(env.device)
    # 5. DDP: broadcasts rank 0's weights now, and averages gradients over ranks in buckets during backward.
    #    Gradients are views into the buckets (no copy); no buffers need broadcasting in BERT at each forward.
    if env.distributed:
        model = DDP(
            model,
            device_ids=[env.local_rank] if cuda else None,
            gradient_as_bucket_view=True,
            **_no_forward_buffer_sync(),
        )
        # 6. The comm hook compresses each bucket to 16 bits for the all-reduce (and back): half the traffic.
        #    bf16 (fp32's range) when training in bf16 on GPUs; PyTorch's bf16 hook needs NCCL, so gloo uses fp16.
        if allreduce_fp16:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = (
                default_hooks.bf16_compress_hook if choice.name == "bf16" and cuda else default_hooks.fp16_compress_hook
            )
            model.register_comm_hook(None, hook)
    # 7. Whole-model compilation (compile_scope "model") goes around DDP, so that its DDPOptimizer splits the graph
    #    at bucket boundaries and the all-reduces still overlap the backward pass. Unpad "auto" then keeps the
    #    padded path: static shapes, one graph.
    if compile and compile_scope == "model":
        model = torch.compile(model, **kwargs)
    # 8. Loss scaling for fp16 only (its range is narrow); bf16 has fp32's range and needs none.
    return model, Precision.for_training(choice, env.device, loss_scale, init_loss_scale)


COMPILE_SCOPES = ("layers", "model")


def compiled(model: torch.nn.Module) -> str | None:
    """How `model` (as apply_parallelism_and_precision returned it) is compiled: "model", "layers" or None."""
    if hasattr(model, "_orig_mod"):
        return "model"
    if any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()):
        return "layers"
    return None
