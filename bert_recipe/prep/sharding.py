"""One-document-per-line text -> N training + M test shards of one sentence per line, a blank line between documents.

Streaming in three passes, so memory holds one document's text at a time plus a small index (under 100 bytes per
document: about 0.5 GB for English Wikipedia's ~6.5 M articles at the peak of pass 2), never the corpus:
  1. segment: the input files are cut into fixed byte ranges (aligned to lines); worker processes split each
     document into sentences and write the result to a temporary file per range, returning only the byte size of
     every segmented document.
  2. assign: a seeded permutation picks the test documents (until `fraction_test_set` of the bytes); then each
     side is balanced by size, largest document first onto the currently smallest shard (LPT: any two shards
     differ by at most the largest document).
  3. write: worker processes write whole shards (atomically), copying each document's bytes from pass 1.
Documents are never split across shards. The output depends only on the inputs, the seed and the segmenter: every
document keeps its corpus position whatever the byte ranges, so any --num_workers gives identical shards.

    python -m bert_recipe.prep.sharding --input_files wiki_one_article_per_line.txt --output_prefix out/wikicorpus_en \\
        --n_training_shards 256 --n_test_shards 256 --fraction_test_set 0.2 --num_workers 16
    # -> out/wikicorpus_en_training_0.txt ... out/wikicorpus_en_test_255.txt, out/wikicorpus_en_manifest.json
"""

from __future__ import annotations

import argparse
import heapq
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prep.engine import EngineConfig, ProcessEngine
from bert_recipe.prep.manifest import Manifest, sha256_file
from bert_recipe.prep.sentence_segmentation import SEGMENTERS, get_segmenter


@dataclass
class ShardingConfig:
    n_training_shards: int = 256
    n_test_shards: int = 256
    fraction_test_set: float = 0.2  # of the bytes, as the original's fraction of the data; 0 with no test shards
    segmenter: str = "blingfire"
    seed: int = 12345
    num_workers: int = 1
    chunk_bytes: int = 16 << 20  # pass-1 work unit (documents keep corpus order whatever the chunking)


# --------------------------------------------------------------------------------------------------------------
# Pass 1: segmentation, parallel over fixed byte ranges of the inputs

_SEGMENTER_CACHE: dict = {}


def plan_chunks(files: list[Path], chunk_bytes: int) -> list[tuple[str, int, int]]:
    """(path, start, end) byte ranges covering every file; a line belongs to the range its first byte is in."""
    return [
        (str(f), start, min(start + chunk_bytes, f.stat().st_size))
        for f in files
        for start in range(0, f.stat().st_size, chunk_bytes)
    ]


def range_lines(f, start: int, end: int) -> Iterator[bytes]:
    """The lines of an open binary file whose first byte lies in [start, end): a range of plan_chunks (the line
    straddling `start` belongs to the previous range)."""
    if start > 0:
        f.seek(start - 1)
        f.readline()
    pos = f.tell()
    while pos < end:
        line = f.readline()
        if not line:
            return
        pos += len(line)
        yield line


def _segment_chunk(job: tuple[str, int, int, str, str]) -> tuple[int, str]:
    """Task: split each document (line) of one byte range into sentences; write them to `seg_path` as
    'sentence\\n...sentence\\n\\n' per document, and each document's size in bytes there to `seg_path`.npy (both
    atomically). Returns (documents, the segmented file's sha256)."""
    path, start, end, seg_path, segmenter = job
    split = _SEGMENTER_CACHE.get(segmenter) or _SEGMENTER_CACHE.setdefault(segmenter, get_segmenter(segmenter))
    sizes = []
    with open(path, "rb") as f, atomic_open(seg_path, "wb") as out:
        for line in range_lines(f, start, end):
            sentences = split(" ".join(line.decode("utf-8", errors="replace").split()))
            if sentences:
                doc = ("\n".join(sentences) + "\n\n").encode("utf-8")
                out.write(doc)
                sizes.append(len(doc))
    with atomic_open(seg_path + ".npy", "wb") as out:
        np.save(out, np.asarray(sizes, dtype=np.int64))
    return len(sizes), sha256_file(seg_path)


