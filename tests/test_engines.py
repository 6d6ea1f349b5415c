"""The data pipeline on every engine (bert_recipe/prep/engine.py): the same HDF5 arrays from one process, two processes,
a local Dask cluster, and a Dask scheduler with two workers started apart through a scheduler file (as srun starts
them); a worker killed -9 mid-stage changes nothing; a rerun after a killed run computes only what its manifest
does not list; `sbatch data/prep.sub` on the real one-machine Slurm gives the same arrays and leaves no process;
Parquet input; dump pieces (a multistream dump with its index, numbered part files) format like the whole dump;
and each bad input (a missing scheduler file, a scheduler that does not answer, workers outside the checkout, a
Parquet file without the text column, a corrupt dump piece) is one line and a non-zero exit, nothing half-written.

The corpus is real: two WikiExtractor files of the Wikipedia slice in ../shared/data, each cut to the first half
of its articles (45 articles).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import documented_commands as docs
import h5py
import numpy as np
import pytest
from dask_processes import DaskProcesses
from slurm_cluster import free_port
from test_text_formatting import NS, PAGES, _xml_escape, corpus_text, write_dump

from bench.bench_prep_engines import projection
from bert_recipe.io.processes import pid_alive
from bert_recipe.prep import text_formatting as tf
from data import bertPrep

REPO = Path(__file__).resolve().parent.parent
SHARDS = ["--n_training_shards", "6", "--n_test_shards", "1", "--fraction_test_set", "0.1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data) -> Path:
    """Two WikiExtractor files, each the first half of a real one's articles (19 + 26 of 38 + 53, 1.1 of 2.0 MB):
    still two input files and several articles in each of the 7 shards, and half the text for the ~75
    create_pretraining_data.py runs of this module to tokenize."""
    folder = tmp_path_factory.mktemp("wikiextractor")
    for name in ("wiki_00.gz", "wiki_01.gz"):
        with gzip.open(shared_data / "wikipedia-en-slice" / "text" / "AA" / name, "rt", encoding="utf-8") as f:
            articles = f.read().split("</doc>\n")[:-1]
        with gzip.open(folder / name, "wt", encoding="utf-8") as f:
            f.write("".join(a + "</doc>\n" for a in articles[: len(articles) // 2]))
    return folder


def prep(work: Path, action: str, *extra: str) -> None:
    assert (
        bertPrep.main(
            [
                "--action",
                action,
                "--dataset",
                "wikicorpus_en",
                "--working_dir",
                str(work),
                "--no_progress",
                *SHARDS,
                *extra,
            ]
        )
        == 0
    )


def pipeline(work: Path, corpus: Path, vocab: Path, *engine: str) -> Path:
    """text_formatting -> sharding -> phase 1 HDF5 on the engine given; returns the HDF5 folder."""
    prep(work, "text_formatting", "--wikiextractor_dir", str(corpus), *engine)
    prep(work, "sharding", *engine)
    prep(work, "create_hdf5_files", "--vocab_file", str(vocab), "--dupe_factor", "1", *engine)
    return next(work.glob("hdf5_*")) / "wikicorpus_en"


def arrays(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for path in sorted(folder.rglob("*.hdf5")):
        with h5py.File(path, "r") as f:
            out[str(path.relative_to(folder))] = {k: f[k][()] for k in f}
    return out


def assert_same_arrays(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and len(a) == 7
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        for key in a[name]:
            np.testing.assert_array_equal(a[name][key], b[name][key], err_msg=f"{name}:{key}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus, uncased_vocab) -> dict:
    """One process: the arrays every other engine must give."""
    work = tmp_path_factory.mktemp("one_process")
    folder = pipeline(work, corpus, uncased_vocab, "--n_processes", "1")
    return {"arrays": arrays(folder), "work": work}


@pytest.fixture(scope="module")
def running_cluster(tmp_path_factory):
    """A scheduler and two workers started apart for the module (test_a_worker_killed_mid_stage_changes_nothing
    kills one and starts another in its place)."""
    cluster = DaskProcesses(tmp_path_factory.mktemp("dask"), workers=2)
    yield cluster
    cluster.stop()
    assert cluster.alive() == []  # no scheduler or worker left, the killed one's group included


@pytest.fixture
def dask_cluster(running_cluster):
    """The module's cluster with both of its workers joined: whatever ran before, a test sees two."""
    running_cluster.wait_for_workers(2, 60)
    return running_cluster


