"""Every command that README.md, data/README.md, the scripts' usage headers, run.sub and data/prep.sub show a user,
run as the user types it (tests/documented_commands.py: read from the documents, a fresh login shell without the
.venv activated, from the checkout), or with DRY_RUN=1 where it needs GPUs, nodes or a container, or listed with
the reason it cannot run here: tests/README.md's table "Every documented command" says which test runs each.

The table and the documents must agree: a command that changes in a document fails here until its row (and so its
test) changes with it. The data pipeline's commands run in tests/test_engines.py (the same shards from every way
the documents show), data/prep.sub's and run.sub's on the one-machine Slurm in tests/test_engines.py and
tests/test_slurm.py, the serving commands in tests/test_triton.py; the rest here.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import documented_commands as docs
import h5py
import pytest
from helpers import help_of
from test_swag import _write_next_sentence_csv

import run_glue
import run_pretraining
import run_squad
import run_swag

REPO = docs.REPO
STAND_IN = REPO / "tests" / "stand_in"
ENTRY_SCRIPTS = ("run_pretraining.py", "run_squad.py", "run_glue.py", "run_swag.py")


# ---------------------------------------------------------------------------------------------------------------
# The table against the documents


def test_the_table_lists_every_documented_command():
    shown = {(c.source, c.text) for c in docs.documented_commands()}
    listed = [(r.source, r.command) for r in docs.table_rows()]
    assert len(listed) == len(set(listed)), "tests/README.md lists a command twice"
    new, gone = sorted(shown - set(listed)), sorted(set(listed) - shown)
    assert not new and not gone, (
        f"documented but not in tests/README.md's table (add a row and its test): {new}; "
        f"in the table but no longer documented (change or drop the row): {gone}"
    )


def test_each_row_says_how_and_names_a_test_that_exists():
    """A row is run verbatim or as a dry run by a test (or fixture) that exists, or by CI, or says why not here."""
    for row in docs.table_rows():
        assert row.how.split(",")[0].split(":")[0] in docs.HOWS, row
        if row.how.startswith("not here"):
            assert len(row.how) > len("not here: ") + 10 and not row.test, row
            continue
        if row.how == "CI":
            assert row.test, row
            continue
        names = docs.tests_of(row)
        assert names, row
        for test in (t.strip().strip("`") for t in row.test.split(",")):
            path, name = test.split("::")
            tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
            assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, test


def test_ci_runs_the_commands_said_to_run_in_ci():
    ci = (REPO / ".ci" / "run").read_text() + (REPO / "scripts" / "test.sh").read_text()
    for row in docs.table_rows():
        if row.how == "CI":
            words = row.command.replace("bash ", "", 1)
            assert words in ci or row.command == "bash scripts/test.sh" and "scripts/test.sh" in ci, row


# ---------------------------------------------------------------------------------------------------------------
# Quick ones: help texts, preset lists, a sourced library


@pytest.mark.parametrize("command", docs.distinct(docs.commands_for("test_quick_commands")), ids=lambda c: c.text)
def test_quick_commands(command, tmp_path):
    done = docs.run(command, env={"RESULTS_DIR": str(tmp_path)} if "DRY_RUN" in command.text else None)
    if command.text.endswith(("-h", "--help")):
        assert re.search(r"(?i)usage|positional arguments", done.stdout), done.stdout[:500]
    elif command.text.endswith("_presets"):
        assert len(done.stdout.split()) >= 5 and "cpu" in done.stdout, done.stdout
    elif command.text.startswith("DRY_RUN=1"):
        check_printed_commands(done.stdout, expect=1)
    else:  # source scripts/signals.sh: a library that only defines functions
        assert done.stdout == "" and done.stderr == ""


# ---------------------------------------------------------------------------------------------------------------
# Dry runs: what would run on GPUs, several nodes or in a container, printed and checked against the entry scripts


def _help_texts() -> dict[str, str]:

    mains = {
        "run_pretraining.py": run_pretraining.main,
        "run_squad.py": run_squad.main,
        "run_glue.py": run_glue.main,
        "run_swag.py": run_swag.main,
    }
    return {name: help_of(main) for name, main in mains.items()}


HELP: dict[str, str] = {}


def check_printed_commands(output: str, expect: int) -> list[list[str]]:
    """The entry-script commands among the printed lines (DRY_RUN prints each, shell-quoted): at least `expect`,
    and every flag of each one a flag of that script."""
    if not HELP:
        HELP.update(_help_texts())
    found = []
    for line in output.splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        script = next((i for i, w in enumerate(words) if w.endswith(ENTRY_SCRIPTS)), None)
        if script is None:
            continue
        name = Path(words[script]).name
        unknown = [
            w
            for w in words[script + 1 :]
            if w.startswith("--") and not re.search(rf"(?m)^\s*(-\w, )?{re.escape(w.split('=')[0])}\b", HELP[name])
        ]
        assert not unknown, f"{name} has no {unknown}: {line}"
        found.append(words)
    assert len(found) >= expect, output[-3000:]
    return found


def dry_sessions() -> list[list[docs.Command]]:
    return docs.blocks_for("test_dry_runs")


@pytest.mark.parametrize("session", dry_sessions(), ids=lambda s: f"{s[0].source}:{s[0].line}")
def test_dry_runs(session, tmp_path):
    """The block's commands in one shell with DRY_RUN=1 (every launcher, run.sub and the Docker scripts read it),
    sbatch a stand-in that starts the batch script as Slurm would on the first node asked for: each command prints
    what it would run; the entry scripts' commands use only flags those scripts have, and each sbatch -N K starts
    srun over K nodes."""
    log = tmp_path / "sbatch.log"
    machine = {"STAND_IN_LOG": str(log)}
    stand_in = STAND_IN if any("sbatch" in c.text for c in session) else None
    env = {
        "DRY_RUN": "1",
        "RESULTS_DIR": str(tmp_path / "results"),
        # run.sub's folders for the blocks that submit it without the exports below them in the README
        "DATADIR_PHASE1": "/lustre/bert/hdf5_seq128",
        "DATADIR_PHASE2": "/lustre/bert/hdf5_seq512",
        "CHECKPOINTDIR": "/lustre/bert/run1",
    }
    done = docs.run(
        session,
        env=env,
        machine=machine,
        path_prefix=stand_in,
        documented_in=("scripts/run_pretraining.sh", "run.sub", "scripts/docker/build.sh"),
    )
    output = done.stdout + (log.read_text() if log.is_file() else "")
    docker = [c for c in session if "scripts/docker/" in c.text]
    launches = [c for c in session if c not in docker and re.search(r"\b(sbatch|bash scripts/run_\w+\.sh)\b", c.text)]
    check_printed_commands(output, expect=len(launches))
    for c in session:
        nodes = re.search(r"sbatch .*-N (\d+)", c.text)
        if nodes:
            assert f"--nodes={nodes.group(1)} " in output, output
    if docker:
        printed = [shlex.split(line) for line in done.stdout.splitlines() if line.startswith("docker ")]
        assert printed, done.stdout
        inner = printed[-1][printed[-1].index("-c") + 1] if "-c" in printed[-1] else None
        if inner:  # what the container would run, run here as a dry run too
            check_printed_commands(docs.run(inner, env={"DRY_RUN": "1", "RESULTS_DIR": env["RESULTS_DIR"]}).stdout, 1)


# ---------------------------------------------------------------------------------------------------------------
# Small real runs


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory, shared_data) -> Path:
    return docs.tiny_wikiextractor(tmp_path_factory.mktemp("extracted"), shared_data)


def hdf5_rows(work: Path) -> dict[int, int]:
    """Rows of the HDF5 shards of each sequence length under a pipeline's working folder."""
    rows: dict[int, int] = {}
    for path in work.glob("hdf5_*/*/*/*.hdf5"):
        with h5py.File(path, "r") as f:
            rows[f["input_ids"].shape[1]] = rows.get(f["input_ids"].shape[1], 0) + f["input_ids"].shape[0]
    return rows


