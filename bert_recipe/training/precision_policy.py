"""Precision: the number format the maths runs in, decided in one place for training, fine-tuning and inference.

Read top to bottom:
  1. the hardware   `cpu_native_bf16`: does this CPU compute bf16 natively (AMX / AVX512-BF16 in its flags)?
                    `BERT_CPU_BF16=1|0` in the environment overrides the answer (CI runs the precision-dependent
                    tests under both; a user can force the choice).
  2. the rule       `resolve(requested, device, purpose)`: `--precision auto|fp32|tf32|fp16|bf16` -> what runs.
  3. the front door `setup(...)`: resolve, set TF32, print the choice and its reason once; `flag`: the
                    same flag (and the old --fp16/--amp/--bf16 aliases) in every entry script's configuration.
  4. running        `autocast(name, device)`; `Precision`: autocast plus the GradScaler that fp16 training needs.

The rule for `auto` depends on what the command does:
  TRAIN  (pre-training; fine-tuning with --do_train): the fastest precision the hardware runs natively: bf16 on
         GPUs that have it (Ampere and newer), fp16 with loss scaling on older GPUs, bf16 on CPUs with AMX or
         AVX512-BF16, fp32 on other CPUs (where bf16 is emulated, measured 20x slower: AMD EPYC, AVX2, 13 s
         against 0.64 s a step of the CPU demo's model).
  READ   (extract_features.py, inference.py, evaluation or prediction without --do_train, export): fp32 with TF32
         off, so that the same command gives the same outputs on every machine (what transformers' pipelines
         and sentence-transformers do unless asked). bf16 and fp16 run only when named.
An explicit choice is always kept, with a one-line warning when the hardware only emulates it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert_recipe.io import flags

if TYPE_CHECKING:  # torch is imported inside the functions: the data scripts that import this start fast
    import torch

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
CHOICES = ("auto", *PRECISIONS)
TRAIN, READ = "train", "read"  # what a command does with the model: the two rules for auto
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo names of the native bf16 instructions
ENV_CPU_BF16 = "BERT_CPU_BF16"  # 1: decide as if the CPU computed bf16 natively; 0: as if it did not

# --------------------------------------------------------------------------------------------------------------
# 1. The hardware


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None where there is no such file."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / Arm
            return set(value.split())
    return set()


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform says, else "unknown": the name a
    measurement records beside its numbers, with cpu_flags' bf16 flags."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def env_cpu_bf16() -> bool | None:
    """$BERT_CPU_BF16 as True (1), False (0), or None when unset or empty; any other value is a ValueError."""
    value = os.environ.get(ENV_CPU_BF16, "").strip().lower()
    if not value:
        return None
    if value in ("1", "true", "yes", "native"):
        return True
    if value in ("0", "false", "no", "emulated"):
        return False
    raise ValueError(
        f"{ENV_CPU_BF16}={os.environ[ENV_CPU_BF16]!r} is not understood: set it to 1 (decide as if "
        "the CPU computed bf16 natively) or 0 (as if it did not), or unset it to read the CPU's flags"
    )


def cpu_native_bf16(flags: set[str] | None = None) -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively (AMX or AVX512-BF16), and the evidence, as (answer, reason).

    $BERT_CPU_BF16 (1 or 0), when set, is the answer. Otherwise read from the CPU's own flags (`flags`, default
    /proc/cpuinfo); where there are none (not Linux), from PyTorch's own capability query. Never from the model
    name: the same name ships with and without the flags.
    """
    forced = env_cpu_bf16()
    if forced is not None:
        return forced, (
            f"{ENV_CPU_BF16}={os.environ[ENV_CPU_BF16]} says the CPU "
            + ("computes bf16 natively" if forced else "has no native bf16 (bf16 would be emulated)")
        )
    if flags is None:
        flags = cpu_flags()
    if flags is not None:
        found = [f for f in CPU_BF16_FLAGS if f in flags]
        if found:
            return True, f"the CPU has {' and '.join(found)}"
        return False, f"the CPU has neither {' nor '.join(CPU_BF16_FLAGS)} (bf16 would be emulated)"
    import torch

    query = getattr(getattr(torch, "_C", None), "_cpu", None)
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(query, name, None)
        if fn is not None and fn():
            return True, f"PyTorch reports {name.removeprefix('_is_').removesuffix('_supported')}"
    return False, "no CPU flags to read and PyTorch reports no native bf16"


