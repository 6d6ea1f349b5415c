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
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

try:  # a checkout that was never installed: one line instead of a traceback
    from bert_recipe.io import flags
except ModuleNotFoundError as e:
    raise SystemExit(
        f"bertPrep.py: error: {e}: install the project (pip install -e . in the checkout, as "
        "scripts/setup_cpu.sh does) or run `python -m data.bertPrep ...` from the checkout"
    ) from None
from bert_recipe.io.atomic_io import JsonLogger, atomic_write_json, atomic_write_text
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.downloads import DownloadError, download, fetch_text, parse_checksum_file
from bert_recipe.io.flags import flag
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


# ----------------------------------------------------------------------------------------------------------------
# The flags: a section per stage, as --help groups them


@dataclass(frozen=True)
class Job:
    """What to do, to which dataset, where."""

    action: str = flag(required=True, choices=ACTIONS)
    """the stage to run"""
    dataset: str = flag(required=True, choices=DATASETS)
    """the corpus (see the datasets above)"""
    working_dir: str | None = flag(
        factory=lambda: os.environ.get("BERT_PREP_WORKING_DIR") or os.environ.get("DATA_DIR")
    )
    """root of every stage's folder (default: $BERT_PREP_WORKING_DIR, else $DATA_DIR)"""


@dataclass(frozen=True)
class Download:
    """Where each dataset comes from."""

    dump_date: str = "latest"
    """Wikipedia dump date YYYYMMDD, or 'latest'"""
    base_url: str = WIKI_BASE_URL
    """Wikipedia dump mirror"""
    wiki_dump_kind: Literal["multistream", "single"] = "multistream"
    """multistream (default): the dump in bz2 streams of 100 pages and its index, which text_formatting cuts into
    pieces for the engine's workers; single: one bz2 stream, read by one process"""
    books_dir: str | None = None
    """bookscorpus: a folder of plain-text books (used in place)"""
    books_url_list: str | None = None
    """bookscorpus: a file with one URL per line (optional checksum after it)"""
    input_dir: str | None = None
    """custom: your folder of text files"""
    weights_url: str = GOOGLE_WEIGHTS_URL
    """google_pretrained_weights: the zip to fetch"""


@dataclass(frozen=True)
class Formatting:
    """How the downloaded text becomes one document a line."""

    wiki_dump: str | None = None
    """a pages-articles .xml.bz2 to format (default: the downloaded one); a multistream dump beside its index, or a
    folder of the numbered part files, is formatted in pieces, as tasks of the engine"""
    wikiextractor_dir: str | None = None
    """format existing WikiExtractor output (wiki_* files) instead"""
    doc_boundary: Literal["file", "blank_line", "line"] = "file"
    """plain text: a document per file (default), per blank-line-separated block, or per line"""
    input_pattern: str | None = None
    """custom/books: which files in the folder (default *.txt, or *.parquet with --input_format parquet)"""
    input_format: Literal["text", "parquet"] = "text"
    """custom: text files, or Parquet files with a text column (read by row group, a document per row)"""
    text_column: str = "text"
    """custom Parquet input: the column that holds the text"""


@dataclass(frozen=True)
class Vocab:
    """Your own WordPiece vocabulary (bert_recipe/prep/vocab.py's learner)."""

    vocab_size: int | None = None
    """create_vocab: lines of the vocab.txt to learn (specials included)"""
    unused_slots: int | None = None
    """create_vocab: [unused] entries (default 99: [UNK] [CLS] [SEP] [MASK] at Google's ids 100-103, or 0 when the
    size is too small)"""
    limit_alphabet: int | None = None
    """create_vocab: keep the N most frequent characters (default: all)"""


@dataclass(frozen=True)
class Sharding:
    """How the documents are cut into shards."""

    input_files: str | None = None
    """comma-separated one-document-per-line files (default: the formatted ones; create_vocab reads them too)"""
    n_training_shards: int = 256
    """training shards to write"""
    n_test_shards: int = 256
    """test (held-out) shards to write"""
    fraction_test_set: float = 0.2
    """fraction of the bytes held out for test"""
    segmentation_method: Literal["blingfire", "pysbd"] = "blingfire"
    """how documents are split into sentences"""