# --------------------------------------------------------------------------------------------------------------
# Pass 2: assignment


def balanced_assignment(sizes: np.ndarray, doc_ids: np.ndarray, n_shards: int) -> np.ndarray:
    """LPT: documents largest first (ties by id), each onto the currently smallest shard (ties by shard index).
    Returns int64 [len(doc_ids)]: the shard of each of `doc_ids`, in the order given."""
    order = np.lexsort((doc_ids, -sizes[doc_ids]))
    heap = [(0, shard) for shard in range(n_shards)]
    shard_of = np.empty(len(doc_ids), dtype=np.int64)
    for i in order:
        load, shard = heapq.heappop(heap)
        shard_of[i] = shard
        heapq.heappush(heap, (load + int(sizes[doc_ids[i]]), shard))
    return shard_of


def assign_shards(sizes: np.ndarray, cfg: ShardingConfig) -> np.ndarray:
    """int64 [n_docs]: shard index per document; 0..N-1 are training shards, N..N+M-1 test shards."""
    n_docs = len(sizes)
    n_shards = cfg.n_training_shards + cfg.n_test_shards
    if n_docs < n_shards:
        raise InputError(f"only {n_docs} documents for {n_shards} shards: lower --n_training_shards / --n_test_shards")
    perm = np.random.default_rng(cfg.seed).permutation(n_docs)
    n_test = 0
    if cfg.n_test_shards:
        target = cfg.fraction_test_set * int(sizes.sum())
        n_test = int(np.searchsorted(np.cumsum(sizes[perm]), target)) + 1
        # at least one document per test shard, and one per training shard left over
        n_test = min(max(n_test, cfg.n_test_shards), n_docs - cfg.n_training_shards)
    test_ids, train_ids = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    shard_of = np.empty(n_docs, dtype=np.int64)
    shard_of[train_ids] = balanced_assignment(sizes, train_ids, cfg.n_training_shards)
    if n_test:
        shard_of[test_ids] = cfg.n_training_shards + balanced_assignment(sizes, test_ids, cfg.n_test_shards)
    return shard_of


# --------------------------------------------------------------------------------------------------------------
# Pass 3: writing


def _write_shard(job: tuple[str, list[str], np.ndarray, np.ndarray, np.ndarray]) -> tuple[str, int, int, str]:
    """Task: copy the given documents (in corpus order) from the segmented files into one shard, atomically.
    Returns (the shard's path, documents, bytes, sha256)."""
    out_path, seg_paths, chunk, offset, size = job
    current, f = -1, None
    try:
        with atomic_open(out_path, "wb") as out:
            for c, off, n in zip(chunk.tolist(), offset.tolist(), size.tolist()):
                if c != current:
                    if f:
                        f.close()
                    f, current = open(seg_paths[c], "rb"), c
                f.seek(off)
                out.write(f.read(n))
    finally:
        if f:
            f.close()
    return out_path, len(size), int(size.sum()), sha256_file(out_path)


def shard_name(prefix: str | os.PathLike, split: str, index: int) -> Path:
    return Path(f"{prefix}_{split}_{index}.txt")