def test_custom_and_books_pipelines(tmp_path, tiny_corpus, uncased_vocab, shared_data):
    """Your own text (a folder of .txt files, a document each) and Wikipedia plus books, each to phase 1 and phase
    2 shards."""
    texts, books = tmp_path / "my_txt", tmp_path / "books"
    texts.mkdir()
    books.mkdir()
    article = (shared_data / "bert-sample-text" / "sample_text.txt").read_text(encoding="utf-8")
    for i, document in enumerate(article.split("\n\n")[:4]):
        (texts / f"doc{i}.txt").write_text(document, encoding="utf-8")
    (books / "book.txt").write_text(article, encoding="utf-8")
    for command in docs.distinct(docs.commands_for("test_custom_and_books_pipelines")):
        work = tmp_path / f"work{command.line}"
        folder = {"custom": ("/data/my_txt", texts), "wiki_books": ("/data/books", books)}[command.words[-2]]
        docs.run(
            command,
            replace={"/data/bert": str(work), folder[0]: str(folder[1])},
            env={**docs.SMALL_PIPELINE, "VOCAB_FILE": str(uncased_vocab), "WIKIEXTRACTOR_DIR": str(tiny_corpus)},
        )
        rows = hdf5_rows(work)
        assert set(rows) == {128, 512} and min(rows.values()) > 0, (command.text, rows)
        if "wiki_books" in command.text:
            assert (work / "formatted" / "bookscorpus").exists() or any(work.rglob("*books*")), command.text