@dataclass(frozen=True)
class Hdf5:
    """The HDF5 shards: create_pretraining_data.py's flags, with NVIDIA's phase presets and defaults."""

    phase: Literal[1, 2] = 1
    """preset: 1 = seq 128 / 20 predictions, 2 = seq 512 / 80 predictions"""
    max_seq_length: int | None = None
    """overrides the phase preset"""
    max_predictions_per_seq: int | None = None
    """overrides the phase preset"""
    masked_lm_prob: float = 0.15
    """create_pretraining_data.py --masked_lm_prob"""
    short_seq_prob: float = 0.1
    """create_pretraining_data.py --short_seq_prob"""
    dupe_factor: int = 5
    """create_pretraining_data.py --dupe_factor (NVIDIA's 5; that script's own default is 10)"""
    do_lower_case: Literal[0, 1] = 1
    """1 = uncased (default), 0 = cased"""
    vocab_file: str | None = None
    """WordPiece vocab.txt: read by create_hdf5_files, written by create_vocab (default there:
    <working_dir>/vocab.txt)"""
    overwrite: bool = False
    """redo HDF5 files that already exist"""


@dataclass(frozen=True)
class Workers:
    """Seeds and processes."""

    random_seed: int = 12345
    """the shards' seed (create_hdf5_files: shard i gets seed + i) and the sharding's"""
    n_processes: int = flag(factory=lambda: os.cpu_count() or 1)
    """parallel worker processes (--engine processes), or the local Dask cluster's workers"""


@dataclass(frozen=True)
class Engine:
    """Where the stages run their tasks."""

    engine: Literal["processes", "dask"] = "processes"
    """processes: worker processes here (default); dask: a Dask cluster, local (--n_processes workers, started and
    stopped here) or the one --dask_scheduler_file names"""
    dask_scheduler_file: str | None = None
    """--engine dask: join the cluster of this scheduler file (dask scheduler --scheduler-file FILE; data/prep.sub
    starts one)"""
    dask_timeout: float = 30.0
    """--engine dask: seconds to wait for the scheduler file, the scheduler and a worker"""


@dataclass(frozen=True)
class Display:
    """Progress."""

    no_progress: bool = False
    """no progress bars"""


@dataclass(frozen=True)
class PrepConfig(flags.Config):
    """Every flag of bertPrep.py. Sections in the order of the usage line; the untitled ones are listed under
    argparse's own heading."""

    job: Job = field(default_factory=Job)
    download: Download = field(default_factory=Download)
    """download"""
    formatting: Formatting = field(default_factory=Formatting)
    """text_formatting"""
    vocab: Vocab = field(default_factory=Vocab)
    """create_vocab (data/create_vocab.py: your own WordPiece vocabulary, Google's layout)"""
    sharding: Sharding = field(default_factory=Sharding)
    """sharding"""
    hdf5: Hdf5 = field(default_factory=Hdf5)
    """create_hdf5_files"""
    workers: Workers = field(default_factory=Workers)
    engine: Engine = field(default_factory=Engine)
    """engine (bert_recipe/prep/engine.py): where text_formatting, create_vocab, sharding and create_hdf5_files run
    their tasks; the outputs are the same on every engine"""
    display: Display = field(default_factory=Display)

    ungrouped: ClassVar[tuple[str, ...]] = ("job", "workers", "display")
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"

    def rules(self) -> list[tuple[bool, str]]:
        work = self.job.working_dir
        return [
            (not work, "set --working_dir, or BERT_PREP_WORKING_DIR / DATA_DIR in the environment"),
            (self.workers.n_processes < 1, "--n_processes must be >= 1"),
            (
                bool(work) and Path(work).exists() and not Path(work).is_dir(),
                f"--working_dir {work} is a file: name a folder",
            ),
        ]

    def with_phase_preset(self) -> PrepConfig:
        """The configuration with --max_seq_length and --max_predictions_per_seq from the --phase preset where they
        were not given."""
        preset = {k: v for k, v in PHASES[self.hdf5.phase].items() if getattr(self.hdf5, k) is None}
        return dataclasses.replace(self, hdf5=dataclasses.replace(self.hdf5, **preset))


