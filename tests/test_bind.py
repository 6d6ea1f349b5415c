"""scripts/bind.py on made-up topologies (sysfs trees written here): each local rank's NUMA node and CPUs, the
launcher rewrite (torchrun's own --numa-binding, else a per-rank numactl wrapper), the per-rank start-up for real
(with a stand-in numactl, and with CPU affinity where there is none), nothing bound on a one-node machine, and the
NUMA_BINDING hook of the launchers."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bind

# ----------------------------------------------------------------------------------------------------------------
# Made-up sysfs trees


def make_sysfs(
    root: Path,
    nodes: dict[int, str],
    gpus: dict[str, int] = (),
    siblings: int = 0,
    other_devices: dict[str, tuple[str, str]] = (),
) -> Path:
    """nodes: node -> cpulist; gpus: PCI address -> numa_node (NVIDIA 3D controllers); siblings: CPU k and
    k + siblings are hyper-threads of one core; other_devices: address -> (vendor, class)."""
    sysfs = root / "sys"
    for node, cpulist in nodes.items():
        folder = sysfs / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
        (folder / "meminfo").write_text("Node 0 MemTotal: 1 kB\n")
        for cpu in bind.parse_cpulist(cpulist):
            topo = sysfs / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
            topo.mkdir(parents=True)
            if siblings:
                core = cpu % siblings
                topo.joinpath("thread_siblings_list").write_text(f"{core},{core + siblings}\n")
            else:
                topo.joinpath("thread_siblings_list").write_text(f"{cpu}\n")
    (sysfs / "devices" / "system" / "node" / "possible").write_text("0\n")  # not a node folder: ignored
    devices = {address: ("0x10de", "0x030200", node) for address, node in dict(gpus).items()}
    devices.update({address: (vendor, klass, 0) for address, (vendor, klass) in dict(other_devices).items()})
    for address, (vendor, klass, node) in devices.items():
        folder = sysfs / "bus" / "pci" / "devices" / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(klass + "\n")
        (folder / "numa_node").write_text(f"{node}\n")
    return sysfs


# A DGX-like node: 2 sockets = 2 NUMA nodes of 8 cores with hyper-threads (CPU k and k + 16 share a core), 4 GPUs
# (two per node, listed out of PCI order on purpose), each GPU's HD-audio function (NVIDIA, class 0x0403), a NIC,
# and an HBM-like memory-only node 2 without CPUs.
DGX_NODES = {0: "0-7,16-23", 1: "8-15,24-31", 2: ""}
DGX_GPUS = {"0000:b7:00.0": 1, "0000:07:00.0": 0, "0000:0f:00.0": 0, "0000:bd:00.0": 1}
DGX_OTHERS = {
    "0000:07:00.1": ("0x10de", "0x040300"),
    "0000:b7:00.1": ("0x10de", "0x040300"),
    "0000:01:00.0": ("0x8086", "0x020000"),
}


@pytest.fixture
def dgx(tmp_path) -> Path:
    return make_sysfs(tmp_path, DGX_NODES, DGX_GPUS, siblings=16, other_devices=DGX_OTHERS)


def test_cpulist_round_trip():
    assert bind.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert bind.parse_cpulist("") == []
    assert bind.format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        bind.parse_cpulist("0-x")


def test_topology_and_node_mode(dgx):
    topology = bind.read_topology(dgx)
    assert topology.nodes == {0: list(range(8)) + list(range(16, 24)), 1: list(range(8, 16)) + list(range(24, 32))}
    assert [g.pci for g in topology.gpus] == ["0000:07:00.0", "0000:0f:00.0", "0000:b7:00.0", "0000:bd:00.0"]
    assert [g.numa_node for g in topology.gpus] == [0, 0, 1, 1]
    plan = bind.plan(topology, 4, "node")
    assert [(b.local_rank, b.node) for b in plan] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert plan[0].cpus == tuple(topology.nodes[0]) and plan[3].cpus == tuple(topology.nodes[1])
    assert plan[2].numactl_args("node") == ["--cpunodebind=1", "--membind=1"]
    assert "GPU 0000:b7:00.0 is on node 1" == plan[2].why


def test_exclusive_mode_splits_physical_cores(dgx):
    """Two ranks per node: each gets half of its node's 8 cores together with their hyper-threads."""
    plan = bind.plan(bind.read_topology(dgx), 4, "exclusive")
    assert [bind.format_cpulist(list(b.cpus)) for b in plan] == ["0-3,16-19", "4-7,20-23", "8-11,24-27", "12-15,28-31"]
    assert plan[1].numactl_args("exclusive") == ["--physcpubind=4-7,20-23", "--membind=0"]
    assert len({cpu for b in plan for cpu in b.cpus}) == 32  # disjoint, and every CPU used