# ---------------------------------------------------------------------------------------------------------------
# The same arrays everywhere


@pytest.fixture(scope="module")
def documented_runs(tmp_path_factory, shared_data, uncased_vocab) -> dict[str, Path]:
    """Each way README.md and data/README.md show to make the shards on one machine, run as written (a fresh login
    shell from the checkout; tests/README.md, "Every documented command") on a few real articles: one process
    (N_PROCESSES=1, a documented variable), a local Dask cluster, a Dask scheduler and workers started by hand from
    the folder above the checkout, and the slice command of data/README.md. Their working folders by command line."""
    tmp = tmp_path_factory.mktemp("documented")
    corpus = docs.tiny_wikiextractor(tmp_path_factory.mktemp("extracted"), shared_data)
    small = {
        **docs.SMALL_PIPELINE,
        "N_TEST_SHARDS": "2",
        "VOCAB_FILE": str(uncased_vocab),
        "WIKIEXTRACTOR_DIR": str(corpus),
    }
    works = {}
    for session in docs.sessions_for("test_the_documented_ways_give_the_same_shards"):
        work = tmp / f"work{len(works)}"
        from_above = session[0].text.startswith("cd ")  # `cd bert`: the folder above the checkout
        replace = {
            "/data/bert": str(work),
            "/shared/bert": str(work),
            "/data/wiki": str(work),
            "8": "2",
            "16": "2",
            "vocab.txt": str(uncased_vocab),
            "/shared/sched.json": str(tmp / "scheduler.json"),
            "bert": REPO.name,
            "../shared/data/wikipedia-en-slice/text": str(corpus),
            "32": "2",
            "0.02": "0.2",
        }
        env = {**small, "N_PROCESSES": "1"} if session[0].text.startswith("DATA_DIR=") else small
        docs.run(
            session,
            cwd=REPO.parent if from_above else REPO,
            env=env,
            background=len(session) > 1,
            replace={k: v for k, v in replace.items() if any(re.search(docs.word(k), c.text) for c in session)},
            timeout=300,
        )
        works[session[-1]] = work
    return works


def test_the_documented_ways_give_the_same_shards(documented_runs):
    """One process, two processes, a local Dask cluster and a scheduler with workers started apart: the same
    formatted text, text shards and HDF5 arrays of both phases, byte for byte, and each run's log names its engine."""
    (first, reference), *others = documented_runs.items()
    assert len(others) == 3
    for phase in ("seq_len_128", "seq_len_512"):
        expected = arrays(next(reference.glob(f"hdf5_*{phase}_*")) / "wikicorpus_en")
        assert len(expected) == 4 and all(a["input_ids"].shape[0] > 0 for a in expected.values())
        for command, work in others:
            got = arrays(next(work.glob(f"hdf5_*{phase}_*")) / "wikicorpus_en")
            assert got.keys() == expected.keys(), command.text
            for name in got:
                for key in got[name]:
                    np.testing.assert_array_equal(
                        got[name][key], expected[name][key], err_msg=f"{command.text}: {name}"
                    )
    for command, work in others:
        for path in sorted(reference.rglob("*.txt")):
            assert (work / path.relative_to(reference)).read_bytes() == path.read_bytes(), (command.text, path.name)
    engines = []
    for work in documented_runs.values():
        log = [json.loads(line) for line in (work / "bertPrep_log.jsonl").read_text().splitlines()]
        engines.append(
            {
                (r["data"]["engine"], r["data"]["workers"] if r["data"]["engine"] == "dask" else None)
                for r in log
                if r["step"] == "engine"
            }
        )
    # A stage counts the workers joined when it starts: the local cluster starts both before the first stage, while
    # workers started by hand beside the command may still be joining when it begins (Dask gives them tasks as they
    # join; the arrays above are the same either way).
    hand_started = engines.pop(2)
    assert engines == [{("processes", None)}, {("dask", 2)}, {("processes", None)}], engines
    assert hand_started and hand_started <= {("dask", 1), ("dask", 2)}, hand_started