def test_vocabulary_commands(tmp_path, tiny_corpus, shared_data):
    """A WordPiece vocabulary learned from a folder and a file (uncased, cased), and the pipeline that learns its
    own (VOCAB_SIZE) and makes its shards with it."""
    text = tmp_path / "text"
    text.mkdir()
    wiki = (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    (text / "a.txt").write_text(wiki[: len(wiki) // 2], encoding="utf-8")
    import gzip

    with gzip.open(tmp_path / "more.txt.gz", "wt", encoding="utf-8") as f:
        f.write(wiki[len(wiki) // 2 :])
    for command in docs.distinct(docs.commands_for("test_vocabulary_commands")):
        if "create_vocab" in command.text:  # from the checkout (.venv/bin/python), the text and vocabularies here
            out = tmp_path / ("vocab-cased.txt" if "--cased" in command.text else "vocab.txt")
            out.unlink(missing_ok=True)
            paths = {
                "/data/my_text/": f"{text}/",
                "text/": f"{text}/",
                "more.txt.gz": str(tmp_path / "more.txt.gz"),
                "vocab.txt": str(tmp_path / "vocab.txt"),
                "vocab-cased.txt": str(tmp_path / "vocab-cased.txt"),
            }
            docs.run(command, replace={"16000": "2000", **{k: v for k, v in paths.items() if k in command.words}})
            lines = out.read_text(encoding="utf-8").splitlines()
            assert 1500 < len(lines) <= 2000 and "[CLS]" in lines and "[MASK]" in lines, command.text
            assert any(w[:1].isupper() for w in lines) == ("--cased" in command.text), command.text
        else:  # VOCAB_SIZE=16000 DATA_DIR=/data/bert data/create_datasets_from_start.sh wiki_only
            work = tmp_path / "work"
            docs.run(
                command,
                replace={"16000": "1000", "/data/bert": str(work)},
                env={**docs.SMALL_PIPELINE, "WIKIEXTRACTOR_DIR": str(tiny_corpus)},
            )
            assert len((work / "vocab.txt").read_text(encoding="utf-8").splitlines()) <= 1000
            assert set(hdf5_rows(work)) == {128, 512}


@pytest.fixture(scope="module")
def fine_tuning_data(tmp_path_factory, shared_data) -> Path:
    """BERT_PREP_WORKING_DIR with the folders the cpu presets read: download/glue/MRPC (16 + 8 real pairs),
    download/squad/v1.1 (12 real questions to train on, 6 to predict, the official evaluation script beside them)
    and download/swag (16 + 8 examples in SWAG's layout, made of WikiText-2's consecutive sentences)."""
    prep = tmp_path_factory.mktemp("prep")
    mrpc = prep / "download" / "glue" / "MRPC"
    mrpc.mkdir(parents=True)
    for name, n in (("train.tsv", 16), ("dev.tsv", 8)):
        lines = (shared_data / "glue-mrpc" / name).read_text(encoding="utf-8").splitlines()
        (mrpc / name).write_text("\n".join(lines[: n + 1]) + "\n", encoding="utf-8")
    squad = prep / "download" / "squad" / "v1.1"
    squad.mkdir(parents=True)
    dev = json.loads((shared_data / "squad-v1.1-dev" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = dev["data"][0]["paragraphs"]
    for name, part in (("train-v1.1.json", paragraphs[:3]), ("dev-v1.1.json", paragraphs[3:4])):
        subset = {
            "version": dev["version"],
            "data": [
                {
                    "title": dev["data"][0]["title"],
                    "paragraphs": [{**p, "qas": p["qas"][: 6 if name.startswith("dev") else 4]} for p in part],
                }
            ],
        }
        (squad / name).write_text(json.dumps(subset), encoding="utf-8")
    (squad / "evaluate-v1.1.py").symlink_to(shared_data / "squad-eval-scripts" / "evaluate-v1.1.py")
    swag = prep / "download" / "swag"
    swag.mkdir(parents=True)
    _write_next_sentence_csv(swag / "train.csv", shared_data / "wikitext-2" / "valid.txt", 16, seed=1)
    _write_next_sentence_csv(swag / "val.csv", shared_data / "wikitext-2" / "test.txt", 8, seed=2)
    return prep


def test_fine_tuning_presets_on_the_cpu(fine_tuning_data, tmp_path):
    """The cpu presets of run_squad.sh, run_glue.sh and run_swag.sh fine-tune all-MiniLM-L6-v2 and score the dev
    set: each writes its results (SQuAD scored by the official script beside the data)."""
    for command in docs.distinct(docs.commands_for("test_fine_tuning_presets_on_the_cpu")):
        results = tmp_path / f"results{command.line}_{Path(command.source).stem}"
        env = {"BERT_PREP_WORKING_DIR": str(fine_tuning_data), "RESULTS_DIR": str(results)}
        if "run_squad" in command.text:
            env.update(MAX_SEQ_LENGTH="192", DOC_STRIDE="64")
        elif "run_swag" in command.text:
            env.update(MAX_SEQ_LENGTH="64")
        else:
            env.update(MAX_SEQ_LENGTH="64")
        script = re.search(r"scripts/(run_\w+\.sh)", command.text).group(1)
        done = docs.run(command, env=env, timeout=900)
        task = {"run_squad.sh": "SQuAD", "run_glue.sh": "MRPC", "run_swag.sh": "SWAG"}[script]
        scores = json.loads((results / task / "results.json").read_text())
        assert scores, done.stdout[-2000:]
        if task == "SQuAD":
            assert {"exact_match", "f1"} <= set(json.dumps(scores).replace('"', " ").split()), scores


def test_extract_features_command(tmp_path, minilm_dir, shared_data):
    """Each WordPiece token's hidden states of the last four layers, JSON lines, from a Hugging Face folder."""
    command = docs.only_command_for("test_extract_features_command")
    lines = (shared_data / "bert-sample-text" / "sample_text.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "in.txt").write_text("\n".join(line for line in lines[:3] if line.strip()) + "\n", encoding="utf-8")
    docs.run(
        command,
        cwd=REPO,
        replace={
            "in.txt": str(tmp_path / "in.txt"),
            "CKPT": str(minilm_dir),
            "features.jsonl": str(tmp_path / "features.jsonl"),
        },
    )
    records = [json.loads(line) for line in (tmp_path / "features.jsonl").read_text().splitlines()]
    assert records and all(len(f["layers"]) == 4 for f in records[0]["features"]), records[0].keys()