def shard_corpus(
    input_files: list[str | os.PathLike],
    output_prefix: str | os.PathLike,
    cfg: ShardingConfig,
    progress: bool = True,
    logger=None,
    engine=None,
) -> dict:
    """Run the three passes on `engine` (bert_recipe.prep.engine; None: `cfg.num_workers` processes here); returns the
    manifest (also written to `<output_prefix>_manifest.json`: the settings, and every shard's documents, bytes and
    sha256).

    A rerun with the same inputs and settings reuses every shard the manifest lists whose sha256 still matches, and
    every segmented range of pass 1 still on disk (in `.<name>_segmented/` beside the shards, removed once every
    shard is written): after a crash it computes only what is missing."""
    files = [Path(f) for f in input_files]
    for f in files:
        if not f.is_file():
            raise InputError(f"sharding input {f} does not exist (run --action text_formatting first)")
    if cfg.n_training_shards < 1 or cfg.n_test_shards < 0 or not 0.0 <= cfg.fraction_test_set < 1.0:
        raise InputError("need --n_training_shards >= 1, --n_test_shards >= 0, 0 <= --fraction_test_set < 1")
    if cfg.n_test_shards and cfg.fraction_test_set == 0:
        raise InputError("--n_test_shards > 0 needs --fraction_test_set > 0 (or set --n_test_shards 0)")
    if cfg.num_workers < 1 or cfg.chunk_bytes <= 0:
        raise InputError("--num_workers must be >= 1 and --chunk_mb > 0")
    engine = engine or ProcessEngine(EngineConfig("processes", cfg.num_workers, progress=progress))
    output_prefix = Path(output_prefix)
    output_prefix.parent.mkdir(parents=True, exist_ok=True)
    start_time = time.time()
    settings = {
        "inputs": [[str(f), f.stat().st_size] for f in files],
        "n_training_shards": cfg.n_training_shards,
        "n_test_shards": cfg.n_test_shards,
        "fraction_test_set": cfg.fraction_test_set,
        "segmenter": cfg.segmenter,
        "seed": cfg.seed,
    }
    manifest = Manifest.open(f"{output_prefix}_manifest.json", settings)
    n_shards = cfg.n_training_shards + cfg.n_test_shards
    names = [
        shard_name(
            output_prefix, *(("training", i) if i < cfg.n_training_shards else ("test", i - cfg.n_training_shards))
        )
        for i in range(n_shards)
    ]
    missing = [i for i, path in enumerate(names) if not manifest.reusable(path.name)]
    seg_dir = output_prefix.parent / f".{output_prefix.name}_segmented"
    if missing:
        sizes, chunk_of, offset_of, seg_paths = _segment(files, cfg, seg_dir, settings, engine, logger, start_time)
        shard_of = assign_shards(sizes, cfg)
        order = np.lexsort((np.arange(len(sizes)), shard_of))  # by shard, then corpus order
        bounds = np.searchsorted(shard_of[order], np.arange(n_shards + 1))
        write_jobs = []
        for shard in missing:
            docs = order[bounds[shard] : bounds[shard + 1]]
            write_jobs.append((str(names[shard]), seg_paths, chunk_of[docs], offset_of[docs], sizes[docs]))
        try:
            for _, (path, n_docs, n_bytes, digest) in engine.map(_write_shard, write_jobs, desc="writing shards"):
                manifest.record(Path(path).name, n_docs, digest, bytes=n_bytes)
        finally:
            manifest.save()
        documents, total_bytes = int(len(sizes)), int(sizes.sum())
    else:
        documents = sum(manifest.outputs[p.name]["rows"] for p in names)
        total_bytes = sum(manifest.outputs[p.name]["bytes"] for p in names)
    shutil.rmtree(seg_dir, ignore_errors=True)  # every shard is whole: the segmented ranges are no longer needed
    listing = [
        {
            "file": p.name,
            "documents": manifest.outputs[p.name]["rows"],
            "bytes": manifest.outputs[p.name]["bytes"],
            "sha256": manifest.outputs[p.name]["sha256"],
        }
        for p in names
    ]
    summary = {
        "inputs": [str(f) for f in files],
        "config": asdict(cfg),
        "documents": documents,
        "bytes": total_bytes,
        "elapsed_s": round(time.time() - start_time, 1),
        "reused_shards": n_shards - len(missing),
        "training": listing[: cfg.n_training_shards],
        "test": listing[cfg.n_training_shards :],
    }
    manifest.save(**summary)
    manifest.report("sharding")
    if logger is not None:
        logger.log(
            "sharding",
            {
                "stage": "done",
                "documents": documents,
                "bytes": total_bytes,
                "reused_shards": n_shards - len(missing),
                "elapsed_s": summary["elapsed_s"],
            },
        )
    return {"settings": settings, **summary}