def test_a_vocabulary_learned_on_dask_equals_one_learned_in_one_process(reference, dask_cluster, tmp_path):
    """create_vocab's counting pass split into pieces across two workers: the same vocab.txt byte for byte."""
    common = [
        "--action",
        "create_vocab",
        "--dataset",
        "wikicorpus_en",
        "--working_dir",
        str(reference["work"]),
        "--vocab_size",
        "3000",
        "--no_progress",
    ]  # the formatted corpus: its folder of parts
    assert bertPrep.main([*common, "--vocab_file", str(tmp_path / "one.txt"), "--n_processes", "1"]) == 0
    assert (
        bertPrep.main(
            [
                *common,
                "--vocab_file",
                str(tmp_path / "dask.txt"),
                "--engine",
                "dask",
                "--dask_scheduler_file",
                str(dask_cluster.scheduler_file),
            ]
        )
        == 0
    )
    assert (tmp_path / "dask.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
    assert len((tmp_path / "one.txt").read_text().splitlines()) == 3000


def text_stages_of(reference_work: Path, work: Path) -> Path:
    """A working folder holding the reference's formatted text and text shards (the HDF5 stage's input)."""
    work.mkdir(parents=True)
    for name in ("formatted_one_article_per_line", next(reference_work.glob("sharded_*")).name):
        subprocess.run(["cp", "-r", str(reference_work / name), str(work)], check=True)
    return work


def test_a_worker_killed_mid_stage_changes_nothing(reference, uncased_vocab, dask_cluster, tmp_path):
    """Two workers (the module's cluster); the HDF5 stage starts; once its manifest lists a file, one worker's
    process group (nanny, worker and the create_pretraining_data.py it runs) gets SIGKILL. Its tasks run again on
    the other worker and the arrays are the reference's. A new worker then takes the killed one's place (that no
    process of the killed group is left is checked when the module's cluster stops)."""
    from concurrent.futures import ThreadPoolExecutor

    work = text_stages_of(reference["work"], tmp_path / "work")
    cluster, pool, run = dask_cluster, ThreadPoolExecutor(1), None
    try:
        argv = [
            "--action",
            "create_hdf5_files",
            "--dataset",
            "wikicorpus_en",
            "--working_dir",
            str(work),
            "--no_progress",
            *SHARDS,
            "--vocab_file",
            str(uncased_vocab),
            "--dupe_factor",
            "1",
            "--engine",
            "dask",
            "--dask_scheduler_file",
            str(cluster.scheduler_file),
        ]
        # The stage's client runs here, in a thread (the kill is the worker's, not the client's): no second
        # interpreter importing Dask for it.
        run = pool.submit(bertPrep.main, argv)
        manifest = (
            work / "hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe"
            "_factor_1" / "wikicorpus_en" / "manifest.json"
        )
        deadline = time.monotonic() + 120
        while not (manifest.is_file() and json.loads(manifest.read_text())["outputs"]):
            assert not run.done() and time.monotonic() < deadline, run.result() if run.done() else "timeout"
            time.sleep(0.05)
        done_at_kill = len(json.loads(manifest.read_text())["outputs"])
        cluster.kill(cluster.workers[0])
        assert run.result(timeout=180) == 0
        assert done_at_kill < 7  # the stage was under way
        assert_same_arrays(arrays(manifest.parent), reference["arrays"])
    finally:
        if run is not None and not run.done():  # a failed test: a client still waiting fails once the cluster is gone
            cluster.stop()
        pool.shutdown(wait=False)
        cluster.replace_worker(0)


def test_a_rerun_after_a_killed_run_computes_only_the_missing_outputs(reference, uncased_vocab, tmp_path, capsys):
    work = text_stages_of(reference["work"], tmp_path / "work")
    argv = [
        sys.executable,
        "-m",
        "data.bertPrep",
        "--action",
        "create_hdf5_files",
        "--dataset",
        "wikicorpus_en",
        "--working_dir",
        str(work),
        "--no_progress",
        *SHARDS,
        "--vocab_file",
        str(uncased_vocab),
        "--dupe_factor",
        "1",
        "--n_processes",
        "1",
    ]
    first = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    folder = next(reference["work"].glob("hdf5_*")).name
    manifest = work / folder / "wikicorpus_en" / "manifest.json"
    deadline = time.monotonic() + 120
    while not (manifest.is_file() and json.loads(manifest.read_text())["outputs"]):  # the first file listed
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)  # the run and its create_pretraining_data.py, mid-stage
    first.wait()
    listed = len(json.loads(manifest.read_text())["outputs"])
    assert 1 <= listed < 7
    for path in (work / folder).rglob("*.hdf5"):  # every .hdf5 on disk is whole: it opens and has its arrays
        with h5py.File(path, "r") as f:
            assert "input_ids" in f
    capsys.readouterr()
    assert bertPrep.main(argv[3:]) == 0  # the same command again, here: only the first run had to be killable
    again = capsys.readouterr()
    assert f"reused {listed} of 7 outputs" in again.out and f"computed {7 - listed}" in again.out
    assert_same_arrays(arrays(work / folder / "wikicorpus_en"), reference["arrays"])