def directories(cfg: PrepConfig) -> dict[str, Path]:
    work = Path(cfg.job.working_dir)
    suffix = (
        f"_lower_case_{int(bool(cfg.hdf5.do_lower_case))}_seq_len_{cfg.hdf5.max_seq_length}"
        f"_max_pred_{cfg.hdf5.max_predictions_per_seq}_masked_lm_prob_{cfg.hdf5.masked_lm_prob}"
        f"_random_seed_{cfg.workers.random_seed}_dupe_factor_{cfg.hdf5.dupe_factor}"
    )
    return {
        "download": work / "download",
        "formatted": work / "formatted_one_article_per_line",
        "sharded": work
        / (
            f"sharded_training_shards_{cfg.sharding.n_training_shards}_test_shards_{cfg.sharding.n_test_shards}"
            f"_fraction_{cfg.sharding.fraction_test_set}"
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


def download_wikipedia(cfg: PrepConfig, dest_dir: Path, logger) -> Path:

    if cfg.download.dump_date != "latest" and not re.fullmatch(r"\d{8}", cfg.download.dump_date):
        raise InputError(f"--dump_date must be 'latest' or YYYYMMDD, got {cfg.download.dump_date!r}")
    try:
        dump = resolve_wiki_dump(cfg.download.base_url, cfg.download.dump_date, kind=cfg.download.wiki_dump_kind)
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
                item["url"],
                dest_dir / item["filename"],
                checksum=item["checksum"],
                progress=not cfg.display.no_progress,
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
            raise InputError(f"{url_list} line {i + 1}: {e}") from e
    return paths


def extract_zip(archive: Path, dest_dir: Path) -> None:
    """Extract, refusing members that would land outside `dest_dir` (absolute paths, '..')."""
    root = dest_dir.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            if not (root / member).resolve().is_relative_to(root):
                raise InputError(f"{archive} holds an unsafe path {member!r}; not extracting")
        zf.extractall(root)


def action_download(cfg: PrepConfig, dirs, logger) -> None:

    for dataset in _parts(cfg.job.dataset):
        dest = dirs["download"] / dataset
        dest.mkdir(parents=True, exist_ok=True)
        if dataset == "wikicorpus_en":
            download_wikipedia(cfg, dest, logger)
        elif dataset == "bookscorpus":
            if cfg.download.books_url_list:
                paths = download_urls(Path(cfg.download.books_url_list), dest, not cfg.display.no_progress)
                logger.log("download", {"dataset": dataset, "files": len(paths)})
            elif cfg.download.books_dir:
                _require_dir(
                    cfg.download.books_dir, "--books_dir"
                )  # used in place by text_formatting, nothing to fetch
            else:
                raise InputError(
                    "bookscorpus has no public download: give --books_dir (a folder of .txt "
                    "books) or --books_url_list (a file of URLs)"
                )
        elif dataset == "custom":
            _require_dir(cfg.download.input_dir, "--input_dir")
        elif dataset == "google_pretrained_weights":
            try:
                archive = download(
                    cfg.download.weights_url,
                    dest / Path(cfg.download.weights_url).name,
                    progress=not cfg.display.no_progress,
                )
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


def action_text_formatting(cfg: PrepConfig, dirs, logger, engine) -> None:

    if cfg.job.dataset == "google_pretrained_weights":
        raise InputError("google_pretrained_weights has no text to format")
    progress = not cfg.display.no_progress
    for dataset in _parts(cfg.job.dataset):
        output = dirs["formatted"] / formatted_name(dataset)  # a folder of parts
        start = time.time()
        if dataset == "wikicorpus_en" and cfg.formatting.wikiextractor_dir:
            files = tf.list_text_files(
                [_require_dir(cfg.formatting.wikiextractor_dir, "--wikiextractor_dir")], "wiki_*"
            )
            counts = tf.format_text_files(files, output, "file", cfg.workers.n_processes, progress, engine, join=False)
        elif dataset == "wikicorpus_en":
            dump = (
                Path(cfg.formatting.wiki_dump)
                if cfg.formatting.wiki_dump
                else find_wiki_dump(dirs["download"] / dataset)
            )
            counts = tf.format_wiki_dump(
                dump, output, cfg.workers.n_processes, progress, logger, engine=engine, join=False
            )
        else:
            if dataset == "bookscorpus":
                folder = Path(cfg.download.books_dir) if cfg.download.books_dir else dirs["download"] / dataset
                folder = _require_dir(str(folder), "--books_dir")
            else:
                folder = _require_dir(cfg.download.input_dir, "--input_dir")
            if cfg.formatting.input_format == "parquet":
                files = tf.list_text_files([folder], cfg.formatting.input_pattern or "*.parquet")
                counts = tf.format_parquet_files(
                    files, output, cfg.formatting.text_column, cfg.workers.n_processes, progress, engine, join=False
                )
            else:
                files = tf.list_text_files([folder], cfg.formatting.input_pattern or "*.txt")
                counts = tf.format_text_files(
                    files, output, cfg.formatting.doc_boundary, cfg.workers.n_processes, progress, engine, join=False
                )
        logger.log(
            "text_formatting",
            {"dataset": dataset, "output": str(output), **counts, "elapsed_s": round(time.time() - start, 1)},
        )
        print(f"{dataset}: wrote {output} {dict(counts)}")


# --------------------------------------------------------------------------------------------------------------
# create_vocab


def vocab_output(cfg: PrepConfig) -> Path:
    return Path(cfg.hdf5.vocab_file) if cfg.hdf5.vocab_file else Path(cfg.job.working_dir) / "vocab.txt"


def action_create_vocab(cfg: PrepConfig, dirs, logger, engine) -> None:
    """A WordPiece vocabulary learned from the formatted text (data/create_vocab.py), in Google's layout, written to
    --vocab_file (default <working_dir>/vocab.txt) for create_hdf5_files. It runs before sharding because it
    needs only the formatted text, and learns from all of it: the test shards are held out from pre-training, not
    from the vocabulary (as with Google's)."""
    if cfg.job.dataset == "google_pretrained_weights":
        raise InputError("google_pretrained_weights has no text to learn a vocabulary from")
    if cfg.vocab.vocab_size is None:
        raise InputError(
            "--action create_vocab needs --vocab_size (8000-16000 for a small model, 30522 as bert-base-uncased)"
        )
    inputs = (
        cfg.sharding.input_files.split(",") if cfg.sharding.input_files else formatted_inputs(dirs, cfg.job.dataset)
    )
    for path in inputs:
        if not Path(path).is_file():
            raise InputError(
                f"{path} does not exist: run --action text_formatting --dataset {cfg.job.dataset} "
                "first (or pass --input_files)"
            )
    output = vocab_output(cfg)
    start = time.time()
    settings = VocabSettings(
        cfg.vocab.vocab_size, bool(cfg.hdf5.do_lower_case), cfg.vocab.unused_slots, cfg.vocab.limit_alphabet
    )
    result = create_vocab(
        inputs,
        output,
        settings,
        progress=not cfg.display.no_progress,
        output_flag="--vocab_file",
        log=lambda message: print(f"create_vocab: {message}", flush=True),
        engine=engine,
    )
    logger.log(
        "create_vocab",
        {
            "dataset": cfg.job.dataset,
            "output": str(output),
            **result.summary(),
            "elapsed_s": round(time.time() - start, 1),
        },
    )


# --------------------------------------------------------------------------------------------------------------
# sharding


def action_sharding(cfg: PrepConfig, dirs, logger, engine) -> None:
    if cfg.job.dataset == "google_pretrained_weights":
        raise InputError("google_pretrained_weights has no text to shard")
    inputs = (
        cfg.sharding.input_files.split(",") if cfg.sharding.input_files else formatted_inputs(dirs, cfg.job.dataset)
    )
    sharding = ShardingConfig(
        n_training_shards=cfg.sharding.n_training_shards,
        n_test_shards=cfg.sharding.n_test_shards,
        fraction_test_set=cfg.sharding.fraction_test_set,
        segmenter=cfg.sharding.segmentation_method,
        seed=cfg.workers.random_seed,
        num_workers=cfg.workers.n_processes,
    )
    prefix = dirs["sharded"] / cfg.job.dataset / cfg.job.dataset
    manifest = shard_corpus(
        inputs, prefix, sharding, progress=not cfg.display.no_progress, logger=logger, engine=engine
    )
    print(
        f"{cfg.job.dataset}: {manifest['documents']} documents -> {len(manifest['training'])} training + "
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


def cpd_arguments(cfg: PrepConfig, shard: Path, output: Path, seed: int, num_workers: int) -> list[str]:
    """create_pretraining_data.py's arguments for one shard (the interpreter and script are the worker's own)."""
    return [
        "--input_file",
        str(shard),
        "--output_file",
        str(output),
        "--vocab_file",
        str(cfg.hdf5.vocab_file),
        "--do_lower_case" if cfg.hdf5.do_lower_case else "--no-do_lower_case",
        "--max_seq_length",
        str(cfg.hdf5.max_seq_length),
        "--max_predictions_per_seq",
        str(cfg.hdf5.max_predictions_per_seq),
        "--masked_lm_prob",
        str(cfg.hdf5.masked_lm_prob),
        "--short_seq_prob",
        str(cfg.hdf5.short_seq_prob),
        "--dupe_factor",
        str(cfg.hdf5.dupe_factor),
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


def _check_same_vocabulary(cfg: PrepConfig, out_dir: Path, existing: list[Path]) -> None:
    """Finished HDF5 files are kept on a rerun: refuse to mix them with files of another vocabulary (a rerun with
    another VOCAB_SIZE relearns vocab.txt; the folder's name does not say which vocabulary made it). The folder
    records the sha256 of the vocab.txt its files were made with; --overwrite removes the old files first."""
    digest = hashlib.sha256(Path(cfg.hdf5.vocab_file).read_bytes()).hexdigest()
    stamp = out_dir / "vocab.sha256"
    before = (stamp.read_text().split() or [None])[0] if stamp.is_file() else None
    if existing and before not in (None, digest):
        if not cfg.hdf5.overwrite:
            raise InputError(
                f"{out_dir} holds {len(existing)} HDF5 file(s) made with another vocabulary than "
                f"--vocab_file {cfg.hdf5.vocab_file}: pass --overwrite to redo them, or remove the folder"
            )
        for path in existing:  # before the new stamp: an interrupted rerun must not keep them as the new vocab's
            path.unlink()
    atomic_write_text(stamp, f"{digest}  {cfg.hdf5.vocab_file}\n")


def action_create_hdf5_files(cfg: PrepConfig, dirs, logger, engine) -> None:
    """create_pretraining_data.py over every shard, each a task on the engine (in a process of its own).

    Shard i (its index among the shards' paths in sorted order) gets --random_seed random_seed + i, so shards do not
    repeat one another's random choices, and the files equal those of one `create_pretraining_data.py
    --input_file <shard folder> --output_dir ...` call, whatever the engine. `<hdf5 folder>/manifest.json` lists
    every finished file (instances, sha256) with the settings that made it: a rerun computes only the files it
    does not list (or whose sha256 changed); --overwrite redoes them all.
    """
    if not (REPO_ROOT / "create_pretraining_data.py").is_file():
        raise InputError(f"{REPO_ROOT / 'create_pretraining_data.py'} is missing")
    if not cfg.hdf5.vocab_file or not Path(cfg.hdf5.vocab_file).is_file():
        raise InputError(
            f"--vocab_file {cfg.hdf5.vocab_file} does not exist (BERT's uncased vocab.txt: e.g. "
            f"--action download --dataset google_pretrained_weights)"
        )
    shard_dir = dirs["sharded"] / cfg.job.dataset
    shards = list_shards(shard_dir, cfg.job.dataset)
    if not shards:
        raise InputError(f"no shards in {shard_dir}: run --action sharding with the same shard flags first")
    out_dir = dirs["hdf5"] / cfg.job.dataset
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    seed_index = {path: i for i, path in enumerate(sorted(str(s) for s in shards))}
    # Training and held-out (test) shards go to folders of their own: run_pretraining.py trains on every *.hdf5
    # of --input_dir, so the held-out articles must not sit beside the training ones.
    todo = [(seed_index[str(s)], s, out_dir / hdf5_split(s) / f"{s.stem}.hdf5") for s in shards]
    for split in {hdf5_split(s) for s in shards}:
        (out_dir / split).mkdir(parents=True, exist_ok=True)
    _check_same_vocabulary(cfg, out_dir, [t[2] for t in todo if t[2].exists()])
    settings = {
        "arguments": cpd_arguments(cfg, Path("SHARD"), Path("OUTPUT"), cfg.workers.random_seed, 1),
        "vocab_sha256": hashlib.sha256(Path(cfg.hdf5.vocab_file).read_bytes()).hexdigest(),
        "shards": [[s.name, s.stat().st_size] for s in shards],
    }
    manifest = Manifest.open(out_dir / "manifest.json", settings)
    todo = [t for t in todo if cfg.hdf5.overwrite or not manifest.reusable(str(t[2].relative_to(out_dir)))]
    # Processes here: a few shards at a time, each with the rest of the cores; Dask: one shard a worker.
    concurrency = max(1, min(cfg.workers.n_processes, len(todo))) if engine.name == "processes" else 1
    workers_each = max(1, cfg.workers.n_processes // concurrency) if engine.name == "processes" else 1
    jobs = [
        (
            str(shard),
            str(output),
            cpd_arguments(cfg, shard, output, cfg.workers.random_seed + i, workers_each),
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
    print(f"{cfg.job.dataset}: {len(todo)} HDF5 files written ({len(shards) - len(todo)} reused) in {out_dir}")


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


def main(argv=None) -> int:
    """0 when the action finished; bad input, a failed download or a full disk: one line on stderr and exit
    status 1 (--debug: the traceback)."""
    with script_errors("bertPrep.py", argv):
        return _main(argv)


def _main(argv) -> int:
    cfg = flags.parse(PrepConfig, "bertPrep.py", __doc__, argv).with_phase_preset()
    dirs = directories(cfg)
    Path(cfg.job.working_dir).mkdir(parents=True, exist_ok=True)
    logger = JsonLogger(Path(cfg.job.working_dir) / "bertPrep_log.jsonl")
    logger.log("PARAMETER", cfg.flags())
    start = time.time()
    try:
        if cfg.job.action == "download":
            action_download(cfg, dirs, logger)
        else:
            run_on_engine(cfg, dirs, logger)
        logger.log("action_done", {"action": cfg.job.action, "dataset": cfg.job.dataset, **resources(start)})
    finally:
        logger.close()
    return 0


def run_on_engine(cfg: PrepConfig, dirs, logger) -> None:
    """A computing action on the engine --engine names (started here, stopped when the action ends)."""
    config = EngineConfig(
        cfg.engine.engine,
        cfg.workers.n_processes,
        cfg.engine.dask_scheduler_file,
        cfg.engine.dask_timeout,
        progress=not cfg.display.no_progress,
    )
    if cfg.engine.dask_scheduler_file and cfg.engine.engine != "dask":
        raise InputError("--dask_scheduler_file is for --engine dask: add it, or leave the file out")
    with open_engine(config, log_fn=lambda message: print(f"bertPrep.py: {message}", flush=True)) as engine:
        logger.log("engine", engine.describe())
        {
            "text_formatting": action_text_formatting,
            "create_vocab": action_create_vocab,
            "sharding": action_sharding,
            "create_hdf5_files": action_create_hdf5_files,
        }[cfg.job.action](cfg, dirs, logger, engine)


if __name__ == "__main__":
    sys.exit(main())
