"""CPU and NUMA binding per local rank, for multi-GPU nodes (what NVIDIA's bind.sh / bind_pyt.py did with numactl).

On a node with several NUMA nodes, a process whose threads run on one socket while its GPU and its memory hang off
the other pays for every host-to-device copy and every page it touches. This module reads the node's topology
from sysfs, gives each local rank the NUMA node of its GPU (its cores, its memory), and prints the mapping:

    python -m scripts.bind                          # the mapping for this machine (one rank per GPU found)
    python -m scripts.bind --nproc 8 --mode exclusive

Topology, all from sysfs (--sysfs, default /sys):
  * NUMA nodes and their CPUs: devices/system/node/node<N>/cpulist (nodes without CPUs, such as HBM or CXL memory,
    are left out); hyper-threads of one core from devices/system/cpu/cpu<K>/topology/thread_siblings_list;
  * GPUs: the NVIDIA display/3D controllers in bus/pci/devices (vendor 0x10de, class 0x0300xx or 0x0302xx) in PCI
    address order, which is nvidia-smi's order and CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID (and for identical
    GPUs CUDA's default order); each one's numa_node file is the NUMA node it is attached to (-1: unknown).
    CUDA_VISIBLE_DEVICES given as indices picks and reorders them, as CUDA does.

Local rank r uses GPU r. Its NUMA node is that GPU's; without GPUs (CPU processes) or where the GPU's node is
unknown, the ranks are spread over the nodes in contiguous blocks (ranks 0-3 on node 0, 4-7 on node 1 for 8 ranks
on 2 nodes). Modes, torchrun's names:
  node       every core of the node (numactl --cpunodebind=N --membind=N)
  exclusive  the node's physical cores split evenly between the ranks on it, hyper-threads kept with their core
             (numactl --physcpubind=LIST --membind=N)
  socket, core-complex   only through torchrun's own --numa-binding (PyTorch >= 2.9, GPUs, numactl)

The launchers (scripts/run_glue.sh, run_squad.sh, run_swag.sh) take NUMA_BINDING=<mode> and rewrite their
launcher with `--launcher`:
  * torchrun with GPUs, numactl installed and a --numa-binding option (PyTorch 2.13 has it): torchrun
    --numa-binding=<mode> does the binding itself;
  * otherwise each rank starts through this file (`scripts/bind.py --mode M --run -- script.py args`), which
    reads LOCAL_RANK (SLURM_LOCALID under srun) and execs `numactl ... python script.py args`; without numactl
    it pins the process's CPUs (os.sched_setaffinity, inherited through exec) and says that memory is left to the
    kernel's first-touch placement.
On a machine with one NUMA node (or none in sysfs) binding changes nothing: the launcher is left as it was and a
line on stderr says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from bert_recipe.io import flags
from bert_recipe.io.flags import flag

MODES = ("node", "exclusive", "socket", "core-complex")
OWN_MODES = ("node", "exclusive")  # what the numactl fallback here computes itself
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers (data-centre GPUs are 3D controllers)


# ----------------------------------------------------------------------------------------------------------------
# Topology


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format; empty -> [])."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"not a cpulist: {text.strip()!r}")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(cpus))


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> '0-3,8,10-11'."""
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class Gpu:
    pci: str  # sysfs address, 0000:07:00.0
    numa_node: int  # -1: unknown


@dataclass
class Topology:
    nodes: dict[int, list[int]]  # NUMA node -> its CPUs (nodes with CPUs only)
    cores: dict[int, tuple[int, ...]]  # CPU -> the hyper-threads of its physical core (itself included)
    gpus: list[Gpu]


def read_topology(sysfs: str | os.PathLike = "/sys") -> Topology:
    sysfs = Path(sysfs)
    nodes: dict[int, list[int]] = {}
    for folder in (sysfs / "devices" / "system" / "node").glob("node[0-9]*"):
        cpulist = folder / "cpulist"
        if folder.name[4:].isdigit() and cpulist.is_file():
            cpus = parse_cpulist(cpulist.read_text())
            if cpus:
                nodes[int(folder.name[4:])] = cpus
    cores: dict[int, tuple[int, ...]] = {}
    for cpus in nodes.values():
        for cpu in cpus:
            siblings = sysfs / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list"
            try:
                cores[cpu] = tuple(parse_cpulist(siblings.read_text())) or (cpu,)
            except (OSError, ValueError):
                cores[cpu] = (cpu,)
    gpus = []
    for device in sorted((sysfs / "bus" / "pci" / "devices").glob("*")):
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            klass = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES):
            try:
                node = int((device / "numa_node").read_text().strip())
            except (OSError, ValueError):
                node = -1
            gpus.append(Gpu(device.name, node))
    return Topology(dict(sorted(nodes.items())), cores, gpus)