def _segment(
    files: list[Path], cfg: ShardingConfig, seg_dir: Path, settings: dict, engine, logger, start_time
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Pass 1 on the engine, reusing the ranges a crashed run segmented already. Returns every document's size,
    segmented file (index) and byte offset there, and the segmented files."""
    seg_dir.mkdir(parents=True, exist_ok=True)
    chunks = plan_chunks(files, cfg.chunk_bytes)
    ledger = Manifest.open(seg_dir / "segmented.json", {**settings, "chunk_bytes": cfg.chunk_bytes})
    seg_paths = [str(seg_dir / f"{i:08d}.txt") for i in range(len(chunks))]
    jobs = [(*chunk, seg, cfg.segmenter) for chunk, seg in zip(chunks, seg_paths)]
    todo = [
        i for i, seg in enumerate(seg_paths) if not (ledger.reusable(Path(seg).name) and Path(seg + ".npy").is_file())
    ]
    try:
        for k, (n_docs, digest) in engine.map(_segment_chunk, [jobs[i] for i in todo], desc="segmenting"):
            ledger.record(Path(seg_paths[todo[k]]).name, n_docs, digest)
    finally:
        ledger.save()
    ledger.report("sharding (segmentation)")
    sizes_per_chunk = [np.load(seg + ".npy") for seg in seg_paths]
    sizes = np.concatenate(sizes_per_chunk) if sizes_per_chunk else np.zeros(0, dtype=np.int64)
    # Where each document lives: (segmented file, byte offset there, byte size).
    chunk_of = np.repeat(np.arange(len(chunks), dtype=np.int32), [len(s) for s in sizes_per_chunk])
    offset_of = np.concatenate([np.cumsum(s) - s for s in sizes_per_chunk]) if sizes_per_chunk else sizes
    if logger is not None:
        logger.log(
            "sharding",
            {
                "stage": "segmented",
                "documents": len(sizes),
                "bytes": int(sizes.sum()),
                "elapsed_s": round(time.time() - start_time, 1),
            },
        )
    return sizes, chunk_of, offset_of, seg_paths


# --------------------------------------------------------------------------------------------------------------
# CLI


@dataclass(frozen=True)
class ShardFlags:
    """The documents, the shards to write and how they are cut (ShardingConfig's defaults)."""

    input_files: list[str] = flag(required=True)
    """one-document-per-line text files"""
    output_prefix: str = flag(required=True)
    """shards are <prefix>_training_<i>.txt, <prefix>_test_<i>.txt"""
    n_training_shards: int = ShardingConfig.n_training_shards
    """training shards to write"""
    n_test_shards: int = ShardingConfig.n_test_shards
    """test (held-out) shards to write"""
    fraction_test_set: float = ShardingConfig.fraction_test_set
    """the share of the bytes held out for the test shards"""
    segmenter: str = flag(ShardingConfig.segmenter, choices=SEGMENTERS)
    """how documents are split into sentences"""
    random_seed: int = ShardingConfig.seed
    """picks the test documents"""
    num_workers: int = flag(factory=lambda: os.cpu_count() or 1)
    """worker processes (default: the CPUs of this machine)"""
    chunk_mb: float = ShardingConfig.chunk_bytes / (1 << 20)
    """segmentation work unit in MiB (the shards do not depend on it)"""
    no_progress: bool = False
    """no progress bars"""

    def sharding(self) -> ShardingConfig:
        """The library's settings from these flags."""
        return ShardingConfig(
            n_training_shards=self.n_training_shards,
            n_test_shards=self.n_test_shards,
            fraction_test_set=self.fraction_test_set,
            segmenter=self.segmenter,
            seed=self.random_seed,
            num_workers=self.num_workers,
            chunk_bytes=int(self.chunk_mb * (1 << 20)),
        )


@dataclass(frozen=True)
class ShardCommandConfig(flags.Config):
    """Every flag of sharding.py."""

    shard: ShardFlags = field(default_factory=ShardFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("shard",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"


def main(argv=None) -> int:
    """0 when the shards are written; bad input: one line on stderr, exit status 1."""
    with script_errors("sharding.py", argv):
        args = flags.parse(ShardCommandConfig, "sharding.py", __doc__, argv).shard
        manifest = shard_corpus(args.input_files, args.output_prefix, args.sharding(), progress=not args.no_progress)
    print(
        f"wrote {len(manifest['training'])} training + {len(manifest['test'])} test shards of "
        f"{manifest['documents']} documents to {Path(args.output_prefix).parent}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
