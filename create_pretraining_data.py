"""Pre-training examples (masked LM + next sentence) from plain text, written as NVIDIA's HDF5 shards: the flags
and main(); the stages are pretraining/shard_writer.py's, the layout, masking and packing pretraining/shard_format.py's.

Input: one sentence per line, a blank line between documents. `--input_file` is a file, a comma-separated list,
a glob, or a folder of .txt files. With `--output_file` every input file goes into ONE corpus and one HDF5 file
(Google's behaviour: the random "next sentence" may come from any of them). With `--output_dir` every input file is
a shard of its own, written to `<output_dir>/<stem>.hdf5` with seed `--random_seed + i` (i = the shard's index in
sorted order), exactly what `data/bertPrep.py --action create_hdf5_files` does with one call per shard. The start of
a file always starts a new document (Google would glue the last document of one file to the first of the next).

The instances follow Google's algorithm (documents shuffled, `--dupe_factor` passes, pairs with a random next
sentence half the time, truncation, `--max_predictions_per_seq` masks 80/10/10, all instances shuffled); the
same `--random_seed` gives identical arrays for any `--num_workers`, and memory does not grow with the number of
instances (pretraining/shard_writer.py says how).

Output: NVIDIA's layout, zero-padded; gzip (--gzip_level, default 1, with HDF5's shuffle filter: h5py reads it
like any NVIDIA shard) unless --compression none. N instances, S = max_seq_length, P = max_predictions_per_seq:
    input_ids [N,S] int32, input_mask [N,S] int8, segment_ids [N,S] int8,
    masked_lm_positions [N,P] int32, masked_lm_ids [N,P] int32 (unused slots 0; position 0 is [CLS], never masked),
    next_sentence_labels [N] int8 (1 = B is a random next).
With --no_static_masking the input_ids are left unmasked and masked_lm_positions/masked_lm_ids are all zeros; the
file attribute `masking` is "dynamic" (else "static") and the loader draws masks per epoch with
shard_format.dynamic_mask. With --pack_sequences K (K >= 2) up to K instances share a row, first-fit-
decreasing over windows of 8,192 shuffled instances, and the shard adds next_sentence_positions [N,K] (the packed
layout: pretraining/shard_format.py); the summary line reports instances and packed_rows.

Example:
    python create_pretraining_data.py --input_file shard_0.txt --output_file shard_0.hdf5 \\
        --vocab_file vocab.txt --do_lower_case --max_seq_length 128 --max_predictions_per_seq 20 \\
        --masked_lm_prob 0.15 --short_seq_prob 0.1 --dupe_factor 5 --random_seed 12345 --num_workers 8
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Sequence

import numpy as np

from bert_recipe.io import flags
from bert_recipe.io.cli import InputError, check_output_path, describe_error, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prep.text_formatting import check_text_file
from bert_recipe.pretraining import shard_writer as writer
from tokenization import load_vocab


def resolve_inputs(spec: str) -> list[str]:
    """A file, a folder of .txt files, or a comma-separated list of files/folders/globs, in sorted order."""
    files: list[str] = []
    for part in (s.strip() for s in spec.split(",")):
        if not part:
            continue
        if os.path.isdir(part):
            found = sorted(str(p) for p in Path(part).glob("*.txt") if p.is_file())
            if not found:
                raise InputError(f"--input_file {part} is a folder without .txt files")
            files.extend(found)
        elif os.path.isfile(part):
            files.append(part)
        elif any(c in part for c in "*?[") and glob.glob(part):
            files.extend(sorted(p for p in glob.glob(part) if os.path.isfile(p)))
        else:
            raise InputError(
                f"--input_file {part} does not exist (a text file, a folder of .txt files, or a comma-separated list)"
            )
    if not files:
        raise InputError("--input_file names no files")
    for path in files:
        _check_text(path)
    return files


def _check_text(path: str) -> None:
    """Refuse a corpus file that is not text (bert_recipe.prep.text_formatting.check_text_file), naming --input_file."""
    check_text_file(path, what="--input_file", expected=", one sentence per line")


@dataclass(frozen=True)
class Files:
    """The corpus, where the shards go, the vocabulary."""

    input_file: str | None = flag(None, required=True)
    """a text file, a folder of .txt files, or a comma-separated list (one sentence per line, blank line between
    documents)"""
    output_file: str | None = flag(None, exclusive="output")
    """one HDF5 file from all inputs together"""
    output_dir: str | None = flag(None, exclusive="output")
    """one <stem>.hdf5 per input file, shard i with seed random_seed + i"""
    vocab_file: str | None = flag(None, required=True)
    """BERT vocab.txt"""
    do_lower_case: bool = flag(
        True,
        action=argparse.BooleanOptionalAction,
        switches=[flags.Switch(("--no_do_lower_case",), False, argparse.SUPPRESS, default=True)],
    )
    """lower-case and strip accents (uncased vocabularies; the default, as in Google's and NVIDIA's scripts);
    --no-do_lower_case / --no_do_lower_case for cased ones"""


@dataclass(frozen=True)
class Instances:
    """Google's instances, their masks and packing (writer.InstanceConfig's flags and defaults), and the workers
    that make them."""

    max_seq_length: int = writer.InstanceConfig.max_seq_length
    """tokens per instance: [CLS] A [SEP] B [SEP], zero-padded"""
    max_predictions_per_seq: int = writer.InstanceConfig.max_predictions_per_seq
    """masked positions per instance, at most"""
    masked_lm_prob: float = writer.InstanceConfig.masked_lm_prob
    """the share of the tokens masked"""
    short_seq_prob: float = writer.InstanceConfig.short_seq_prob
    """the share of instances cut shorter than max_seq_length on purpose"""
    dupe_factor: int = writer.InstanceConfig.dupe_factor
    """passes over the data, each with new masks/pairs"""
    random_seed: int = writer.InstanceConfig.random_seed
    """master seed: the same seed gives identical arrays for any --num_workers"""
    num_workers: int = flag(factory=lambda: len(os.sched_getaffinity(0)))
    """worker processes (default: the CPUs available); 1 runs in this process"""
    do_whole_word_mask: bool = writer.InstanceConfig.do_whole_word_mask
    """mask whole words (all their ## pieces)"""
    no_static_masking: bool = False
    """write unmasked input_ids and all-zero masked_lm_positions/ids (attribute masking='dynamic') for a loader that
    masks per epoch with dynamic_mask()"""
    pack_sequences: int = flag(writer.InstanceConfig.pack_sequences, metavar="K")
    """sequence packing: put up to K (>= 2) instances into each row of max_seq_length, first-fit-decreasing over
    windows of 8,192 shuffled instances; adds next_sentence_positions [N,K] int32, makes next_sentence_labels [N,K]
    int8 (-1: unused slot) and masked_lm_* [N,P_row] (P_row = min(K*P, floor(S*masked_lm_prob) + K));
    run_pretraining.py detects packed shards (default 0: one instance a row)"""


@dataclass(frozen=True)
class Writing:
    """How the HDF5 file is stored and the workers start (writer.ShardWriting's defaults): none changes the arrays."""

    compression: Literal["gzip", "none"] = "gzip"
    """HDF5 compression (NVIDIA: gzip)"""
    gzip_level: int = flag(writer.ShardWriting.gzip_level, choices=range(1, 10), metavar="{1..9}")
    """zlib level (default 1: with the shuffle filter, smaller than NVIDIA's level-4 files and twice as fast to
    write)"""
    mp_start_method: Literal["auto", "spawn", "forkserver", "fork"] = "auto"
    """how worker processes start; auto: fork on Linux when this process runs no other thread (cheap), else spawn
    (safe everywhere)"""
    no_progress: bool = False
    """no tqdm progress bars"""


@dataclass(frozen=True)
class CreateConfig(flags.Config):
    """Every flag of create_pretraining_data.py."""

    files: Files = field(default_factory=Files)
    instances: Instances = field(default_factory=Instances)
    writing: Writing = field(default_factory=Writing)

    ungrouped: ClassVar[tuple[str, ...]] = ("files", "instances", "writing")
    required_groups: ClassVar[tuple[str, ...]] = ("output",)
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"

    def rules(self) -> list[tuple[bool, str]]:
        i, vocab_file = self.instances, self.files.vocab_file
        s, p = i.max_seq_length, i.max_predictions_per_seq
        return [
            (s < 5, f"--max_seq_length {s} must be at least 5 ([CLS] A [SEP] B [SEP])"),
            (p < 1 or p > s, f"--max_predictions_per_seq {p} must be in [1, max_seq_length={s}]"),
            (not 0.0 < i.masked_lm_prob <= 1.0, f"--masked_lm_prob {i.masked_lm_prob} must be in (0, 1]"),
            (not 0.0 <= i.short_seq_prob <= 1.0, f"--short_seq_prob {i.short_seq_prob} must be in [0, 1]"),
            (i.dupe_factor < 1, f"--dupe_factor {i.dupe_factor} must be at least 1"),
            (i.random_seed < 0, f"--random_seed {i.random_seed} must be a non-negative integer"),
            (i.num_workers < 1, f"--num_workers {i.num_workers} must be at least 1"),
            (
                i.pack_sequences == 1 or i.pack_sequences < 0,
                f"--pack_sequences {i.pack_sequences} must be 0 (no packing) or at least 2 (sequences a row)",
            ),
            (os.path.isdir(vocab_file), f"--vocab_file {vocab_file} is a folder: name the vocab.txt in it"),
            (not os.path.exists(vocab_file), f"--vocab_file {vocab_file} does not exist: give a BERT vocab.txt"),
        ]


def main(argv: Sequence[str] | None = None) -> int:
    """0 when every output was written; a one-line error (exit 1) for bad input or a full disk (--debug: the
    traceback)."""
    with script_errors("create_pretraining_data.py", argv):
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    cfg = flags.parse(CreateConfig, "create_pretraining_data.py", __doc__, argv)
    files = resolve_inputs(cfg.files.input_file)

    try:
        vocab = load_vocab(cfg.files.vocab_file)
    except (ValueError, OSError) as e:
        raise InputError(f"--vocab_file {cfg.files.vocab_file}: {describe_error(e)}") from e
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise InputError(f"--vocab_file {cfg.files.vocab_file} lacks {missing}: is it a BERT vocab.txt?")
    vocab_size = max(vocab.values()) + 1  # ids are line numbers of the vocabulary file
    instance = writer.InstanceConfig(
        max_seq_length=cfg.instances.max_seq_length,
        max_predictions_per_seq=cfg.instances.max_predictions_per_seq,
        masked_lm_prob=cfg.instances.masked_lm_prob,
        short_seq_prob=cfg.instances.short_seq_prob,
        dupe_factor=cfg.instances.dupe_factor,
        random_seed=cfg.instances.random_seed,
        do_whole_word_mask=cfg.instances.do_whole_word_mask,
        static_masking=not cfg.instances.no_static_masking,
        pack_sequences=cfg.instances.pack_sequences,
        vocab_size=vocab_size,
        cls_id=vocab["[CLS]"],
        sep_id=vocab["[SEP]"],
        mask_id=vocab["[MASK]"],
    )
    is_subword = None  # "##" pieces by id, for whole-word masking
    if cfg.instances.do_whole_word_mask:
        is_subword = np.zeros(vocab_size, dtype=bool)
        is_subword[[i for t, i in vocab.items() if t.startswith("##")]] = True
    if cfg.files.output_file:
        jobs = [(files, Path(cfg.files.output_file), instance)]
    else:
        jobs = [
            (
                [f],
                Path(cfg.files.output_dir) / f"{Path(f).stem}.hdf5",
                dataclasses.replace(instance, random_seed=instance.random_seed + i),
            )
            for i, f in enumerate(files)
        ]
    if cfg.files.output_dir and os.path.exists(cfg.files.output_dir) and not os.path.isdir(cfg.files.output_dir):
        raise InputError(f"--output_dir {cfg.files.output_dir} is a file: name a folder for the shards")
    for _, output, _ in jobs:  # before the work, not at the final rename
        check_output_path(output, "--output_file" if cfg.files.output_file else "--output_dir")
    writing = writer.ShardWriting(
        compression=None if cfg.writing.compression == "none" else cfg.writing.compression,
        gzip_level=cfg.writing.gzip_level,
        threads=cfg.instances.num_workers,
    )
    start = time.time()
    summaries = []
    with writer.worker_pool(
        cfg.instances.num_workers, cfg.files.vocab_file, cfg.files.do_lower_case, cfg.writing.mp_start_method
    ) as pool:
        for k, (inputs, output, job_cfg) in enumerate(jobs):
            summaries.append(
                writer.process_corpus(
                    inputs,
                    output,
                    job_cfg,
                    pool,
                    not cfg.writing.no_progress,
                    f"[{k + 1}/{len(jobs)}] {output.name}",
                    is_subword,
                    writing,
                )
            )
    total = {
        "instances": sum(s["instances"] for s in summaries),
        "tokens": sum(s["tokens"] for s in summaries),
        "documents": sum(s["documents"] for s in summaries),
        "outputs": len(summaries),
        "num_workers": cfg.instances.num_workers,
        "seconds": round(time.time() - start, 3),
    }
    if cfg.instances.pack_sequences:
        total["packed_rows"] = sum(s["packed_rows"] for s in summaries)
    if len(summaries) == 1:
        total.update({k: summaries[0][k] for k in ("output", "tokenize_s", "instances_s", "write_s")})
    print(json.dumps(total), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