def visible_gpus(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA shows, in its order, for CUDA_VISIBLE_DEVICES given as indices; unset or given as UUIDs (which
    sysfs cannot match): all of them."""
    if cuda_visible_devices is None:
        return gpus
    picked = []
    for item in cuda_visible_devices.split(","):
        item = item.strip()
        if item.startswith(("GPU-", "MIG-")):
            return gpus
        if not item.isdigit() or int(item) >= len(gpus):
            break  # CUDA ignores everything from the first invalid entry on
        picked.append(gpus[int(item)])
    return picked


# ----------------------------------------------------------------------------------------------------------------
# The mapping


@dataclass(frozen=True)
class RankBinding:
    local_rank: int
    gpu: Gpu | None
    node: int
    cpus: tuple[int, ...]
    why: str  # "GPU 0000:07:00.0 is on node 0", "no GPU: block 0 of 2"

    def numactl_args(self, mode: str) -> list[str]:
        if mode == "node":
            return [f"--cpunodebind={self.node}", f"--membind={self.node}"]
        return [f"--physcpubind={format_cpulist(list(self.cpus))}", f"--membind={self.node}"]


class BindError(ValueError):
    """A request this topology cannot serve; one line."""


def plan(topology: Topology, nproc: int, mode: str = "node") -> list[RankBinding] | None:
    """Each local rank's NUMA node and CPUs, or None where there is nothing to bind (one NUMA node or none)."""
    if mode not in OWN_MODES:
        raise BindError(
            f"mode {mode!r}: this module computes {' and '.join(OWN_MODES)}; {mode} needs torchrun's "
            "own --numa-binding (PyTorch >= 2.9, GPUs and numactl)"
        )
    if nproc < 1:
        raise BindError(f"--nproc must be at least 1, got {nproc}")
    if len(topology.nodes) <= 1:
        return None
    node_ids = list(topology.nodes)
    chosen: list[tuple[int, Gpu | None, str]] = []
    for rank in range(nproc):
        gpu = topology.gpus[rank] if rank < len(topology.gpus) else None
        if gpu is not None and gpu.numa_node in topology.nodes:
            chosen.append((gpu.numa_node, gpu, f"GPU {gpu.pci} is on node {gpu.numa_node}"))
            continue
        block = rank * len(node_ids) // nproc
        reason = "no GPU" if gpu is None else f"GPU {gpu.pci} has no NUMA node"
        chosen.append((node_ids[block], gpu, f"{reason}: rank block {block + 1} of {len(node_ids)}"))
    out = []
    for rank, (node, gpu, why) in enumerate(chosen):
        cpus = topology.nodes[node]
        if mode == "exclusive":
            sharing = [r for r, (n, _, _) in enumerate(chosen) if n == node]
            cores = sorted({topology.cores.get(cpu, (cpu,)) for cpu in cpus}, key=min)
            k, m = sharing.index(rank), len(sharing)
            if len(cores) < m:
                raise BindError(f"exclusive: node {node} has {len(cores)} physical cores for {m} ranks")
            mine = cores[k * len(cores) // m : (k + 1) * len(cores) // m]
            cpus = sorted(cpu for core in mine for cpu in core if cpu in topology.nodes[node])
        out.append(RankBinding(rank, gpu, node, tuple(cpus), why))
    return out


def describe(topology: Topology, bindings: list[RankBinding] | None, mode: str) -> str:
    lines = [
        "NUMA nodes: "
        + ("; ".join(f"node{n} cpus {format_cpulist(c)}" for n, c in topology.nodes.items()) or "none in sysfs")
    ]
    if topology.gpus:
        lines.append("GPUs: " + "; ".join(f"{i} {g.pci} node {g.numa_node}" for i, g in enumerate(topology.gpus)))
    if bindings is None:
        lines.append(
            f"{len(topology.nodes) or 'no'} NUMA node{'s' * (len(topology.nodes) != 1)}: binding would "
            "change nothing; processes run unbound"
        )
        return "\n".join(lines)
    lines.append(f"mode {mode}")
    lines.append(f"{'local rank':>10}  {'node':>4}  {'cpus':<24} why")
    for b in bindings:
        lines.append(f"{b.local_rank:>10}  {b.node:>4}  {format_cpulist(list(b.cpus)):<24} {b.why}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Launchers and per-rank start-up


def torchrun_has_numa_binding() -> bool:
    """Whether the installed torchrun has --numa-binding (PyTorch >= 2.9)."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError:
        return False
    return any("--numa-binding" in action.option_strings for action in get_args_parser()._actions)


def bound_launcher(
    launcher: list[str],
    mode: str,
    nproc: int,
    topology: Topology,
    has_torchrun_option: bool | None = None,
    numactl: str | None = None,
) -> tuple[list[str], str]:
    """The launcher words with binding added, and one line saying what was done.

    torchrun + GPUs + numactl + its --numa-binding: insert `--numa-binding=<mode>`; else run each rank through
    this file's --run. One NUMA node: the launcher unchanged."""
    if mode not in MODES:
        raise BindError(f"NUMA_BINDING={mode!r}: choose one of {', '.join(MODES)}")
    numactl = shutil.which("numactl") if numactl is None else numactl
    torchrun = next(
        (i for i, w in enumerate(launcher) if w == "torch.distributed.run" or os.path.basename(w) == "torchrun"), None
    )
    if len(topology.nodes) <= 1:
        return launcher, describe(topology, None, mode).splitlines()[-1]
    if torchrun is not None and topology.gpus and numactl:
        if has_torchrun_option is None:
            has_torchrun_option = torchrun_has_numa_binding()
        if has_torchrun_option:
            return (
                launcher[: torchrun + 1] + [f"--numa-binding={mode}"] + launcher[torchrun + 1 :],
                f"torchrun --numa-binding={mode} binds each of the {nproc} ranks to its GPU's NUMA node",
            )
    bindings = plan(topology, nproc, mode)  # raises for socket/core-complex: those need torchrun's option
    how = "under numactl" if numactl else "with its CPUs pinned (numactl not found: memory is not bound)"
    return (
        launcher + [str(Path(__file__).resolve()), "--mode", mode, "--nproc", str(nproc), "--run", "--"],
        f"each rank starts through scripts/bind.py {how}: "
        + "; ".join(f"rank {b.local_rank} -> node {b.node}" for b in bindings),
    )


def run_bound(command: list[str], mode: str, nproc: int, topology: Topology, local_rank: int) -> None:
    """exec `python command...` bound to the local rank's node (numactl, else CPU affinity only)."""
    bindings = plan(topology, nproc, mode)
    argv = [sys.executable, *command]
    if bindings is None or local_rank >= len(bindings):
        os.execv(sys.executable, argv)
    b = bindings[local_rank]
    numactl = shutil.which("numactl")
    if numactl:
        os.execv(numactl, [numactl, *b.numactl_args(mode), *argv])
    os.sched_setaffinity(0, b.cpus)
    print(
        f"scripts/bind.py: rank {local_rank}: CPUs {format_cpulist(list(b.cpus))} (node {b.node}); numactl not "
        "found, so memory is placed by the kernel (first touch)",
        file=sys.stderr,
        flush=True,
    )
    os.execv(sys.executable, argv)


@dataclass(frozen=True)
class BindFlags:
    """How to bind, for how many ranks, from which topology, and what to do with the words after --."""

    mode: str = flag("node", help=f"{', '.join(MODES)} (1 and true mean node)")
    nproc: int | None = None
    """local ranks (default: LOCAL_WORLD_SIZE, else the GPUs found, else the NUMA nodes)"""
    sysfs: str = flag(factory=lambda: os.environ.get("BIND_SYSFS", "/sys"))
    """the sysfs root to read (env BIND_SYSFS; a made-up tree for tests)"""
    launcher: bool = flag(False, exclusive="what")
    """print the launcher words after -- with binding added, one per line (for the launchers)"""
    run: bool = flag(False, exclusive="what")
    """exec python with the words after -- bound to LOCAL_RANK's node (what each rank runs)"""
    rest: list[str] | None = flag(None, positional=True, nargs=argparse.REMAINDER)
    """-- then the launcher words (--launcher) or the script and its arguments (--run)"""


@dataclass(frozen=True)
class BindConfig(flags.Config):
    """Every flag of scripts/bind.py."""

    bind: BindFlags = field(default_factory=BindFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("bind",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "split"


def main(argv: list[str] | None = None) -> int:
    args = flags.parse(BindConfig, "python -m scripts.bind", __doc__, argv).bind
    mode = {"1": "node", "true": "node", "yes": "node"}.get(args.mode.lower(), args.mode.lower())
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    topology = read_topology(args.sysfs)
    topology.gpus = visible_gpus(topology.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    nproc = args.nproc or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or len(topology.gpus) or len(topology.nodes) or 1
    try:
        if args.launcher:
            if not rest:
                raise BindError("--launcher needs the launcher words after --")
            words, line = bound_launcher(rest, mode, nproc, topology)
            print(f"scripts/bind.py: {line}", file=sys.stderr, flush=True)
            print("\n".join(words))
            return 0
        if args.run:
            if not rest:
                raise BindError("--run needs a script (and its arguments) after --")
            local_rank = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))  # torchrun, else srun
            run_bound(rest, mode, nproc, topology, int(local_rank))
        if mode not in MODES:
            raise BindError(f"--mode {mode!r}: choose one of {', '.join(MODES)}")
        bindings = plan(topology, nproc, mode if mode in OWN_MODES else "node")
    except BindError as e:
        raise SystemExit(f"scripts/bind.py: {e}") from None
    print(describe(topology, bindings, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