# ---------------------------------------------------------------------------------------------------------------
# Slurm: data/prep.sub


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from slurm_cluster import SlurmCluster, installed_or_skip

    installed_or_skip(REPO)
    with SlurmCluster.start(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


PREP_SUB = ("data/prep.sub", "data/create_datasets_from_start.sh")  # prep.sub passes the pipeline's variables on


def prep_env(vocab: Path) -> dict[str, str]:
    """The module's sizes (7 shards, 1 epoch of masks) and the vocabulary, through the variables the two scripts
    document; DASK_HOST as prep.sub's header advises for one node. No PYTHON: prep.sub picks the checkout's .venv."""
    return {
        "VOCAB_FILE": str(vocab),
        "N_TRAINING_SHARDS": "6",
        "N_TEST_SHARDS": "1",
        "FRACTION_TEST_SET": "0.1",
        "DUPE_FACTOR": "1",
        "DASK_HOST": "127.0.0.1",
        "N_PROCESSES": "2",
    }


def submit_prep(slurm, commands: list[docs.Command], replace: dict[str, str], env: dict[str, str], output: Path) -> str:
    """Submit data/prep.sub as the documents show it: the one node of the test cluster with 2 workers (the
    commands' -N 8 / --ntasks-per-node=32 become -N 1 / 2); returns the job id."""
    return docs.submit(
        commands,
        slurm_conf=slurm.conf,
        output=output,
        replace={"8": "1", "32": "2", **replace},
        env=env,
        documented_in=PREP_SUB,
    )


def no_dask_process_within(slurm, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while _dask_processes(slurm) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _dask_processes(slurm)


@pytest.fixture(scope="module")
def prep_jobs(slurm, reference, corpus, uncased_vocab, tmp_path_factory) -> dict:
    """sbatch data/prep.sub wiki_only; scancel once the phase 1 HDF5 stage has written a file; the same job submitted
    again, to its end. What the tests below check, observed once: the rerun is a job that runs the pipeline to
    its end on Slurm (the cancelled job made the text stages and part of phase 1 on the job's Dask cluster, the
    rerun the rest of phase 1 and all of phase 2), so it also serves the test of a finished job, instead of a third
    job that makes the same files again from nothing (20 s)."""
    tmp = tmp_path_factory.mktemp("prep_sub")
    work, env = tmp / "work", prep_env(uncased_vocab)
    job = submit_prep(
        slurm,
        docs.commands_for("prep_jobs"),
        {"/lustre/bert/data": str(work), "/lustre/wiki/extracted": str(corpus)},
        env,
        tmp / "first.out",
    )
    folder = work / next(reference["work"].glob("hdf5_*")).name / "wikicorpus_en"
    deadline = time.monotonic() + 180
    while not ((folder / "manifest.json").is_file() and json.loads((folder / "manifest.json").read_text())["outputs"]):
        assert time.monotonic() < deadline and slurm.job(job)["JobState"] in ("PENDING", "RUNNING"), (
            tmp / "first.out"
        ).read_text()[-3000:]
        time.sleep(0.05)
    running = _dask_processes(slurm)  # the scheduler and two workers (nannies and their workers)
    slurm.run(["scancel", job])
    slurm.wait(job, {"CANCELLED"}, timeout=60)
    left_after_cancel = no_dask_process_within(slurm, 15)
    finished = len(json.loads((folder / "manifest.json").read_text())["outputs"])
    rerun = docs.commands_for("test_a_cancelled_prep_job_leaves_no_process_and_its_rerun_reuses_what_it_finished")
    again = submit_prep(
        slurm, rerun, {"/shared/bert": str(work)}, {**env, "WIKIEXTRACTOR_DIR": str(corpus)}, tmp / "again.out"
    )
    info = slurm.wait(again, {"COMPLETED"}, timeout=300)
    return {
        "work": work,
        "phase1": folder,
        "running_at_cancel": running,
        "left_after_cancel": left_after_cancel,
        "finished_at_cancel": finished,
        "rerun": again,
        "rerun_info": info,
        "rerun_log": (tmp / "again.out").read_text(),
        "left_after_rerun": no_dask_process_within(slurm, 10),
    }


def test_prep_sub_runs_the_pipeline_on_slurm_and_leaves_no_process(prep_jobs, reference):
    """sbatch data/prep.sub wiki_only: a scheduler and two workers (srun steps) on the one node, the whole pipeline
    against them (phase 1 and 2), the same phase 1 arrays as one process, and no dask process after the job (the
    job submitted again after a scancel, which ends the pipeline: see prep_jobs)."""
    work, job = prep_jobs["work"], prep_jobs["rerun"]
    assert prep_jobs["rerun_info"]["ExitCode"] == "0:0"
    output = prep_jobs["rerun_log"]
    assert "prep.sub: 2 worker(s) joined" in output and "dask: 2 worker(s)" in output, output[-3000:]
    phase1 = next(work.glob("hdf5_*seq_len_128_*")) / "wikicorpus_en"
    assert_same_arrays(arrays(phase1), reference["arrays"])
    assert len(list(next(work.glob("hdf5_*seq_len_512_*")).rglob("*.hdf5"))) == 7
    assert not (work / ".dask" / f"scheduler-{job}.json").exists()
    assert prep_jobs["left_after_rerun"] == []


def test_a_cancelled_prep_job_leaves_no_process_and_its_rerun_reuses_what_it_finished(prep_jobs, reference):
    """scancel once the phase 1 HDF5 stage has written a file: no scheduler or worker is left; the job submitted
    again reuses the formatted text, the shards and the finished HDF5 files (its log says how many) and ends with
    the reference's arrays."""
    assert len(prep_jobs["running_at_cancel"]) >= 3  # the scheduler and two workers (nannies and their workers) ran
    assert prep_jobs["left_after_cancel"] == []
    finished, log = prep_jobs["finished_at_cancel"], prep_jobs["rerun_log"]
    assert "text_formatting: reused 1 of 1 outputs" in log and "sharding: reused 7 of 7 outputs" in log, log[-3000:]
    assert re.search(rf"create_hdf5_files: reused {finished} of 7 outputs .* computed {7 - finished}", log), log[-3000:]
    assert_same_arrays(arrays(prep_jobs["phase1"]), reference["arrays"])
    assert prep_jobs["left_after_rerun"] == []


def test_prep_sub_reads_parquet_as_its_header_shows(slurm, shared_data, uncased_vocab, tmp_path):
    """prep.sub's second example (a folder of Parquet files, the text column named): the job formats the same
    documents as the process pool does from those files, and writes both phases' shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    documents, parquet, work = documents_of(shared_data), tmp_path / "parquet", tmp_path / "work"
    parquet.mkdir()
    for k, part in enumerate((documents[:11], documents[11:])):
        pq.write_table(
            pa.table({"id": list(range(len(part))), "text": part}), parquet / f"part-{k}.parquet", row_group_size=4
        )
    env = {**prep_env(uncased_vocab), "N_TRAINING_SHARDS": "2", "FRACTION_TEST_SET": "0.2"}
    job = submit_prep(
        slurm,
        docs.commands_for("test_prep_sub_reads_parquet_as_its_header_shows"),
        {"/lustre/bert/data": str(work), "/lustre/corpus": str(parquet), "4": "1"},
        env,
        tmp_path / "job.out",
    )
    slurm.wait(job, {"COMPLETED"}, timeout=300)
    assert (
        bertPrep.main(
            [
                "--action",
                "text_formatting",
                "--dataset",
                "custom",
                "--no_progress",
                "--working_dir",
                str(tmp_path / "pool"),
                "--input_dir",
                str(parquet),
                "--input_format",
                "parquet",
            ]
        )
        == 0
    )
    name = Path("formatted_one_article_per_line") / "custom_one_article_per_line"
    assert corpus_text(work / name) == corpus_text(tmp_path / "pool" / name)
    for seq in (128, 512):
        assert len(list(next(work.glob(f"hdf5_*seq_len_{seq}_*")).rglob("*.hdf5"))) == 3
    assert no_dask_process_within(slurm, 10) == []


def _dask_processes(slurm) -> list[str]:
    """Dask schedulers and workers that this Slurm cluster's jobs started (their environment names its config)."""
    marker, found = f"SLURM_CONF={slurm.conf}".encode(), []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                proc.name.isdigit()
                and b"distributed.cli.dask_" in (proc / "cmdline").read_bytes()
                and marker in (proc / "environ").read_bytes().split(b"\0")
                and pid_alive(int(proc.name))
            ):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
    return found


# ---------------------------------------------------------------------------------------------------------------
# Corpora as they ship: Parquet, dump pieces


def documents_of(shared_data: Path, n: int = 23) -> list[str]:
    """Real documents: WikiText-2 articles, their paragraphs one a line."""
    text = (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    articles = re.split(r"\n = [^=\n]+ = \n", text)[1 : n + 1]
    return [
        "\n".join(line.strip() for line in a.splitlines() if line.strip() and not line.strip().startswith("="))
        for a in articles
    ]


@pytest.mark.parametrize("engine", [["--n_processes", "2"], ["--engine", "dask"]], ids=["processes", "dask"])
def test_parquet_input_gives_the_documents_of_the_same_text_files(shared_data, tmp_path, engine, request):
    """Two Parquet files (row groups of 4, an id column beside the text, a null row) against the same documents as
    one text file each: the same formatted file, on both engines (Dask: the module's running cluster, whose two
    worker processes read the row groups, instead of a local cluster started for each of the two calls)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if "--engine" in engine:
        engine = [*engine, "--dask_scheduler_file", str(request.getfixturevalue("dask_cluster").scheduler_file)]

    docs = documents_of(shared_data)
    parquet, text = tmp_path / "parquet", tmp_path / "text"
    parquet.mkdir()
    text.mkdir()
    for k, part in enumerate((docs[:11], docs[11:])):
        table = pa.table({"id": list(range(len(part) + 1)), "text": [*part[:5], None, *part[5:]]})
        pq.write_table(table, parquet / f"part-{k}.parquet", row_group_size=4)
    for i, doc in enumerate(docs):
        (text / f"doc_{i:03d}.txt").write_text(doc + "\n", encoding="utf-8")
    common = ["--action", "text_formatting", "--dataset", "custom", "--no_progress", *engine]
    assert (
        bertPrep.main(
            [
                *common,
                "--working_dir",
                str(tmp_path / "a"),
                "--input_dir",
                str(parquet),
                "--input_format",
                "parquet",
                "--text_column",
                "text",
            ]
        )
        == 0
    )
    assert bertPrep.main([*common, "--working_dir", str(tmp_path / "b"), "--input_dir", str(text)]) == 0
    name = Path("formatted_one_article_per_line") / "custom_one_article_per_line"
    formatted = corpus_text(tmp_path / "a" / name)
    assert formatted == corpus_text(tmp_path / "b" / name)
    assert len(formatted.splitlines()) == len(docs) == 23


def multistream_dump(folder: Path, pages=PAGES, per_stream: int = 2) -> Path:
    """The same pages as write_dump's, as Wikipedia's multistream dump: the site information in the first bz2
    stream, then `per_stream` pages a stream, the closing tag in the last; and its index (offset:id:title)."""
    header = (
        f'<mediawiki xmlns="{NS}" version="0.10" xml:lang="en">\n<siteinfo><sitename>Wikipedia</sitename>'
        f'<namespaces><namespace key="0" case="first-letter" /></namespaces></siteinfo>\n'
    )
    streams, index = [bz2.compress(header.encode())], []
    offset = len(streams[0])
    for start in range(0, len(pages), per_stream):
        xml = ""
        for i, (ns, title, redirect, text) in enumerate(pages[start : start + per_stream], start=start):
            index.append(f"{offset}:{i + 1}:{title}")
            xml += (
                f"<page>\n<title>{_xml_escape(title)}</title>\n<ns>{ns}</ns>\n<id>{i + 1}</id>\n"
                + ('<redirect title="Albert Testperson" />\n' if redirect else "")
                + f"<revision><id>{100 + i}</id><model>wikitext</model><format>text/x-wiki</format>"
                f'<text bytes="{len(text)}" xml:space="preserve">{_xml_escape(text)}</text>'
                "</revision>\n</page>\n"
            )
        streams.append(bz2.compress(xml.encode()))
        offset += len(streams[-1])
    streams.append(bz2.compress(b"</mediawiki>\n"))
    dump = folder / "enwiki-20240101-pages-articles-multistream.xml.bz2"
    dump.write_bytes(b"".join(streams))
    (folder / "enwiki-20240101-pages-articles-multistream-index.txt.bz2").write_bytes(
        bz2.compress(("\n".join(index) + "\n").encode())
    )
    return dump


@pytest.mark.parametrize("layout", ["multistream", "parts"])
def test_dump_pieces_format_like_the_whole_dump(tmp_path, layout):
    """A multistream dump cut into pieces of a few streams, and a folder of numbered part files (each a whole
    export), give the whole single-stream dump's formatted file and counts."""
    whole = tf.format_wiki_dump(write_dump(tmp_path / "whole.xml.bz2"), tmp_path / "whole.txt", progress=False)
    if layout == "multistream":
        dump = multistream_dump(tmp_path)
        assert len(tf.dump_pieces(dump, piece_bytes=1)) == (len(PAGES) + 1) // 2  # a piece a stream here
        pieces = tf.dump_pieces(dump, piece_bytes=1)
        counts = tf.format_wiki_dump(dump, tmp_path / "out.txt", num_workers=2, progress=False, piece_bytes=1)
        assert pieces[0][1] > 0  # the site information's stream is not a piece
    else:
        parts = tmp_path / "parts"
        parts.mkdir()
        for k, start in enumerate(range(0, len(PAGES), 3)):  # named out of lexical order: p10 after p4
            write_dump(
                parts / f"enwiki-20240101-pages-articles{k + 1}.xml-p{start * 3 + 1}p{start * 3 + 3}.bz2",
                PAGES[start : start + 3],
            )
        dump = parts
        counts = tf.format_wiki_dump(parts, tmp_path / "out.txt", num_workers=2, progress=False)
    assert (tmp_path / "out.txt").read_text() == (tmp_path / "whole.txt").read_text()
    assert {k: v for k, v in counts.items()} == dict(whole)
    assert (tmp_path / "out.txt.manifest.json").is_file() and not list(tmp_path.glob(".out.txt.parts"))


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one line, a non-zero exit, nothing half-written


def test_a_missing_scheduler_file_is_one_line_not_a_hang(tmp_path):
    started = time.monotonic()
    with pytest.raises(SystemExit, match=r"--dask_scheduler_file .*missing.json does not exist \(waited 1 s\)"):
        prep(
            tmp_path,
            "sharding",
            "--engine",
            "dask",
            "--dask_scheduler_file",
            str(tmp_path / "missing.json"),
            "--dask_timeout",
            "1",
        )
    assert time.monotonic() - started < 20
    with pytest.raises(SystemExit, match="--dask_scheduler_file is for --engine dask"):
        prep(tmp_path, "sharding", "--dask_scheduler_file", str(tmp_path / "missing.json"))


def test_a_scheduler_that_does_not_answer_is_a_timeout(tmp_path):
    dead = tmp_path / "scheduler.json"
    dead.write_text(
        json.dumps(
            {
                "type": "Scheduler",
                "id": "Scheduler-x",
                "address": f"tcp://127.0.0.1:{free_port()}",
                "services": {},
                "started": time.time(),
                "workers": {},
            }
        )
    )
    started = time.monotonic()
    with pytest.raises(SystemExit, match="the scheduler it names does not answer within 1 s"):
        prep(tmp_path, "sharding", "--engine", "dask", "--dask_scheduler_file", str(dead), "--dask_timeout", "1")
    assert time.monotonic() - started < 30


def test_workers_that_cannot_import_the_project_are_named(tmp_path):
    """Workers whose environment cannot import the project's modules are refused before any work. The project is
    installed in this environment (pip install -e .), so the workers get a PYTHONPATH whose bert_recipe package
    fails to import as it does where a dependency is missing, which comes first on their sys.path."""
    stub = tmp_path / "elsewhere"
    (stub / "bert_recipe").mkdir(parents=True)
    (stub / "bert_recipe" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'h5py'\")\n")
    env = {**os.environ, "PYTHONPATH": str(stub)}
    cluster = DaskProcesses(tmp_path / "dask", workers=1, env=env, cwd=tmp_path)
    try:
        with pytest.raises(
            SystemExit,
            match=r"the Dask workers cannot run the pipeline's tasks "
            r"\(ModuleNotFoundError: No module named 'h5py'\).*PYTHONPATH=",
        ):
            prep(
                tmp_path / "work",
                "sharding",
                "--engine",
                "dask",
                "--dask_scheduler_file",
                str(cluster.scheduler_file),
                "--dask_timeout",
                "20",
            )
    finally:
        cluster.stop()
    assert not (tmp_path / "work" / "sharded_training_shards_6_test_shards_1_fraction_0.1").exists()


def test_a_parquet_file_without_the_text_column_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "body": ["One doc.", "Two."]}), tmp_path / "in" / "a.parquet")
    with pytest.raises(SystemExit, match=r"a\.parquet has no column 'text' \(it has id, body\)"):
        bertPrep.main(
            [
                "--action",
                "text_formatting",
                "--dataset",
                "custom",
                "--working_dir",
                str(tmp_path / "w"),
                "--input_dir",
                str(tmp_path / "in"),
                "--input_format",
                "parquet",
                "--no_progress",
            ]
        )
    assert not list((tmp_path / "w").rglob("*.txt"))


