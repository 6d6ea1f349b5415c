"""FP8 training of the encoder's feed-forward products (torchao's float8 recipe), applied outside the model.

    from bert_recipe.training import fp8
    fp8.check(device)          # FP8Unavailable (one line) where it cannot run
    fp8.convert(model)         # before torch.compile and DDP (parallelize.apply_parallelism_and_precision does it)

What changes: the two feed-forward products of every encoder layer (FC1: H -> 4H, FC2: 4H -> H, the widest of
BERT's products) cast their operands to float8 (e4m3, one scale per tensor from its absolute maximum, computed
every step: "dynamic tensorwise" scaling, torchao's fastest) and run on the fp8 tensor cores, in the forward and for
the input's gradient (the output's gradient cast to e5m2). The weight's gradient stays a --precision (bf16)
product: its inner dimension is the token count, and leaving it out drops the transposed casts of the activations
and of the output gradient, and any rule on the token count (float8 needs every other dimension divisible by 16,
which BERT's widths are). Everything else (attention, LayerNorm, softmax, the masked-LM head, the losses) runs in
--precision; the weights, gradients and optimizer state stay fp32. The state dict is unchanged: torchao's
Float8Linear is an nn.Linear with the same weight and bias, so a checkpoint of an fp8 run loads into the plain
model, and into transformers.

Why not every product: an H200 run of the earlier recipe (all four products a layer, every gradient in float8) cut
the GEMM time from 666 to 360 ms a step and added 467 ms of casts (bench/STUDIES.md, "Which path is fastest on a
GPU"): at hidden 1024 the casts cost more than the products save, and torchao's own table puts products of this
size below 1.0x. No GPU has yet measured this narrower recipe; --fp8 stays off by default until one shows it wins.

Where: CUDA GPUs with fp8 tensor cores (compute capability 8.9 and newer: Ada, Hopper, Blackwell), with the
`torchao` package installed (not a dependency of the recipe: `pip install torchao`). On a CPU torch emulates the
float8 products (slowly): allowed, so that the tests run the same code. A layer whose widths are not multiples of 16
stays in --precision.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from bert_recipe.io import cli
from modeling import BertLayer


class FP8Unavailable(cli.InputError):
    """--fp8 asked for where it cannot run."""


def check(device: torch.device) -> None:
    """Raise FP8Unavailable (one line saying what to do) where FP8 training cannot run on `device`."""
    if importlib.util.find_spec("torchao") is None:
        raise FP8Unavailable("--fp8 needs the torchao package (pip install torchao), which is not installed")
    if device.type not in ("cuda", "cpu"):
        raise FP8Unavailable(f"--fp8 runs on CUDA GPUs (and, emulated, on CPUs), not on {device.type}")
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if capability is not None and capability < (8, 9):
        raise FP8Unavailable(
            f"--fp8 needs fp8 tensor cores (compute capability 8.9 or newer: Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} has {'.'.join(map(str, capability))}: drop --fp8"
        )


def _fits(module: nn.Module) -> bool:
    """torch._scaled_mm needs both dimensions of the weight to be multiples of 16."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def recipe():
    """torchao's configuration of the recipe above: dynamic tensorwise scaling for the forward and the input's
    gradient, the weight's gradient in high precision."""
    from torchao.float8 import CastConfig, Float8LinearConfig, ScalingType

    # DISABLED: this product's operand stays in high precision. The target dtypes only repeat the ones the other
    # product of the same operand casts to (e4m3 the input, e5m2 the output gradient), which torchao checks.
    return Float8LinearConfig(
        cast_config_input_for_grad_weight=CastConfig(ScalingType.DISABLED, target_dtype=torch.float8_e4m3fn),
        cast_config_grad_output_for_grad_weight=CastConfig(ScalingType.DISABLED, target_dtype=torch.float8_e5m2),
    )


def convert(model: nn.Module) -> int:
    """Swap the two feed-forward nn.Linear layers of every encoder layer (modeling.BertLayer: intermediate.dense and
    output.dense) of `model` for torchao's Float8Linear with recipe(), in place. Returns how many products now run
    in float8 (2 a layer). Call before torch.compile and DDP wrap the model."""
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = recipe()
    converted = 0
    for layer in (m for m in model.modules() if isinstance(m, BertLayer)):
        for block in (layer.intermediate, layer.output):
            convert_to_float8_training(block, module_filter_fn=lambda module, fqn: _fits(module), config=config)
            converted += isinstance(block.dense, Float8Linear)
    return converted
