"""Pre-training data, stage by stage: download -> text_formatting (-> create_vocab) -> sharding -> create_hdf5_files.

The interface of NVIDIA's data/bertPrep.py: `python data/bertPrep.py ...` (scripts/setup_cpu.sh installs the
project in editable mode, so its modules import from anywhere), or as a module from the checkout:

    export BERT_PREP_WORKING_DIR=/data/bert          # or DATA_DIR, or --working_dir
    python -m data.bertPrep --action download --dataset wikicorpus_en --dump_date latest
    python -m data.bertPrep --action text_formatting --dataset wikicorpus_en
    python -m data.bertPrep --action create_vocab --dataset wikicorpus_en --vocab_size 16000   # optional: your own
    python -m data.bertPrep --action sharding --dataset wikicorpus_en
    python -m data.bertPrep --action create_hdf5_files --dataset wikicorpus_en --phase 1 --vocab_file vocab.txt
    python -m data.bertPrep --action create_hdf5_files --dataset wikicorpus_en --phase 2 --vocab_file vocab.txt

Datasets: wikicorpus_en (a pages-articles dump: the latest or --dump_date YYYYMMDD, verified against the dump's
published sha1/md5 listing), bookscorpus (a folder of plain-text books, --books_dir, or --books_url_list to
download them), books_wiki_en_corpus (both), custom (your own folder of .txt files, --input_dir), and
google_pretrained_weights (download only: Google's BERT-Large uncased zip, for its vocab.txt).

Folders under the working dir, as in the original:
    download/<dataset>/                                                 raw downloads
    formatted_one_article_per_line/<dataset>_one_article_per_line/       one document per line: parts 00000000.txt ...
                                                                         in order, and their manifest.json
    vocab.txt                                                           create_vocab's output (default --vocab_file)
    sharded_training_shards_<N>_test_shards_<M>_fraction_<f>/<dataset>/<dataset>_{training,test}_<i>.txt
    hdf5_lower_case_<0|1>_seq_len_<S>_max_pred_<P>_masked_lm_prob_<p>_random_seed_<r>_dupe_factor_<d>/<dataset>/
        training/<dataset>_training_<i>.hdf5    what run_pretraining.py --input_dir trains on
        test/<dataset>_test_<i>.hdf5            the held-out documents: its --eval_dir
A JSON-lines log of every stage (its wall time and peak memory included) goes to <working dir>/bertPrep_log.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

try:  # a checkout that was never installed: one line instead of a traceback
    from bert_recipe.io.cli import InputError, add_debug_argument, script_errors
except ModuleNotFoundError as e:
    raise SystemExit(
        f"bertPrep.py: error: {e}: install the project (pip install -e . in the checkout, as "
        "scripts/setup_cpu.sh does) or run `python -m data.bertPrep ...` from the checkout"
    ) from None
from bert_recipe.io.atomic_io import JsonLogger, atomic_write_json, atomic_write_text
from bert_recipe.io.downloads import DownloadError, download, fetch_text, parse_checksum_file
from bert_recipe.prep import text_formatting as tf
from bert_recipe.prep.engine import EngineConfig, open_engine
from bert_recipe.prep.manifest import Manifest, sha256_file
from bert_recipe.prep.sharding import ShardingConfig, shard_corpus
from bert_recipe.prep.text_formatting import corpus_files
from bert_recipe.prep.vocab import VocabSettings, create_vocab

REPO_ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("processes", "dask")  # bert_recipe/prep/engine.py's
DATASETS = ("wikicorpus_en", "bookscorpus", "books_wiki_en_corpus", "custom", "google_pretrained_weights")
ACTIONS = ("download", "text_formatting", "create_vocab", "sharding", "create_hdf5_files")
# Phase presets of the original recipe; masked_lm_prob 0.15, dupe_factor 5, short_seq_prob 0.1 for both.
PHASES = {
    1: {"max_seq_length": 128, "max_predictions_per_seq": 20},
    2: {"max_seq_length": 512, "max_predictions_per_seq": 80},
}
WIKI_BASE_URL = "https://dumps.wikimedia.org"
GOOGLE_WEIGHTS_URL = "https://storage.googleapis.com/bert_models/2018_10_18/uncased_L-24_H-1024_A-16.zip"


def directories(args) -> dict[str, Path]:
    work = Path(args.working_dir)
    suffix = (
        f"_lower_case_{int(bool(args.do_lower_case))}_seq_len_{args.max_seq_length}"
        f"_max_pred_{args.max_predictions_per_seq}_masked_lm_prob_{args.masked_lm_prob}"
        f"_random_seed_{args.random_seed}_dupe_factor_{args.dupe_factor}"
    )
    return {
        "download": work / "download",
        "formatted": work / "formatted_one_article_per_line",
        "sharded": work
        / (
            f"sharded_training_shards_{args.n_training_shards}_test_shards_{args.n_test_shards}"
            f"_fraction_{args.fraction_test_set}"
        ),
        "hdf5": work / f"hdf5{suffix}",
    }


def _parts(dataset: str) -> list[str]:
    return ["bookscorpus", "wikicorpus_en"] if dataset == "books_wiki_en_corpus" else [dataset]


def formatted_name(dataset: str) -> str:
    return "bookscorpus_one_book_per_line" if dataset == "bookscorpus" else f"{dataset}_one_article_per_line"


def formatted_file(dirs: dict[str, Path], dataset: str) -> Path:
    """The formatted corpus of `dataset`: a folder of parts (text_formatting writes it), or the single file of
    that name with .txt (what earlier versions wrote; still read)."""
    name = formatted_name(dataset)
    folder = dirs["formatted"] / name
    legacy = folder.with_name(name + ".txt")
    return legacy if legacy.is_file() and not folder.is_dir() else folder


def formatted_inputs(dirs: dict[str, Path], dataset: str) -> list[Path]:
    """The files of the formatted corpora of `dataset` (both, for books_wiki_en_corpus), in order."""

    files = []
    for part in _parts(dataset):
        path = formatted_file(dirs, part)
        if not path.exists():
            raise InputError(
                f"{path} does not exist: run --action text_formatting --dataset {dataset} first (or pass --input_files)"
            )
        files.extend(corpus_files(path))
    return files


# --------------------------------------------------------------------------------------------------------------
# download


def resolve_wiki_dump(base_url: str, dump_date: str, wiki: str = "enwiki", kind: str = "multistream") -> dict:
    """The URL and published checksum of `<wiki>-<date>-pages-articles.xml.bz2` (kind "single"), or of the
    multistream dump `...-pages-articles-multistream.xml.bz2` and its index `...-multistream-index.txt.bz2` (kind
    "multistream", under "index": the pieces that text_formatting's tasks read independently).

    'latest' is resolved to a dated dump through latest/'s checksum listing (its entries carry the real date), so
    the file we fetch and the checksum we check always belong to the same dump.
    """

    base_url = base_url.rstrip("/")
    stem = "pages-articles-multistream" if kind == "multistream" else "pages-articles"
    listing = None
    for algo in ("sha1", "md5"):
        try:
            text = fetch_text(f"{base_url}/{wiki}/{dump_date}/{wiki}-{dump_date}-{algo}sums.txt")
        except DownloadError:
            continue
        listing = (algo, parse_checksum_file(text))
        break
    if dump_date == "latest":
        if listing is None:
            raise InputError(
                f"cannot resolve the latest {wiki} dump at {base_url} (no checksum listing): give --dump_date YYYYMMDD"
            )
        names = [n for n in listing[1] if re.fullmatch(rf"{wiki}-\d{{8}}-{stem}\.xml\.bz2", n)]
        if not names:
            raise InputError(
                f"the latest {wiki} checksum listing names no {stem} dump: give --dump_date "
                f"YYYYMMDD (or --wiki_dump_kind {'single' if kind == 'multistream' else 'multistream'})"
            )
        dump_date = names[0].split("-")[1]

    def entry(filename: str) -> dict:
        digest = listing[1].get(filename) if listing else None
        return {
            "url": f"{base_url}/{wiki}/{dump_date}/{filename}",
            "filename": filename,
            "checksum": f"{listing[0]}:{digest}" if digest else None,
        }

    dump = {**entry(f"{wiki}-{dump_date}-{stem}.xml.bz2"), "dump_date": dump_date, "kind": kind}
    if kind == "multistream":
        dump["index"] = entry(f"{wiki}-{dump_date}-{stem}-index.txt.bz2")
    return dump


def download_wikipedia(args, dest_dir: Path, logger) -> Path:

    if args.dump_date != "latest" and not re.fullmatch(r"\d{8}", args.dump_date):
        raise InputError(f"--dump_date must be 'latest' or YYYYMMDD, got {args.dump_date!r}")
    try:
        dump = resolve_wiki_dump(args.base_url, args.dump_date, kind=args.wiki_dump_kind)
    except DownloadError as e:
        raise InputError(str(e)) from e
    files = [dump] + ([dump["index"]] if "index" in dump else [])
    for item in files:
        if item["checksum"] is None:
            print(
                f"warning: no published checksum found for {item['filename']}; verifying its size only", file=sys.stderr
            )
    logger.log("download", {"dataset": "wikicorpus_en", **{k: v for k, v in dump.items() if k != "index"}})
    try:
        for item in files[::-1]:  # the small index first: a wrong date fails before gigabytes
            path = download(
                item["url"], dest_dir / item["filename"], checksum=item["checksum"], progress=not args.no_progress
            )
    except DownloadError as e:
        raise InputError(str(e)) from e
    atomic_write_json(dest_dir / "download_manifest.json", {**dump, "file": path.name})
    return path


def download_urls(url_list: Path, dest_dir: Path, progress: bool) -> list[Path]:
    """Each line of `url_list`: a URL, optionally followed by a checksum ('sha256:<hex>')."""

    if not url_list.is_file():
        raise InputError(f"URL list {url_list} does not exist")
    paths = []
    for i, line in enumerate(url_list.read_text(encoding="utf-8").splitlines()):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        url, *rest = line.split()
        name = Path(url.split("?")[0]).name or f"file_{i}.txt"
        try:
            paths.append(
                download(url, dest_dir / f"{i:06d}_{name}", checksum=rest[0] if rest else None, progress=progress)
            )
        except (DownloadError, ValueError) as e:
            raise InputError(f"{url_list} line {i + 1}: {e}")
    return paths


def extract_zip(archive: Path, dest_dir: Path) -> None:
    """Extract, refusing members that would land outside `dest_dir` (absolute paths, '..')."""
    root = dest_dir.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            if not (root / member).resolve().is_relative_to(root):
                raise InputError(f"{archive} holds an unsafe path {member!r}; not extracting")
        zf.extractall(root)


def action_download(args, dirs, logger) -> None:

    for dataset in _parts(args.dataset):
        dest = dirs["download"] / dataset
        dest.mkdir(parents=True, exist_ok=True)
        if dataset == "wikicorpus_en":
            download_wikipedia(args, dest, logger)
        elif dataset == "bookscorpus":
            if args.books_url_list:
                paths = download_urls(Path(args.books_url_list), dest, not args.no_progress)
                logger.log("download", {"dataset": dataset, "files": len(paths)})
            elif args.books_dir:
                _require_dir(args.books_dir, "--books_dir")  # used in place by text_formatting, nothing to fetch
            else:
                raise InputError(
                    "bookscorpus has no public download: give --books_dir (a folder of .txt "
                    "books) or --books_url_list (a file of URLs)"
                )
        elif dataset == "custom":
            _require_dir(args.input_dir, "--input_dir")
        elif dataset == "google_pretrained_weights":
            try:
                archive = download(args.weights_url, dest / Path(args.weights_url).name, progress=not args.no_progress)
            except DownloadError as e:
                raise InputError(str(e)) from e
            extract_zip(archive, dest)
            logger.log("download", {"dataset": dataset, "file": str(archive)})


def _require_dir(path: str | None, flag: str) -> Path:
    if not path:
        raise InputError(f"{flag} is required for this dataset")
    if not Path(path).is_dir():
        raise InputError(f"{flag} {path} is not a folder: pass the folder that holds the text files")
    return Path(path)


# --------------------------------------------------------------------------------------------------------------
# text_formatting


def find_wiki_dump(download_dir: Path) -> Path:
    manifest = download_dir / "download_manifest.json"
    if manifest.is_file():
        path = download_dir / json.loads(manifest.read_text())["file"]
        if path.is_file():
            return path
    dumps = sorted(download_dir.glob("*.xml.bz2")) if download_dir.is_dir() else []
    if len(dumps) != 1:
        raise InputError(
            f"expected one *.xml.bz2 dump in {download_dir}, found {len(dumps)}: run "
            f"--action download --dataset wikicorpus_en, or pass --wiki_dump PATH"
        )
    return dumps[0]


def action_text_formatting(args, dirs, logger, engine) -> None:

    if args.dataset == "google_pretrained_weights":
        raise InputError("google_pretrained_weights has no text to format")
    progress = not args.no_progress
    for dataset in _parts(args.dataset):
        output = dirs["formatted"] / formatted_name(dataset)  # a folder of parts
        start = time.time()
        if dataset == "wikicorpus_en" and args.wikiextractor_dir:
            files = tf.list_text_files([_require_dir(args.wikiextractor_dir, "--wikiextractor_dir")], "wiki_*")
            counts = tf.format_text_files(files, output, "file", args.n_processes, progress, engine, join=False)
        elif dataset == "wikicorpus_en":
            dump = Path(args.wiki_dump) if args.wiki_dump else find_wiki_dump(dirs["download"] / dataset)
            counts = tf.format_wiki_dump(dump, output, args.n_processes, progress, logger, engine=engine, join=False)
        else:
            if dataset == "bookscorpus":
                folder = Path(args.books_dir) if args.books_dir else dirs["download"] / dataset
                folder = _require_dir(str(folder), "--books_dir")
            else:
                folder = _require_dir(args.input_dir, "--input_dir")
            if args.input_format == "parquet":
                files = tf.list_text_files([folder], args.input_pattern or "*.parquet")
                counts = tf.format_parquet_files(
                    files, output, args.text_column, args.n_processes, progress, engine, join=False
                )
            else:
                files = tf.list_text_files([folder], args.input_pattern or "*.txt")
                counts = tf.format_text_files(
                    files, output, args.doc_boundary, args.n_processes, progress, engine, join=False
                )
        logger.log(
            "text_formatting",
            {"dataset": dataset, "output": str(output), **counts, "elapsed_s": round(time.time() - start, 1)},
        )
        print(f"{dataset}: wrote {output} {dict(counts)}")


# --------------------------------------------------------------------------------------------------------------
# create_vocab


def vocab_output(args) -> Path:
    return Path(args.vocab_file) if args.vocab_file else Path(args.working_dir) / "vocab.txt"


def action_create_vocab(args, dirs, logger, engine) -> None:
    """A WordPiece vocabulary learned from the formatted text (data/create_vocab.py), in Google's layout, written to
    --vocab_file (default <working_dir>/vocab.txt) for create_hdf5_files. It runs before sharding because it
    needs only the formatted text, and learns from all of it: the test shards are held out from pre-training, not
    from the vocabulary (as with Google's)."""

    if args.dataset == "google_pretrained_weights":
        raise InputError("google_pretrained_weights has no text to learn a vocabulary from")
    if args.vocab_size is None:
        raise InputError(
            "--action create_vocab needs --vocab_size (8000-16000 for a small model, 30522 as bert-base-uncased)"
        )
    inputs = args.input_files.split(",") if args.input_files else formatted_inputs(dirs, args.dataset)
    for path in inputs:
        if not Path(path).is_file():
            raise InputError(
                f"{path} does not exist: run --action text_formatting --dataset {args.dataset} "
                "first (or pass --input_files)"
            )
    output = vocab_output(args)
    start = time.time()
    settings = VocabSettings(args.vocab_size, bool(args.do_lower_case), args.unused_slots, args.limit_alphabet)
    result = create_vocab(
        inputs,
        output,
        settings,
        progress=not args.no_progress,
        output_flag="--vocab_file",
        log=lambda message: print(f"create_vocab: {message}", flush=True),
        engine=engine,
    )
    logger.log(
        "create_vocab",
        {
            "dataset": args.dataset,
            "output": str(output),
            **result.summary(),
            "elapsed_s": round(time.time() - start, 1),
        },
    )


# --------------------------------------------------------------------------------------------------------------
# sharding


def action_sharding(args, dirs, logger, engine) -> None:

    if args.dataset == "google_pretrained_weights":
        raise InputError("google_pretrained_weights has no text to shard")
    inputs = args.input_files.split(",") if args.input_files else formatted_inputs(dirs, args.dataset)
    cfg = ShardingConfig(
        n_training_shards=args.n_training_shards,
        n_test_shards=args.n_test_shards,
        fraction_test_set=args.fraction_test_set,
        segmenter=args.segmentation_method,
        seed=args.random_seed,
        num_workers=args.n_processes,
    )
    prefix = dirs["sharded"] / args.dataset / args.dataset
    manifest = shard_corpus(inputs, prefix, cfg, progress=not args.no_progress, logger=logger, engine=engine)
    print(
        f"{args.dataset}: {manifest['documents']} documents -> {len(manifest['training'])} training + "
        f"{len(manifest['test'])} test shards in {prefix.parent}"
    )


# --------------------------------------------------------------------------------------------------------------
# create_hdf5_files


def list_shards(shard_dir: Path, dataset: str) -> list[Path]:
    """Training shards then test shards, each in index order."""

    def index(p: Path) -> int:
        return int(p.stem.rsplit("_", 1)[1])

    shards = []
    for split in ("training", "test"):
        shards += sorted(shard_dir.glob(f"{dataset}_{split}_*.txt"), key=index)
    return shards


def hdf5_split(shard: Path) -> str:
    """ "training" or "test": the folder under the HDF5 directory that a text shard's HDF5 file goes to."""
    return "test" if "_test_" in shard.name else "training"


def cpd_arguments(args, shard: Path, output: Path, seed: int, num_workers: int) -> list[str]:
    """create_pretraining_data.py's arguments for one shard (the interpreter and script are the worker's own)."""
    return [
        "--input_file",
        str(shard),
        "--output_file",
        str(output),
        "--vocab_file",
        str(args.vocab_file),
        "--do_lower_case" if args.do_lower_case else "--no-do_lower_case",
        "--max_seq_length",
        str(args.max_seq_length),
        "--max_predictions_per_seq",
        str(args.max_predictions_per_seq),
        "--masked_lm_prob",
        str(args.masked_lm_prob),
        "--short_seq_prob",
        str(args.short_seq_prob),
        "--dupe_factor",
        str(args.dupe_factor),
        "--random_seed",
        str(seed),
        "--num_workers",
        str(num_workers),
        "--no_progress",
    ]


def run_cpd_task(job: tuple[str, str, list[str], str]) -> tuple[int, dict, str | None]:
    """Task: create_pretraining_data.py on one text shard, in a process of its own (this interpreter and this
    checkout's script, wherever the task runs), its output to a log file beside the HDF5 files. Returns (exit
    status, its one-line JSON summary, the output's sha256 when it succeeded)."""

    shard, output, arguments, log_path = job
    with open(log_path, "w") as log:
        rc = subprocess.run(
            [sys.executable, str(REPO_ROOT / "create_pretraining_data.py"), *arguments],
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        ).returncode
    summary = {}
    if rc == 0:  # create_pretraining_data.py ends with a one-line JSON summary
        with contextlib.suppress(ValueError, IndexError):
            summary = json.loads(Path(log_path).read_text().strip().splitlines()[-1])
    return rc, summary, sha256_file(output) if rc == 0 else None


def _check_same_vocabulary(args, out_dir: Path, existing: list[Path]) -> None:
    """Finished HDF5 files are kept on a rerun: refuse to mix them with files of another vocabulary (a rerun with
    another VOCAB_SIZE relearns vocab.txt; the folder's name does not say which vocabulary made it). The folder
    records the sha256 of the vocab.txt its files were made with; --overwrite removes the old files first."""

    digest = hashlib.sha256(Path(args.vocab_file).read_bytes()).hexdigest()
    stamp = out_dir / "vocab.sha256"
    before = (stamp.read_text().split() or [None])[0] if stamp.is_file() else None
    if existing and before not in (None, digest):
        if not args.overwrite:
            raise InputError(
                f"{out_dir} holds {len(existing)} HDF5 file(s) made with another vocabulary than "
                f"--vocab_file {args.vocab_file}: pass --overwrite to redo them, or remove the folder"
            )
        for path in existing:  # before the new stamp: an interrupted rerun must not keep them as the new vocab's
            path.unlink()
    atomic_write_text(stamp, f"{digest}  {args.vocab_file}\n")


def action_create_hdf5_files(args, dirs, logger, engine) -> None:
    """create_pretraining_data.py over every shard, each a task on the engine (in a process of its own).

    Shard i (its index among the shards' paths in sorted order) gets --random_seed random_seed + i, so shards do not
    repeat one another's random choices, and the files equal those of one `create_pretraining_data.py
    --input_file <shard folder> --output_dir ...` call, whatever the engine. `<hdf5 folder>/manifest.json` lists
    every finished file (instances, sha256) with the settings that made it: a rerun computes only the files it
    does not list (or whose sha256 changed); --overwrite redoes them all.
    """

    if not (REPO_ROOT / "create_pretraining_data.py").is_file():
        raise InputError(f"{REPO_ROOT / 'create_pretraining_data.py'} is missing")
    if not args.vocab_file or not Path(args.vocab_file).is_file():
        raise InputError(
            f"--vocab_file {args.vocab_file} does not exist (BERT's uncased vocab.txt: e.g. "
            f"--action download --dataset google_pretrained_weights)"
        )
    shard_dir = dirs["sharded"] / args.dataset
    shards = list_shards(shard_dir, args.dataset)
    if not shards:
        raise InputError(f"no shards in {shard_dir}: run --action sharding with the same shard flags first")
    out_dir = dirs["hdf5"] / args.dataset
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    seed_index = {path: i for i, path in enumerate(sorted(str(s) for s in shards))}
    # Training and held-out (test) shards go to folders of their own: run_pretraining.py trains on every *.hdf5
    # of --input_dir, so the held-out articles must not sit beside the training ones.
    todo = [(seed_index[str(s)], s, out_dir / hdf5_split(s) / f"{s.stem}.hdf5") for s in shards]
    for split in {hdf5_split(s) for s in shards}:
        (out_dir / split).mkdir(parents=True, exist_ok=True)
    _check_same_vocabulary(args, out_dir, [t[2] for t in todo if t[2].exists()])
    settings = {
        "arguments": cpd_arguments(args, Path("SHARD"), Path("OUTPUT"), args.random_seed, 1),
        "vocab_sha256": hashlib.sha256(Path(args.vocab_file).read_bytes()).hexdigest(),
        "shards": [[s.name, s.stat().st_size] for s in shards],
    }
    manifest = Manifest.open(out_dir / "manifest.json", settings)
    todo = [t for t in todo if args.overwrite or not manifest.reusable(str(t[2].relative_to(out_dir)))]
    # Processes here: a few shards at a time, each with the rest of the cores; Dask: one shard a worker.
    concurrency = max(1, min(args.n_processes, len(todo))) if engine.name == "processes" else 1
    workers_each = max(1, args.n_processes // concurrency) if engine.name == "processes" else 1
    jobs = [
        (
            str(shard),
            str(output),
            cpd_arguments(args, shard, output, args.random_seed + i, workers_each),
            str(out_dir / "logs" / f"{shard.stem}.log"),
        )
        for i, shard, output in todo
    ]
    start, failed = time.time(), []
    try:
        for k, (rc, summary, digest) in engine.map(run_cpd_task, jobs, desc="hdf5 shards", threads=True):
            _, shard, output = todo[k]
            logger.log(
                "create_hdf5_files",
                {
                    "shard": shard.name,
                    "returncode": rc,
                    "instances": summary.get("instances"),
                    "elapsed_s": round(time.time() - start, 1),
                },
            )
            if rc:
                failed.append(shard)
            else:
                manifest.record(str(output.relative_to(out_dir)), summary.get("instances", 0), digest)
    finally:  # what finished is listed, also when the stage is interrupted
        manifest.save()
    if failed:
        log = out_dir / "logs" / f"{failed[0].stem}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        raise InputError(
            f"create_pretraining_data.py failed on {len(failed)} shard(s), first {failed[0]}: "
            f"{' '.join(tail)} (full log: {log})"
        )
    manifest.save()
    manifest.report("create_hdf5_files")
    print(f"{args.dataset}: {len(todo)} HDF5 files written ({len(shards) - len(todo)} reused) in {out_dir}")


# --------------------------------------------------------------------------------------------------------------
# CLI


def resources(start: float) -> dict[str, float]:
    """Wall time since `start`, and the peak resident memory of this process and of its largest child process
    (the workers and create_pretraining_data.py calls), in MiB: what each stage costs, for the log."""
    import resource

    mib = 1024 if sys.platform != "darwin" else 1024 * 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    return {
        "elapsed_s": round(time.time() - start, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / mib, 1),
        "peak_child_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / mib, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bertPrep.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--action", required=True, choices=ACTIONS)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument(
        "--working_dir",
        default=os.environ.get("BERT_PREP_WORKING_DIR") or os.environ.get("DATA_DIR"),
        help="root of every stage's folder (default: $BERT_PREP_WORKING_DIR, else $DATA_DIR)",
    )
    g = p.add_argument_group("download")
    g.add_argument("--dump_date", default="latest", help="Wikipedia dump date YYYYMMDD, or 'latest'")
    g.add_argument("--base_url", default=WIKI_BASE_URL, help="Wikipedia dump mirror")
    g.add_argument(
        "--wiki_dump_kind",
        choices=("multistream", "single"),
        default="multistream",
        help="multistream (default): the dump in bz2 streams of 100 pages and its index, which "
        "text_formatting cuts into pieces for the engine's workers; single: one bz2 stream, read by "
        "one process",
    )
    g.add_argument("--books_dir", help="bookscorpus: a folder of plain-text books (used in place)")
    g.add_argument("--books_url_list", help="bookscorpus: a file with one URL per line (optional checksum after it)")
    g.add_argument("--input_dir", help="custom: your folder of text files")
    g.add_argument("--weights_url", default=GOOGLE_WEIGHTS_URL, help="google_pretrained_weights: the zip to fetch")
    g = p.add_argument_group("text_formatting")
    g.add_argument(
        "--wiki_dump",
        help="a pages-articles .xml.bz2 to format (default: the downloaded one); a "
        "multistream dump beside its index, or a folder of the numbered part files, "
        "is formatted in pieces, as tasks of the engine",
    )
    g.add_argument("--wikiextractor_dir", help="format existing WikiExtractor output (wiki_* files) instead")
    g.add_argument(
        "--doc_boundary",
        choices=("file", "blank_line", "line"),
        default="file",
        help="plain text: a document per file (default), per blank-line-separated block, or per line",
    )
    g.add_argument(
        "--input_pattern",
        help="custom/books: which files in the folder (default *.txt, or *.parquet with --input_format parquet)",
    )
    g.add_argument(
        "--input_format",
        choices=("text", "parquet"),
        default="text",
        help="custom: text files, or Parquet files with a text column (read by row group, a document per row)",
    )
    g.add_argument("--text_column", default="text", help="custom Parquet input: the column that holds the text")
    g = p.add_argument_group("create_vocab (data/create_vocab.py: your own WordPiece vocabulary, Google's layout)")
    g.add_argument("--vocab_size", type=int, help="create_vocab: lines of the vocab.txt to learn (specials included)")
    g.add_argument(
        "--unused_slots",
        type=int,
        help="create_vocab: [unused] entries (default 99: [UNK] [CLS] [SEP] "
        "[MASK] at Google's ids 100-103, or 0 when the size is too small)",
    )
    g.add_argument(
        "--limit_alphabet", type=int, help="create_vocab: keep the N most frequent characters (default: all)"
    )
    g = p.add_argument_group("sharding")
    g.add_argument(
        "--input_files",
        help="comma-separated one-document-per-line files (default: the formatted ones; create_vocab reads them too)",
    )
    g.add_argument("--n_training_shards", type=int, default=256)
    g.add_argument("--n_test_shards", type=int, default=256)
    g.add_argument("--fraction_test_set", type=float, default=0.2, help="fraction of the bytes held out for test")
    g.add_argument("--segmentation_method", choices=("blingfire", "pysbd"), default="blingfire")
    g = p.add_argument_group("create_hdf5_files")
    g.add_argument(
        "--phase",
        type=int,
        choices=(1, 2),
        default=1,
        help="preset: 1 = seq 128 / 20 predictions, 2 = seq 512 / 80 predictions",
    )
    g.add_argument("--max_seq_length", type=int, help="overrides the phase preset")
    g.add_argument("--max_predictions_per_seq", type=int, help="overrides the phase preset")
    g.add_argument("--masked_lm_prob", type=float, default=0.15)
    g.add_argument("--short_seq_prob", type=float, default=0.1)
    g.add_argument("--dupe_factor", type=int, default=5)
    g.add_argument("--do_lower_case", type=int, choices=(0, 1), default=1, help="1 = uncased (default), 0 = cased")
    g.add_argument(
        "--vocab_file",
        help="WordPiece vocab.txt: read by create_hdf5_files, written by create_vocab "
        "(default there: <working_dir>/vocab.txt)",
    )
    g.add_argument("--overwrite", action="store_true", help="redo HDF5 files that already exist")
    p.add_argument("--random_seed", type=int, default=12345)
    p.add_argument(
        "--n_processes",
        type=int,
        default=os.cpu_count() or 1,
        help="parallel worker processes (--engine processes), or the local Dask cluster's workers",
    )
    g = p.add_argument_group(
        "engine (bert_recipe/prep/engine.py): where text_formatting, create_vocab, sharding and "
        "create_hdf5_files run their tasks; the outputs are the same on every engine"
    )
    g.add_argument(
        "--engine",
        choices=ENGINES,
        default="processes",
        help="processes: worker processes here (default); dask: a Dask cluster, local (--n_processes "
        "workers, started and stopped here) or the one --dask_scheduler_file names",
    )
    g.add_argument(
        "--dask_scheduler_file",
        help="--engine dask: join the cluster of this scheduler file (dask "
        "scheduler --scheduler-file FILE; data/prep.sub starts one)",
    )
    g.add_argument(
        "--dask_timeout",
        type=float,
        default=30.0,
        help="--engine dask: seconds to wait for the scheduler file, the scheduler and a worker",
    )
    p.add_argument("--no_progress", action="store_true", help="no progress bars")

    add_debug_argument(p)
    return p


def main(argv=None) -> int:
    """0 when the action finished; bad input, a failed download or a full disk: one line on stderr and exit
    status 1 (--debug: the traceback)."""
    with script_errors("bertPrep.py", argv):
        return _main(argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if not args.working_dir:
        raise InputError("set --working_dir, or BERT_PREP_WORKING_DIR / DATA_DIR in the environment")
    if args.n_processes < 1:
        raise InputError("--n_processes must be >= 1")
    if Path(args.working_dir).exists() and not Path(args.working_dir).is_dir():
        raise InputError(f"--working_dir {args.working_dir} is a file: name a folder")
    for key, value in PHASES[args.phase].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    dirs = directories(args)
    Path(args.working_dir).mkdir(parents=True, exist_ok=True)
    logger = JsonLogger(Path(args.working_dir) / "bertPrep_log.jsonl")
    logger.log("PARAMETER", {k: v for k, v in vars(args).items()})
    start = time.time()
    try:
        if args.action == "download":
            action_download(args, dirs, logger)
        else:
            run_on_engine(args, dirs, logger)
        logger.log("action_done", {"action": args.action, "dataset": args.dataset, **resources(start)})
    finally:
        logger.close()
    return 0


def run_on_engine(args, dirs, logger) -> None:
    """A computing action on the engine --engine names (started here, stopped when the action ends)."""

    config = EngineConfig(
        args.engine, args.n_processes, args.dask_scheduler_file, args.dask_timeout, progress=not args.no_progress
    )
    if args.dask_scheduler_file and args.engine != "dask":
        raise InputError("--dask_scheduler_file is for --engine dask: add it, or leave the file out")
    with open_engine(config, log_fn=lambda message: print(f"bertPrep.py: {message}", flush=True)) as engine:
        logger.log("engine", engine.describe())
        {
            "text_formatting": action_text_formatting,
            "create_vocab": action_create_vocab,
            "sharding": action_sharding,
            "create_hdf5_files": action_create_hdf5_files,
        }[args.action](args, dirs, logger, engine)


if __name__ == "__main__":
    sys.exit(main())