def test_a_corrupt_dump_piece_is_named_and_nothing_is_written(tmp_path):
    dump = multistream_dump(tmp_path)
    data = bytearray(dump.read_bytes())
    pieces = tf.dump_pieces(dump, piece_bytes=1)
    middle = (pieces[2][1] + pieces[2][2]) // 2
    data[middle : middle + 8] = b"\xff" * 8  # inside the third piece's bz2 stream
    dump.write_bytes(bytes(data))
    output = tmp_path / "work" / "formatted_one_article_per_line" / "wikicorpus_en_one_article_per_line"
    with pytest.raises(SystemExit, match=rf"{dump.name}.*(Invalid data stream|cut off|CRC|corrupt)"):
        bertPrep.main(
            [
                "--action",
                "text_formatting",
                "--dataset",
                "wikicorpus_en",
                "--working_dir",
                str(tmp_path / "work"),
                "--wiki_dump",
                str(dump),
                "--no_progress",
                "--n_processes",
                "1",
            ]
        )
    assert not list(output.glob("*.txt")) or json.loads((output / "manifest.json").read_text())["outputs"].keys() == {
        p.name for p in output.glob("*.txt")
    }  # only whole parts of the good pieces, each listed


# ---------------------------------------------------------------------------------------------------------------
# The benchmark's projection, against its formula written out by hand