# --------------------------------------------------------------------------------------------------------------
# 2. The rule


@dataclass(frozen=True)
class PrecisionChoice:
    """What `--precision` resolved to on this device, and why (printed once, logged in the JSON summary)."""

    name: str  # fp32 | tf32 | fp16 | bf16
    reason: str
    warning: str | None = None  # one line, when the user asked for something this hardware only emulates


def resolve(
    requested: str, device: torch.device | str, purpose: str = TRAIN, flags: set[str] | None = None
) -> PrecisionChoice:
    """Turn `--precision` (auto, fp32, tf32, fp16, bf16) into the precision that runs on `device`.

    purpose TRAIN, auto: bf16 on GPUs that have it (Ampere and newer), fp16 with loss scaling on older GPUs; on
    CPUs bf16 only where it is native (`cpu_native_bf16`), fp32 otherwise. purpose READ, auto: fp32 everywhere.
    An explicit choice is kept, with a one-line warning when the hardware would emulate it. tf32 on a CPU is fp32
    (TF32 is a GPU tensor-core format).
    """
    import torch

    if requested not in CHOICES:
        raise ValueError(f"precision must be one of {CHOICES}, got {requested!r}")
    if purpose not in (TRAIN, READ):
        raise ValueError(f"purpose must be {TRAIN!r} or {READ!r}, got {purpose!r}")
    device = torch.device(device)
    if requested == "auto" and purpose == READ:
        return PrecisionChoice(
            "fp32",
            "auto: fp32 because this command only reads a model, so its outputs are the "
            "same on every machine (name bf16 or fp16 to trade that for speed)",
        )
    if device.type == "cuda":
        bf16_ok = torch.cuda.get_device_capability(device)[0] >= 8  # Ampere+ (is_bf16_supported() counts emulation)
        gpu = torch.cuda.get_device_name(device)
        if requested == "auto":
            if bf16_ok:
                return PrecisionChoice("bf16", f"auto: {gpu} computes bf16 natively")
            return PrecisionChoice("fp16", f"auto: {gpu} has no bf16, so fp16 with dynamic loss scaling")
        warning = None if requested != "bf16" or bf16_ok else f"{gpu} has no native bf16: expect it to be slow"
        return PrecisionChoice(requested, f"asked for {requested}", warning)
    if device.type != "cpu":
        return PrecisionChoice("fp32" if requested == "auto" else requested, f"{requested} on {device.type}")
    if requested == "tf32":
        return PrecisionChoice("fp32", "asked for tf32: on a CPU that is fp32")
    if requested == "fp32":
        return PrecisionChoice("fp32", "asked for fp32")
    native, why = cpu_native_bf16(flags)
    if requested == "auto":
        return PrecisionChoice("bf16" if native else "fp32", f"auto: {why}")
    warning = None
    if requested == "bf16" and not native:
        warning = (
            f"--precision bf16 on this CPU: {why}, about an order of magnitude slower than fp32 "
            "(--precision auto picks fp32 here)"
        )
    elif requested == "fp16":
        warning = "--precision fp16 on a CPU: float16 is emulated on most CPUs and slower than fp32"
    return PrecisionChoice(requested, f"asked for {requested}", warning)


# --------------------------------------------------------------------------------------------------------------
# 3. The front door: the flag, and resolving it once per run

HELP = {
    TRAIN: (
        "auto (the default): the fastest precision the hardware runs natively: bf16 on GPUs that have it, else "
        "fp16 with loss scaling; on CPUs bf16 only where it is native (AMX or AVX512-BF16 in the CPU flags, "
        f"or ${ENV_CPU_BF16}=1), else fp32. fp32 turns TF32 off on GPUs, tf32 turns it on. The choice and its "
        "reason are printed and logged"
    ),
    READ: (
        "auto (the default): fp32 with TF32 off, because this command only reads a model: the same outputs on "
        "every machine. bf16 or fp16 run only when named. The choice and its reason are printed and logged"
    ),
}
HELP_FINETUNING = (
    "auto (the default): with --do_train the fastest precision the hardware runs natively (bf16 on "
    "GPUs that have it, else fp16 with loss scaling; on CPUs bf16 only where it is native: AMX or "
    f"AVX512-BF16 in the CPU flags, or ${ENV_CPU_BF16}=1; else fp32); without --do_train "
    "(evaluation or prediction only) fp32 with TF32 off, so the same command gives the same "
    "outputs on every machine. fp32 turns TF32 off on GPUs, tf32 turns it on. The choice and its "
    "reason are printed and logged"
)


