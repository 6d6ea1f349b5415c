"""The GPU speed call, rehearsed at tiny size on the CPU, and the profiler it reads.

bench/gpu_pretraining.sh over shards from `bench.gpu_speed prepare`: its default call (the same stages and rows, in
the same order, small and compiled with aot_eager) times every row it lists, graph rows included, with gradients
accumulated over two micro-batches; every path finishes and is summarised with its profile and its ratio to
transformers, and the rates follow from the layouts. `gpu_speed hf` gives transformers the shards' labels; the
dropout probe measures a kernel's rate and tells a rounded one; the microbenchmarks run. profiling.py: the GPU's busy
time is the union of the kernels' intervals (against a brute-force count), real H200 kernel names fall into the
right parts of a step, graph and kernel launches are counted, and run_pretraining.py --profile_steps writes a profile
whose summarising is not counted as training time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import args_for, make_shards, read_log, subprocess_env, write_config

import run_pretraining as rp
from bench import gpu_speed
from bench.study_utils import read_shards
from bert_recipe.training import profiling
from modeling import BertConfig

REPO = Path(__file__).resolve().parents[1]
ROWS = (
    "p1_padded_eager p1_unpadded_eager p1_packed_eager p1_hf_eager p2_padded_eager p2_sdpa_eager p2_hf_eager "
    "p2_unpadded_eager_m4 p2_hf_eager_m4 p1_fp8_eager p1_fixed_eager p1_graph_eager "
    "p1_bits_eager p1_nodrop_eager p2_padded_eager_m3"
)  # m3: no micro-batch of 3 divides 4
SMALL = {  # the call's sizes on the CPU: a step of two micro-batches, a granule of 16 tokens
    "BATCH1": "8",
    "ACC1": "2",
    "BATCH2": "4",
    "ACC2": "2",
    "GRANULE": "16",
    "PRECISION": "fp32",
    "WORKERS": "1",
    "OMP_NUM_THREADS": "1",
    "LOG_FREQ": "1",
}


@pytest.fixture(scope="module")
def speed_data(tmp_path_factory, shared_data, uncased_vocab) -> Path:
    """`gpu_speed prepare` on one file of the Wikipedia slice, with a one-layer model in place of BERT-large."""
    tmp = tmp_path_factory.mktemp("gpu_speed")
    tiny = tmp / "tiny.json"
    BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    ).to_json_file(tiny)
    gpu_speed.main(
        [
            "prepare",
            "--out",
            str(tmp / "data"),
            "--files",
            "1",
            "--config",
            str(tiny),
            "--workers",
            "1",
            "--slice",
            str(shared_data / "wikipedia-en-slice" / "text" / "AA"),
            "--vocab",
            str(uncased_vocab),
        ]
    )
    return tmp / "data"


def test_prepare_writes_both_phases_plain_and_packed_and_every_config(speed_data):
    """The shards of both phases, plain and packed, and the configs: BERT-large's architecture (no execution
    setting: the rows give those as flags), and the same with attention dropout 0; two-layer copies for the smoke."""
    report = json.loads((speed_data / "prepare.json").read_text())
    for phase in (1, 2):
        assert 0 < report["rows"][f"p{phase}_packed"] < report["rows"][f"p{phase}_plain"]  # rows hold >1 sequence
    configs = {name: json.loads((speed_data / f"config_{name}.json").read_text()) for name in gpu_speed.CONFIGS}
    assert set(configs["base"]) <= {f.name for f in dataclasses.fields(BertConfig)}
    assert configs["nodrop"] == {**configs["base"], "attention_probs_dropout_prob": 0.0}
    smoke = json.loads((speed_data / "config_base_smoke.json").read_text())
    assert smoke == {**configs["base"], "num_hidden_layers": min(2, configs["base"]["num_hidden_layers"])}


def run_call(data: Path, out: Path, **settings: str) -> subprocess.CompletedProcess:
    """bench/gpu_pretraining.sh over `data` at SMALL's sizes (one warm-up, profiled and two timed steps unless
    `settings` say otherwise), its files in `out`; it must exit 0."""
    env = {**os.environ, **SMALL, "OUT": str(out), "PYTHON": sys.executable, "WARMUP": "1", "PROFILE": "1"}
    env.update({"TIMED": "2", **settings})
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_pretraining.sh"), str(data)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def test_the_default_call_times_every_row_it_lists(speed_data, tmp_path):
    """The call as it will run on the GPU (its default ROWS, probe, smoke and deadline), small and compiled with
    aot_eager on the CPU: the probe writes dropout.json, every path's smoke accumulates two micro-batches over three
    steps and passes, and every listed row is timed within the 9-minute deadline, in order. The graph rows replay
    (stable gradients, evaluation and summary under their rules) and train the same model as the packed rows."""
    out = tmp_path / "out"
    started = time.monotonic()
    done = run_call(speed_data, out, COMPILE_BACKEND="aot_eager")
    assert time.monotonic() - started < 540, done.stdout[-2000:]
    listed = json.loads((out / "call.json").read_text())["settings"]["rows"].split()
    assert listed == [
        "p1_graph_compile",
        "p2_graph_compile",
        "p1_packed_compile",
        "p2_packed_compile",
        "p2_nodrop_compile",
    ]
    smoke = [line.split()[:2] for line in (out / "smoke.txt").read_text().splitlines()]
    assert smoke == [[key, "pass"] for key in ("p1_graph_compile", "p1_packed_compile", "p1_nodrop_compile")], smoke
    rows = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in rows] == listed and all(r["finished"] for r in rows), done.stdout[-3000:]
    assert "skip" not in done.stdout
    by_name = {r["run"]: r for r in rows}
    for phase in (1, 2):  # the same model and batches; dropout draws over the static layout's extra rows too, so
        # its masks differ from the packed row's after the first (tests/test_padding.py: no number changes without)
        graph, packed = by_name[f"p{phase}_graph_compile"], by_name[f"p{phase}_packed_compile"]
        assert math.isclose(graph["final_loss"], packed["final_loss"], rel_tol=1e-3), (graph, packed)
        assert graph["cudagraph_skips"] == 0 and packed.get("cudagraph_skips") is None
    probe = json.loads((out / "dropout.json").read_text())
    assert probe["paths"]["sdpa_as_the_recipe_runs"]["exact"] and "cudnn" in probe
    assert "cudnn" in (out / "gpu.txt").read_text()


def test_call_script_runs_every_path_and_summarises(speed_data, tmp_path):
    out = tmp_path / "out"
    done = run_call(speed_data, out, ROWS=ROWS, SMOKE="0", PROBE="0")  # the smoke and the probe: the test above
    assert sorted(p.name for p in out.iterdir()) == [
        "call.json",
        "call.log",
        "gpu.txt",
        "logs.tar.gz",
        "summary.json",
        "summary.md",
    ]  # the device tool returns 8
    assert json.loads((out / "call.json").read_text())["settings"]["rows"] == ROWS
    rows = {r["run"]: r for r in json.loads((out / "summary.json").read_text())}
    assert sorted(rows) == sorted(ROWS.split()[:-1])
    assert "skip p2_padded_eager_m3: the micro-batch must divide the phase's 4 rows a step" in done.stdout
    assert all(r["finished"] and r["exit"] == 0 for r in rows.values()), done.stdout
    assert {n: r["micro_batch"] for n, r in rows.items() if "_m4" in n or n.startswith("p2_hf")} == {
        "p2_unpadded_eager_m4": 4,
        "p2_hf_eager_m4": 4,
        "p2_hf_eager": 2,
    }  # BATCH2 4 in ACC2 2, or in 1 of 4
    for name, r in rows.items():
        seq = 128 if r["phase"] == 1 else 512
        if r["layout"] in ("packed", "graph", "nodrop"):  # a packed row is one to three sequences
            assert r["rows_per_s"] < r["sequences_per_s"] <= 3.05 * r["rows_per_s"]
        else:
            assert math.isclose(r["sequences_per_s"], r["rows_per_s"], rel_tol=0.05)  # two clock readings
        assert 0.3 * seq * r["rows_per_s"] < r["tokens_per_s"] <= seq * r["rows_per_s"] * 1.001  # padding excluded
        peer = rows[f"p{r['phase']}_hf_eager" + ("_m4" if name.endswith("_m4") else "")]  # the same micro-batch
        assert math.isclose(r["ratio_to_transformers"], r["tokens_per_s"] / peer["tokens_per_s"], rel_tol=1e-9)
        assert r["profile"]["steps"] == 1 and r["profile"]["operators"], name  # a CPU profile: operators
        assert math.isfinite(r["final_loss"]) and f"| {r['final_loss']:.3f} |" in (out / "summary.md").read_text()
    # float8 products train the same model on the same batches: its last loss is the unpadded row's, within
    # float8's rounding
    fp8_loss, plain_loss = rows["p1_fp8_eager"]["final_loss"], rows["p1_unpadded_eager"]["final_loss"]
    assert fp8_loss != plain_loss and abs(fp8_loss - plain_loss) < 0.05 * plain_loss, (fp8_loss, plain_loss)
    # the static-shape layouts train the same model on the same batches as their dynamic rows
    for static, dynamic in (("p1_fixed_eager", "p1_unpadded_eager"), ("p1_graph_eager", "p1_packed_eager")):
        assert math.isclose(rows[static]["final_loss"], rows[dynamic]["final_loss"], rel_tol=1e-4), static
    table = (out / "summary.md").read_text()
    assert table.count("\n") == 2 + len(rows) and "| 2 | sdpa | eager | 2 |" in table
    # The results page renders the call from its folder (the log-line rates come from logs.tar.gz).
    page = gpu_speed.markdown(out)
    assert all(f"| {r['phase']} | {r['layout']} eager | {r['micro_batch']} |" in page for r in rows.values())
    assert gpu_speed.steady_rates(out).keys() == {n for n in rows if "_hf_" not in n}


def test_the_smoke_runs_each_path_once_first_and_a_failed_path_is_not_timed(speed_data, tmp_path):
    """SMOKE=1: before any row, each path and mode once with two layers and two steps; smoke.txt says pass or fail
    with the error's last line; a row whose path failed (here float8, with a torchao that cannot import) is not
    timed, the others are. p2_padded_eager shares p1_padded_eager's smoke."""
    stub = tmp_path / "stub" / "torchao"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('this torchao is broken')\n")
    out = tmp_path / "out"
    pythonpath = str(stub.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")
    done = run_call(
        speed_data,
        out,
        ROWS="p1_padded_eager p1_fp8_eager p2_padded_eager",
        PROBE="0",
        PROFILE="0",
        TIMED="1",
        PYTHONPATH=pythonpath,
    )
    smoke = (out / "smoke.txt").read_text().splitlines()
    assert [line.split()[:2] for line in smoke] == [["p1_padded_eager", "pass"], ["p1_fp8_eager", "fail:"]], smoke
    assert "torchao" in smoke[1]
    assert "skip p1_fp8_eager: its smoke (p1_fp8_eager) did not pass" in done.stdout
    log = done.stdout
    assert log.index("smoke p1_fp8_eager") < log.index("row p1_padded_eager")  # every smoke before any row
    rows = {r["run"] for r in json.loads((out / "summary.json").read_text())}
    assert rows == {"p1_padded_eager", "p2_padded_eager"}


def test_every_user_path_runs_once_before_the_rows(speed_data, tmp_path):
    """bench/gpu_user_paths.sh (the call's first stage): one pre-training step, then fine-tuning on each task from
    its checkpoint, both inference modes, feature extraction and the ONNX export, each its own process on prepare's
    tiny inputs (real MRPC pairs and SQuAD questions); one line each in user_paths.txt, here all passing."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PRECISION": "fp32", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_user_paths.sh"), str(speed_data)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = (out / "user_paths.txt").read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [
        [name, "pass"]
        for name in (
            "run_pretraining",
            "run_glue",
            "run_squad",
            "run_swag",
            "inference_qa",
            "inference_classify",
            "extract_features",
            "onnx_export",
        )
    ], lines


def test_call_script_refuses_a_folder_that_prepare_did_not_make(tmp_path):
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_pretraining.sh"), str(tmp_path)],
        env={**os.environ, "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "python -m bench.gpu_speed prepare" in done.stderr


def test_the_dropout_probe_measures_a_kernels_rate_and_tells_a_rounded_one(tmp_path):
    """dropout_rate on outputs written out for a kernel that drops 1/16 and scales for 1/16 (cuDNN's rounding of 0.1)
    and for one that drops 0.1 exactly: the measured rates are those; the probe on this CPU's kernels finds torch's
    and the recipe's padded SDPA exact at 0.1 and reports the kernels it has not as errors, in one JSON."""
    S = 64
    for p in (0.0625, 0.1, 0.125):
        keep = torch.rand(8, 16, S, S, generator=torch.Generator().manual_seed(0)) >= p
        out = keep * (1 / S) / (1 - p)
        rate, scale_rate = gpu_speed.dropout_rate(out, S)
        assert abs(rate - p) < 0.003 and abs(scale_rate - p) < 1e-6
    report = gpu_speed.main(["dropout_probe", "--out", str(tmp_path), "--cpu", "--heads", "4"])
    assert json.loads((tmp_path / "dropout.json").read_text()) == report
    paths = report["paths"]
    assert paths["sdpa_as_torch_routes"]["exact"] and paths["sdpa_as_the_recipe_runs"]["exact"]
    assert paths["sdpa_math"]["exact"] and "error" in paths["sdpa_cudnn_attention"]  # no cuDNN on a CPU


@pytest.mark.parametrize("bench", ["ffn", "layer"])
def test_the_microbenchmarks_run_and_report_both_sides(bench, tmp_path):
    """bench/gpu_micro.py, small on the CPU with aot_eager: both variants timed, the kernels (here operators) each
    ran listed for ffn, and the JSON written."""
    from bench import gpu_micro

    args = ["--out", str(tmp_path), "--tokens", "256", "--hidden", "64", "--steps", "2", "--cpu"]
    result = gpu_micro.main([bench, *args, "--backend", "aot_eager"])
    assert json.loads((tmp_path / f"gpu_micro_{bench}.json").read_text()) == result
    sides = ("default", "max-autotune-no-cudagraphs") if bench == "ffn" else ("torch_dropout", "bit_masks")
    assert all(result[side]["ms"] > 0 for side in sides)
    if bench == "ffn":
        assert all("aten::addmm" in result[side]["kernels"] for side in sides)


def test_transformers_gets_the_shards_labels(tmp_path):
    """hf_labels: the original token at each used slot's position (a slot at position 0 is unused), -100 everywhere
    else, against a slot-by-slot reference written here."""
    folder = make_shards(tmp_path / "shards", n_shards=1, short_rows=3)
    arrays = read_shards(folder)
    seq = arrays["input_ids"].shape[1]
    labels = gpu_speed.hf_labels(arrays["masked_lm_positions"], arrays["masked_lm_ids"], seq)
    expected = np.full_like(labels, -100)
    for row, (positions, ids) in enumerate(zip(arrays["masked_lm_positions"], arrays["masked_lm_ids"])):
        for position, token in zip(positions, ids):
            if position > 0:
                expected[row, position] = token
    np.testing.assert_array_equal(labels, expected)


# ---------------------------------------------------------------------------------------------------------------
# profiling.py


def test_busy_time_is_the_union_of_the_kernels_intervals():
    rng = np.random.default_rng(0)
    for _ in range(20):
        starts = rng.integers(0, 1000, 30)
        intervals = [(int(s), int(s + rng.integers(1, 80))) for s in starts]
        covered = np.zeros(1200, dtype=bool)  # brute force on integer time steps
        for s, e in intervals:
            covered[s:e] = True
        assert profiling.busy_time(intervals) == covered.sum()


def test_idle_time_is_attributed_to_the_host_ranges_that_overlap_it():
    """idle_intervals / idle_by_host against a brute force on integer time steps: the idle steps are those no
    kernel covers; a host range's share is the idle steps inside it; uncovered, the idle steps inside none."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        kernels = [(int(s), int(s + rng.integers(1, 60))) for s in rng.integers(0, 1000, 25)]
        host = [(f"op{rng.integers(0, 4)}", int(s), int(s + rng.integers(1, 120))) for s in rng.integers(0, 1000, 15)]
        busy = np.zeros(1100, dtype=bool)
        for s, e in kernels:
            busy[s:e] = True
        idle = ~busy  # the window is [0, 1100)
        gaps = profiling.idle_intervals(kernels, 0, 1100)
        assert sum(e - s for s, e in gaps) == idle.sum()
        by_name, uncovered = profiling.idle_by_host(gaps, host)
        under_any = np.zeros(1100, dtype=bool)
        for name in {n for n, _, _ in host}:
            inside = np.zeros(1100, dtype=bool)
            for n, s, e in host:
                if n == name:
                    inside[s:e] = True
            under_any |= inside
            # one name's ranges may overlap each other: each counts its own overlap
            expected = sum(int(idle[s:e].sum()) for n, s, e in host if n == name)
            assert by_name[name] == expected
        assert uncovered == (idle & ~under_any).sum()


def test_a_gpu_profile_says_what_the_host_did_while_the_gpu_waited():
    """device_summary over a written-out scene (microseconds): kernels at [0, 10) and [30, 40); on the host the data
    loader's __next__ at [10, 25) and a compiled region at [25, 45) holding an aten op at [26, 29); the window ends
    at 45. The GPU waits [10, 30) and [40, 45): 15 us under the data loader, 5 + 5 under the compiled region, none
    uncovered; two gaps in one step."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(i, name, start, end, device=DeviceType.CPU, thread=1):
        return FunctionEvent(id=i, name=name, thread=thread, start_us=start, end_us=end, device_type=device)

    loader = event(1, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 10, 25)
    region, op = event(2, "Torch-Compiled Region: 0/0", 25, 45), event(3, "aten::mm", 26, 29)
    region.append_cpu_child(op)
    op.set_cpu_parent(region)
    kernels = [
        event(4, "nvjet_sm90_tst_128x256", 0, 10, DeviceType.CUDA, 7),
        event(5, "triton_poi_fused_gelu_0", 30, 40, DeviceType.CUDA, 7),
    ]
    summary = profiling.StepProfiler(steps=1, device=torch.device("cpu")).device_summary([loader, region, op, *kernels])
    assert summary["busy_ms"] == pytest.approx(0.020) and summary["idle_ms_per_step"] == pytest.approx(0.025)
    assert summary["idle_gaps_per_step"] == 2 and summary["kernels_per_step"] == 2
    assert summary["idle_by_host"] == pytest.approx({loader.name: 0.015, region.name: 0.010})
    assert summary["idle_uncovered_ms_per_step"] == pytest.approx(0.0)
    assert summary["host_ops"] == pytest.approx({loader.name: 0.015, region.name: 0.017, "aten::mm": 0.003})
    assert summary["graph_launches_per_step"] == 0 and summary["kernel_launches_per_step"] == 0
    launches = [event(10 + i, name, 1, 2) for i, name in enumerate(["cudaGraphLaunch", "cudaLaunchKernel"] * 2)]
    counted = profiling.launches_per_step([*launches, *kernels], steps=2)
    assert counted == {"graph_launches_per_step": 1.0, "kernel_launches_per_step": 1.0}


@pytest.mark.parametrize(
    "name, part",
    [  # kernel names from H200 profiles (bench/results)
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x6_nt_align8>", "matmul"),
        ("triton_tem_fused_addmm_0", "matmul"),
        (
            "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>",
            "attention",
        ),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", "attention"),
        (
            "triton_per_fused__to_copy_add_native_dropout_native_layer_norm_native_layer_norm_backward_view_6",
            "fused (compiled)",
        ),
        ("triton_poi_fused_gelu_gelu_backward_4", "fused (compiled)"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::TensorListMetadata<4>>",
            "optimizer",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "copy"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
            "element-wise (eager)",
        ),
        # ATen's sum over the tokens for a bias gradient, whose name holds a "lambda" (it was filed under "optimizer")
        (
            "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
            "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::"
            "{lambda(float, float)#1}>>>",
            "element-wise (eager)",
        ),
    ],
)
def test_kernels_fall_into_the_parts_of_a_step(name, part):
    assert profiling.category(name) == part


def test_profile_steps_write_a_profile_not_counted_as_training(tmp_path, monkeypatch):
    """--profile_steps 2 after one warm-up step: profile.json in --output_dir ranks the operators of the profiled
    steps (on a CPU, by their own time); summarising the profile takes the host a while and the throughput that
    FINAL reports must not include it. The clock is a counter (1 ms a reading), and the summary moves it on by
    1,000 s: counted, it would leave the 5 timed steps of 8 rows under 0.05 rows/s, whatever the machine's load."""
    clock = {"now": 0.0}

    def counter() -> float:
        clock["now"] += 0.001
        return clock["now"]

    real_stop = profiling.StepProfiler.stop

    def slow_stop(self):
        summary = real_stop(self)
        clock["now"] += 1000.0
        return summary

    monkeypatch.setattr(time, "perf_counter", counter)
    monkeypatch.setattr(profiling.StepProfiler, "stop", slow_stop)
    data, config = make_shards(tmp_path / "data"), write_config(tmp_path / "config.json")
    out = tmp_path / "out"
    assert (
        rp.main(
            args_for(
                data,
                config,
                out,
                "--max_steps",
                "8",
                "--throughput_warmup_steps",
                "1",
                "--profile_steps",
                "2",
                "--skip_checkpoint",
                "--log_freq",
                "1",
            )
        )
        == 0
    )
    profile = json.loads((out / "profile.json").read_text())
    assert profile["steps"] == 2 and profile["operators"]
    assert any(op["name"].startswith("aten::") for op in profile["operators"])
    assert 0.5 < sum(op["share"] for op in profile["operators"]) <= 1.0 + 1e-9  # the top ones: most of the time
    final = next(r["data"] for r in read_log(out / "log.json") if r["step"] == "FINAL")
    assert final["training_sequences_per_second"] > 1.0, final  # 40 rows over the readings of 5 steps


def test_a_cpu_profile_ranks_the_operators_without_loading_inductor():
    """On a CPU, StepProfiler ranks the operators of the profiled window by their own time, and (in a fresh
    interpreter, as run_pretraining.py --profile_steps starts one) leaves torch._inductor unimported."""
    probe = (
        "import sys, torch\nfrom bert_recipe.training import profiling\n"
        "p = profiling.StepProfiler(steps=1, device=torch.device('cpu'))\n"
        "x = torch.randn(64, 64)\n"
        "torch.mm(x, x)\n"
        "p.start()\n"
        "for _ in range(3): y = torch.mm(x, x).relu()\n"
        "s = p.stop()\n"
        "names = [o['name'] for o in s['operators']]\n"
        "assert 'aten::mm' in names and 'aten::relu' in names, names\n"
        "assert {o['calls'] for o in s['operators'] if o['name'] == 'aten::mm'} == {3}, s\n"
        "assert 'torch._inductor' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_profile_steps_need_a_warm_up(tmp_path):
    data, config = make_shards(tmp_path / "data"), write_config(tmp_path / "config.json")
    with pytest.raises(SystemExit, match="--profile_steps profiles the steps after the warm-up"):
        rp.main(args_for(data, config, tmp_path / "out", "--profile_steps", "2", "--throughput_warmup_steps", "0"))