def test_without_gpus_ranks_go_to_nodes_in_blocks(tmp_path):
    topology = bind.read_topology(make_sysfs(tmp_path, {0: "0-3", 1: "4-7"}))
    assert topology.gpus == []
    plan = bind.plan(topology, 4, "node")
    assert [b.node for b in plan] == [0, 0, 1, 1] and plan[0].why == "no GPU: rank block 1 of 2"
    assert [bind.format_cpulist(list(b.cpus)) for b in bind.plan(topology, 4, "exclusive")] == [
        "0-1",
        "2-3",
        "4-5",
        "6-7",
    ]
    assert [b.node for b in bind.plan(topology, 3, "node")] == [0, 0, 1]
    with pytest.raises(bind.BindError, match="node 0 has 4 physical cores for 6 ranks"):
        bind.plan(topology, 12, "exclusive")


def test_gpu_with_unknown_node_and_cuda_visible_devices(tmp_path):
    sysfs = make_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, {"0000:01:00.0": -1, "0000:02:00.0": 1})
    topology = bind.read_topology(sysfs)
    plan = bind.plan(topology, 2, "node")
    assert [b.node for b in plan] == [0, 1]
    assert plan[0].why == "GPU 0000:01:00.0 has no NUMA node: rank block 1 of 2"
    # CUDA_VISIBLE_DEVICES=1,0 puts the node-1 GPU first; an invalid index ends the list; UUIDs keep every GPU
    assert [g.pci for g in bind.visible_gpus(topology.gpus, "1,0")] == ["0000:02:00.0", "0000:01:00.0"]
    assert [g.pci for g in bind.visible_gpus(topology.gpus, "1,7,0")] == ["0000:02:00.0"]
    assert bind.visible_gpus(topology.gpus, "GPU-8f3c,GPU-11aa") == topology.gpus
    topology.gpus = bind.visible_gpus(topology.gpus, "1")
    assert [b.node for b in bind.plan(topology, 2, "node")] == [1, 1]  # rank 1 has no GPU: block 2 of 2


def test_one_numa_node_binds_nothing_and_says_so(tmp_path, capsys):
    sysfs = make_sysfs(tmp_path, {0: "0-1"}, {"0000:01:00.0": 0})
    topology = bind.read_topology(sysfs)
    assert bind.plan(topology, 2, "node") is None
    launcher = ["python", "-m", "torch.distributed.run", "--nproc_per_node=2"]
    words, line = bind.bound_launcher(launcher, "node", 2, topology, has_torchrun_option=True, numactl="/bin/true")
    assert words == launcher and line == "1 NUMA node: binding would change nothing; processes run unbound"
    assert bind.main(["--sysfs", str(sysfs)]) == 0
    assert "binding would change nothing" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bind.main(["--sysfs", str(empty)]) == 0
    assert "NUMA nodes: none in sysfs\nno NUMA nodes: binding would change nothing" in capsys.readouterr().out


def test_launcher_rewrite(dgx):
    topology = bind.read_topology(dgx)
    torchrun = ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    words, line = bind.bound_launcher(torchrun, "node", 4, topology, has_torchrun_option=True, numactl="/x/numactl")
    assert words == ["py", "-m", "torch.distributed.run", "--numa-binding=node", "--standalone", "--nproc_per_node=4"]
    assert "torchrun --numa-binding=node" in line
    script = str(Path(bind.__file__).resolve())
    wrapper = [script, "--mode", "exclusive", "--nproc", "4", "--run", "--"]
    for option, numactl in ((False, "/x/numactl"), (True, "")):  # an older torchrun, or no numactl for torchrun
        words, line = bind.bound_launcher(
            torchrun, "exclusive", 4, topology, has_torchrun_option=option, numactl=numactl
        )
        assert words == torchrun + wrapper
        assert line.endswith("rank 0 -> node 0; rank 1 -> node 0; rank 2 -> node 1; rank 3 -> node 1")
    words, _ = bind.bound_launcher(["py"], "node", 1, topology, has_torchrun_option=True, numactl="/x/numactl")
    assert words == ["py", script, "--mode", "node", "--nproc", "1", "--run", "--"]  # one process: no torchrun
    with pytest.raises(bind.BindError, match="socket needs torchrun's own --numa-binding"):
        bind.bound_launcher(torchrun, "socket", 4, topology, has_torchrun_option=False, numactl="/x/numactl")
    with pytest.raises(bind.BindError, match="NUMA_BINDING='bogus': choose one of node, exclusive"):
        bind.bound_launcher(torchrun, "bogus", 4, topology)