ALIASES = (
    flags.Switch(("--fp16", "--amp"), "fp16", "alias of --precision fp16"),
    flags.Switch(("--bf16",), "bf16", "alias of --precision bf16"),
)


def flag(rule: str = HELP[TRAIN]) -> Any:
    """The `precision` field of a command's configuration: --precision {auto,fp32,tf32,fp16,bf16} (default auto),
    and the old switches --fp16/--amp and --bf16 as its aliases (all set `precision`; argparse refuses two of them
    in one command line). Its --help is the docstring under the field, if any, then `rule`: the rule for auto that
    the command follows (HELP[TRAIN], HELP[READ] or HELP_FINETUNING)."""
    return flags.flag("auto", choices=CHOICES, exclusive="precision", switches=ALIASES, help_after=rule)


def purpose_of(args) -> str:
    """TRAIN for a fine-tuning command with --do_train, READ for one that only evaluates or predicts (`args`: a
    parsed namespace, or a fine-tuning configuration's run section)."""
    return TRAIN if getattr(args, "do_train", False) else READ


def configure_tf32(enabled: bool) -> None:
    """TF32 matmuls/convolutions on GPUs that have them (Ampere+); harmless elsewhere."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def report(choice: PrecisionChoice, prog: str, show: bool = True) -> None:
    """Print the resolved precision and its reason once (and the warning, if any) on stderr."""
    if not show:
        return
    print(f"{prog}: precision {choice.name} ({choice.reason})", file=sys.stderr, flush=True)
    if choice.warning:
        print(f"{prog}: warning: {choice.warning}", file=sys.stderr, flush=True)


def setup(
    requested: str, device: torch.device, prog: str | None, purpose: str = TRAIN, show: bool = True
) -> PrecisionChoice:
    """The one front door: resolve `--precision` on `device` for `purpose`, turn TF32 on for GPU matmuls unless
    the choice is fp32, and report the choice once (prog None: the caller logs it itself)."""
    choice = resolve(requested, device, purpose)
    configure_tf32(getattr(device, "type", str(device)) == "cuda" and choice.name != "fp32")
    if prog is not None:
        report(choice, prog, show)
    return choice


# --------------------------------------------------------------------------------------------------------------
# 4. Running in the chosen precision


def autocast_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype for a precision name: fp16 -> float16, bf16 -> bfloat16, fp32/tf32 -> None (no autocast)."""
    import torch

    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {name!r}")
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(name)


def autocast(name: str, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for fp16/bf16 on the given device; a no-op context for fp32/tf32."""
    import torch

    dtype = autocast_dtype(name)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


@dataclass
class Precision:
    """How a training run's maths runs: `name` fp32/tf32/fp16/bf16, autocast for the forward pass, a GradScaler
    for fp16 (disabled otherwise), and why this precision (what auto saw), logged with the parameters."""

    name: str
    device: torch.device
    scaler: torch.amp.GradScaler
    static_loss_scale: float | None = None  # fp16 with a fixed --loss_scale
    reason: str = ""
    warning: str | None = None  # one line when the hardware only emulates the precision asked for

    @classmethod
    def for_training(
        cls, choice: PrecisionChoice, device: torch.device, loss_scale: float = 0.0, init_loss_scale: float = 2.0**16
    ) -> Precision:
        """Loss scaling for fp16 only (its range is narrow; bf16 has fp32's): static when loss_scale > 0, else
        dynamic from init_loss_scale."""
        import torch

        fp16 = choice.name == "fp16"
        static = loss_scale if fp16 and loss_scale > 0 else None
        scaler = torch.amp.GradScaler(device.type, init_scale=static or init_loss_scale, enabled=fp16)
        return cls(choice.name, device, scaler, static, choice.reason, choice.warning)

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.name, self.device)

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0