def test_the_projection_follows_its_stated_formula():

    run = {
        "stages": {
            "a": {"wall_s": 10.0, "startup_s": 1.0, "span_s": 8.0, "tasks": 100, "task_s": 16.0, "longest_task_s": 0.5},
            "b": {"wall_s": 5.0, "startup_s": 0.5, "span_s": 4.5, "tasks": 10, "task_s": 9.0, "longest_task_s": 3.0},
        }
    }
    o, c, f = 0.002, 64, 100.0
    out = projection(run, o, c, f)
    for n in (1, 8, 32):
        # T = U + f * B + max(f * W / (N c), f * K * o, L), B = wall - U - span - K * o (never below 0)
        a = 1.0 + f * (10.0 - 1.0 - 8.0 - 100 * o) + max(f * 16.0 / (n * c), f * 100 * o, 0.5)
        b = 0.5 + f * 0.0 + max(f * 9.0 / (n * c), f * 10 * o, 3.0)
        assert out[n]["stages_s"] == {"a": round(a, 1), "b": round(b, 1)}
        assert out[n]["total_s"] == round(round(a, 1) + round(b, 1), 1)
    assert out[8]["efficiency"] == round(out[1]["total_s"] / (8 * out[8]["total_s"]), 3)
    assert out["terms"]["a"]["B"] == round(10.0 - 1.0 - 8.0 - 100 * o, 3)