def test_installed_torchrun_option_is_detected():
    """The answer agrees with the installed torchrun's own --help (PyTorch 2.13 has --numa-binding)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert bind.torchrun_has_numa_binding() == ("--numa-binding" in help_text)


def _run_rank(sysfs: Path, local_rank: int, path_dir: Path, mode: str = "node") -> subprocess.CompletedProcess:
    child = "import os, sys; print(sorted(os.sched_getaffinity(0)), sys.argv[1:])"
    (path_dir / "child.py").write_text(child)
    env = {**os.environ, "PATH": str(path_dir), "LOCAL_RANK": str(local_rank), "BIND_SYSFS": str(sysfs)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.bind",
            "--mode",
            mode,
            "--nproc",
            "2",
            "--run",
            "--",
            str(path_dir / "child.py"),
            "--flag",
            "x",
        ],
        cwd=Path(bind.__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_each_rank_starts_under_numactl(tmp_path):
    """--run execs numactl with the rank's binding, then python with the script and its arguments (a stand-in
    numactl on PATH prints what it was given)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "numactl").write_text('#!/bin/sh\necho numactl "$@"\n')
    (bin_dir / "numactl").chmod(0o755)
    sysfs = make_sysfs(tmp_path, {0: "0-3", 1: "4-7"})
    out = _run_rank(sysfs, 1, bin_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "numactl",
        "--cpunodebind=1",
        "--membind=1",
        sys.executable,
        str(bin_dir / "child.py"),
        "--flag",
        "x",
    ]
    out = _run_rank(sysfs, 0, bin_dir, mode="exclusive")
    assert out.stdout.split()[:3] == ["numactl", "--physcpubind=0-3", "--membind=0"]  # alone on node 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin a process to the second one")
def test_each_rank_is_pinned_without_numactl(tmp_path):
    """No numactl: the rank's CPUs are set with sched_setaffinity and kept through exec (real, on this machine:
    node 1 of the made-up tree is this machine's second CPU)."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    sysfs = make_sysfs(tmp_path, {0: str(first), 1: str(second)})
    empty = tmp_path / "nothing"
    empty.mkdir()
    out = _run_rank(sysfs, 1, empty)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[{second}] ['--flag', 'x']"
    assert "numactl not found, so memory is placed by the kernel (first touch)" in out.stderr


@pytest.mark.parametrize("launcher", ["run_glue.sh", "run_squad.sh", "run_swag.sh"])
def test_launchers_take_numa_binding(launcher, repo_root, dgx, tmp_path):
    """NUMA_BINDING=node rewrites the launcher (here through the per-rank wrapper: no GPUs for torchrun to query);
    on a one-node machine the command is the one without NUMA_BINDING."""
    num_gpu_position = {"run_glue.sh": 7, "run_squad.sh": 6, "run_swag.sh": 6}[launcher]
    args = [""] * 16
    args[num_gpu_position - 1] = "2"
    plain = subprocess.run(
        ["bash", f"scripts/{launcher}", *args[:num_gpu_position]],
        cwd=repo_root,
        capture_output=True,
        text=True,
        env={**os.environ, "DRY_RUN": "1"},
        check=True,
    )
    bound = subprocess.run(
        ["bash", f"scripts/{launcher}", *args[:num_gpu_position]],
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DRY_RUN": "1", "BIND_SYSFS": str(dgx), "NUMA_BINDING": "node", "CUDA_VISIBLE_DEVICES": ""},
    )  # no GPUs: the numactl wrapper
    plain_cmd, bound_cmd = shlex.split(plain.stdout), shlex.split(bound.stdout)
    at = plain_cmd.index("--nproc_per_node=2") + 1
    wrapper = [str(Path(bind.__file__).resolve()), "--mode", "node", "--nproc", "2", "--run", "--"]
    assert bound_cmd == plain_cmd[:at] + wrapper + plain_cmd[at:]
    assert "rank 0 -> node 0; rank 1 -> node 1" in bound.stderr
    one_node = make_sysfs(tmp_path / "one", {0: "0-1"})
    same = subprocess.run(
        ["bash", f"scripts/{launcher}", *args[:num_gpu_position]],
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DRY_RUN": "1", "BIND_SYSFS": str(one_node), "NUMA_BINDING": "1"},
    )
    assert shlex.split(same.stdout) == plain_cmd and "binding would change nothing" in same.stderr
    bad = subprocess.run(
        ["bash", f"scripts/{launcher}", *args[:num_gpu_position]],
        cwd=repo_root,
        capture_output=True,
        text=True,
        env={**os.environ, "DRY_RUN": "1", "BIND_SYSFS": str(dgx), "NUMA_BINDING": "sockets"},
    )
    assert bad.returncode != 0 and "NUMA_BINDING='sockets': choose one of" in bad.stderr
