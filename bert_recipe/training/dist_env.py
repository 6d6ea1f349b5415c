"""The processes of a run: torchrun's environment, or Slurm's, or a single process (DistEnv, init_distributed,
barrier, end_process_group, exit_script: how an entry script's process ends), and the seeds and RNG states each
process keeps (set_seed, rng_state, set_rng_state: what a resumed run restores). torch is imported inside the
functions that need it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn

import numpy as np

# --------------------------------------------------------------------------------------------------------------
# Distributed set-up: torchrun's environment, or Slurm's (srun with one task per GPU), or a single process.


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: Any = field(default_factory=lambda: __import__("torch").device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _slurm_to_torchrun_env() -> None:
    """Translate Slurm's variables into the ones torch.distributed reads, when torchrun did not set them."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURM_NODELIST", ""))
        first = socket.gethostname()
        if nodelist:
            with contextlib.suppress(OSError, subprocess.CalledProcessError):
                first = subprocess.check_output(["scontrol", "show", "hostnames", nodelist], text=True).split()[0]
        os.environ["MASTER_ADDR"] = first
    os.environ.setdefault("MASTER_PORT", "29500")


def init_distributed(no_cuda: bool = False) -> DistEnv:
    """Initialise torch.distributed from torchrun's or Slurm's environment; NCCL on GPU, gloo on CPU.

    A plain `python script.py` gives a single-process DistEnv without touching torch.distributed.
    """
    import torch

    _slurm_to_torchrun_env()
    use_cuda = torch.cuda.is_available() and not no_cuda
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def barrier(env: DistEnv) -> None:
    import torch

    if env.distributed:
        torch.distributed.barrier()


def end_process_group(clean: bool = True) -> None:
    """Leave the default process group, if one is open. After a clean run every rank first meets the others at a
    barrier: a rank that tears gloo down while a peer is still finishing its last collective can make that peer abort
    ("terminate called without an active exception", seen once in CI on a 2-process run whose results were all
    written). After a failure there is no barrier: the peers may be gone, and waiting for them would hang. The same
    abort has a second cause that no barrier removes, at the interpreter's exit: see exit_script."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if clean:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def exit_script(main: Callable[[], object]) -> NoReturn:
    """Run an entry script's main() and end the process with its status: an int that main returns, or the code of
    the SystemExit it raises (script_errors' 1); any other return value is success (0).

    One process of a multi-process run (WORLD_SIZE > 1: torchrun's or Slurm's) ends with os._exit once its output
    is flushed, skipping Python's finalisation: gloo's worker threads outlive destroy_process_group, and one that
    frees a tensor while the interpreter finalises cannot take the GIL and aborts the process (exit 134) after a
    run that wrote everything (tests/README.md, "the very end of a multi-process run"; bench/exit_race.py). Nothing
    is lost: the scripts close their logs and write checkpoints atomically before main returns, and logging's
    handlers and stdout/stderr are flushed here. A single process exits the usual way (sys.exit).
    """
    try:
        status = main()
        code = status if isinstance(status, int) and not isinstance(status, bool) else 0
    except SystemExit as stop:
        code = stop.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1, as Python itself does
        print(code, file=sys.stderr)
        code = 1
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken console must not change the status
            stream.flush()
    os._exit(code)


# --------------------------------------------------------------------------------------------------------------
# Seeding and RNG state.


def set_seed(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every RNG state a resumed run needs, as tensors and plain Python objects (loadable with weights_only)."""
    import torch

    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        # numpy's state holds an ndarray, which weights_only=True refuses: store the keys as a tensor.
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(_as_python_state(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(state):
    # After a save/load round trip the nested tuples of random.getstate() may come back as lists.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
