"""FP8 training of the encoder's matrix products (torchao's float8 recipe), applied outside the model.

    from bert_recipe.training import fp8
    fp8.check(device)          # FP8Unavailable (one line) where it cannot run
    fp8.convert(model)         # before torch.compile and DDP (parallelize.apply_parallelism_and_precision does it)

What changes: every matrix product of the encoder layers (the fused query/key/value projection, the attention
output, both feed-forward layers) casts its two operands to float8 (e4m3, one scale per tensor from its absolute
maximum, computed every step: "dynamic tensorwise" scaling) and runs on the fp8 tensor cores; the gradient of the
output is cast to e5m2 for the backward products. The weights, gradients and optimizer state stay fp32, and
everything else (embeddings, LayerNorm, softmax, the masked-LM head, the losses) keeps running under --precision
(bf16 autocast). The state dict is unchanged: torchao's Float8Linear is an nn.Linear with the same weight and bias,
so a checkpoint of an fp8 run loads into the plain model, and into transformers.

Why only the encoder: it is where the FLOPs are (24 layers x 12 H^2 a token in BERT-large); the masked-LM head's
decoder is tied to the word embeddings, and the pooler and the next-sentence classifier are tiny.

Where: CUDA GPUs with fp8 tensor cores (compute capability 8.9 and newer: Ada, Hopper, Blackwell), with the
`torchao` package installed (not a dependency of the recipe: `pip install torchao`). On a CPU torch emulates the
float8 products (slowly): allowed, so that the tests run the same code. Matrix sizes must be multiples of 16 (every
BERT size is); a layer whose are not stays in --precision.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch
from torch import nn

from bert_recipe.io import cli
from modeling import BertConfig, BertLayer


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


TOKEN_MULTIPLE = 16  # torch._scaled_mm: every dimension of a float8 product, the tokens of a weight gradient's too


def check_tokens(x: torch.Tensor) -> None:
    """Refuse, before the float8 product, an input whose token count (every dimension but the last) is not a
    multiple of 16: in the backward it is the inner dimension of the weight gradient, where torch._scaled_mm fails
    deep inside compilation. The unpadded layout rounds it (BertConfig.unpad_token_multiple, which convert sets)."""
    tokens = x.numel() // x.shape[-1]
    if tokens % TOKEN_MULTIPLE:
        raise ValueError(
            f"float8 matrix products need a token count divisible by {TOKEN_MULTIPLE}, got {tokens}: "
            "pad the unpadded layout (BertConfig.unpad_token_multiple, which fp8.convert sets)"
        )


def _fits(module: nn.Module) -> bool:
    """torch._scaled_mm needs both dimensions of the weight to be multiples of 16."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: nn.Module) -> int:
    """Swap the nn.Linear layers of every encoder layer (modeling.BertLayer) of `model` for torchao's Float8Linear, in
    place, and route each layer's fused query/key/value product through the same float8 matmul. Returns how many
    matrix products now run in float8 (4 a layer). Call before torch.compile and DDP wrap the model."""
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    for config in {
        id(m.config): m.config for m in model.modules() if isinstance(getattr(m, "config", None), BertConfig)
    }.values():  # the unpadded layout's token count: a multiple of 16, as the products need
        config.unpad_token_multiple = math.lcm(config.unpad_token_multiple, TOKEN_MULTIPLE)
    converted = 0
    for layer in (m for m in model.modules() if isinstance(m, BertLayer)):
        convert_to_float8_training(layer, module_filter_fn=lambda module, fqn: _fits(module))
        for module in layer.modules():
            if isinstance(module, Float8Linear):
                module.register_forward_pre_hook(lambda module, args: check_tokens(args[0]))
        attention = layer.attention.self
        if all(isinstance(m, Float8Linear) for m in (attention.query, attention.key, attention.value)):
            # The three projections are one product over their concatenated weights (modeling.py): its float8
            # version, with the query layer's scaling settings.
            attention.project_qkv = functools.partial(
                _float8_linear, mm_config=attention.query.linear_mm_config, config=attention.query.config
            )
            converted += 1
        converted += sum(
            isinstance(m, Float8Linear)
            for m in (layer.attention.output.dense, layer.intermediate.dense, layer.output.dense)
        )
    return converted


def _float8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, mm_config, config
) -> torch.Tensor:
    """F.linear(x, weight, bias) with the product in float8: torchao's Float8Linear.forward for a weight that is not a
    module's own (the concatenated query/key/value weight, whose gradient flows back to the three layers)."""
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    check_tokens(x)
    if torch.is_autocast_enabled(x.device.type):  # as Float8Linear does: the product's output in the autocast dtype
        x = x.to(torch.get_autocast_dtype(x.device.type))
    out = matmul_with_hp_or_float8_args.apply(x, weight.t(), mm_config, config)
    return out if bias is None else out + bias.to(out.dtype)
