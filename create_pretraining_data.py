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
from pathlib import Path
from typing import Sequence

import numpy as np

from bert_recipe.io.cli import InputError, add_debug_argument, check_output_path, describe_error, script_errors
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="create_pretraining_data.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--input_file",
        required=True,
        help="a text file, a folder of .txt files, or a comma-separated list (one sentence per line, "
        "blank line between documents)",
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--output_file", help="one HDF5 file from all inputs together")
    out.add_argument("--output_dir", help="one <stem>.hdf5 per input file, shard i with seed random_seed + i")
    p.add_argument("--vocab_file", required=True, help="BERT vocab.txt")
    p.add_argument(
        "--do_lower_case",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lower-case and strip accents (uncased vocabularies; the default, as in Google's and "
        "NVIDIA's scripts); --no-do_lower_case / --no_do_lower_case for cased ones",
    )
    p.add_argument("--no_do_lower_case", dest="do_lower_case", action="store_false", help=argparse.SUPPRESS)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--masked_lm_prob", type=float, default=0.15)
    p.add_argument("--short_seq_prob", type=float, default=0.1)
    p.add_argument("--dupe_factor", type=int, default=10, help="passes over the data, each with new masks/pairs")
    p.add_argument(
        "--random_seed",
        type=int,
        default=12345,
        help="master seed: the same seed gives identical arrays for any --num_workers",
    )
    p.add_argument(
        "--num_workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="worker processes (default: the CPUs available); 1 runs in this process",
    )
    p.add_argument("--do_whole_word_mask", action="store_true", help="mask whole words (all their ## pieces)")
    p.add_argument(
        "--no_static_masking",
        action="store_true",
        help="write unmasked input_ids and all-zero masked_lm_positions/ids (attribute masking="
        "'dynamic') for a loader that masks per epoch with dynamic_mask()",
    )
    p.add_argument(
        "--pack_sequences",
        type=int,
        default=0,
        metavar="K",
        help="sequence packing: put up to K (>= 2) instances into each row of max_seq_length, first-fit-"
        "decreasing over windows of 8,192 shuffled instances; adds next_sentence_positions [N,K] "
        "int32, makes next_sentence_labels [N,K] int8 (-1: unused slot) and masked_lm_* [N,P_row] "
        "(P_row = min(K*P, floor(S*masked_lm_prob) + K)); run_pretraining.py detects packed shards "
        "(default 0: one instance a row)",
    )
    p.add_argument("--compression", choices=("gzip", "none"), default="gzip", help="HDF5 compression (NVIDIA: gzip)")
    p.add_argument(
        "--gzip_level",
        type=int,
        default=1,
        choices=range(1, 10),
        metavar="{1..9}",
        help="zlib level (default 1: with the shuffle filter, smaller than NVIDIA's level-4 files and "
        "twice as fast to write)",
    )
    p.add_argument(
        "--mp_start_method",
        choices=("auto", "spawn", "forkserver", "fork"),
        default="auto",
        help="how worker processes start; auto: fork on Linux when this process runs no other thread "
        "(cheap), else spawn (safe everywhere)",
    )
    p.add_argument("--no_progress", action="store_true", help="no tqdm progress bars")
    add_debug_argument(p)
    return p


def _check_args(args) -> None:
    s, p = args.max_seq_length, args.max_predictions_per_seq
    problems = [
        (s < 5, f"--max_seq_length {s} must be at least 5 ([CLS] A [SEP] B [SEP])"),
        (p < 1 or p > s, f"--max_predictions_per_seq {p} must be in [1, max_seq_length={s}]"),
        (not 0.0 < args.masked_lm_prob <= 1.0, f"--masked_lm_prob {args.masked_lm_prob} must be in (0, 1]"),
        (not 0.0 <= args.short_seq_prob <= 1.0, f"--short_seq_prob {args.short_seq_prob} must be in [0, 1]"),
        (args.dupe_factor < 1, f"--dupe_factor {args.dupe_factor} must be at least 1"),
        (args.random_seed < 0, f"--random_seed {args.random_seed} must be a non-negative integer"),
        (args.num_workers < 1, f"--num_workers {args.num_workers} must be at least 1"),
        (
            args.pack_sequences == 1 or args.pack_sequences < 0,
            f"--pack_sequences {args.pack_sequences} must be 0 (no packing) or at least 2 (sequences a row)",
        ),
        (os.path.isdir(args.vocab_file), f"--vocab_file {args.vocab_file} is a folder: name the vocab.txt in it"),
        (not os.path.exists(args.vocab_file), f"--vocab_file {args.vocab_file} does not exist: give a BERT vocab.txt"),
    ]
    for bad, message in problems:
        if bad:
            raise InputError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """0 when every output was written; a one-line error (exit 1) for bad input or a full disk (--debug: the
    traceback)."""
    with script_errors("create_pretraining_data.py", argv):
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    files = resolve_inputs(args.input_file)

    try:
        vocab = load_vocab(args.vocab_file)
    except (ValueError, OSError) as e:
        raise InputError(f"--vocab_file {args.vocab_file}: {describe_error(e)}") from e
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise InputError(f"--vocab_file {args.vocab_file} lacks {missing}: is it a BERT vocab.txt?")
    vocab_size = max(vocab.values()) + 1  # ids are line numbers of the vocabulary file
    cfg = writer.InstanceConfig(
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor,
        random_seed=args.random_seed,
        do_whole_word_mask=args.do_whole_word_mask,
        static_masking=not args.no_static_masking,
        pack_sequences=args.pack_sequences,
        vocab_size=vocab_size,
        cls_id=vocab["[CLS]"],
        sep_id=vocab["[SEP]"],
        mask_id=vocab["[MASK]"],
    )
    is_subword = None  # "##" pieces by id, for whole-word masking
    if args.do_whole_word_mask:
        is_subword = np.zeros(vocab_size, dtype=bool)
        is_subword[[i for t, i in vocab.items() if t.startswith("##")]] = True
    if args.output_file:
        jobs = [(files, Path(args.output_file), cfg)]
    else:
        jobs = [
            (
                [f],
                Path(args.output_dir) / f"{Path(f).stem}.hdf5",
                dataclasses.replace(cfg, random_seed=cfg.random_seed + i),
            )
            for i, f in enumerate(files)
        ]
    if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise InputError(f"--output_dir {args.output_dir} is a file: name a folder for the shards")
    for _, output, _ in jobs:  # before the work, not at the final rename
        check_output_path(output, "--output_file" if args.output_file else "--output_dir")
    writing = writer.ShardWriting(
        compression=None if args.compression == "none" else args.compression,
        gzip_level=args.gzip_level,
        threads=args.num_workers,
    )
    start = time.time()
    summaries = []
    with writer.worker_pool(args.num_workers, args.vocab_file, args.do_lower_case, args.mp_start_method) as pool:
        for k, (inputs, output, job_cfg) in enumerate(jobs):
            summaries.append(
                writer.process_corpus(
                    inputs,
                    output,
                    job_cfg,
                    pool,
                    not args.no_progress,
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
        "num_workers": args.num_workers,
        "seconds": round(time.time() - start, 3),
    }
    if args.pack_sequences:
        total["packed_rows"] = sum(s["packed_rows"] for s in summaries)
    if len(summaries) == 1:
        total.update({k: summaries[0][k] for k in ("output", "tokenize_s", "instances_s", "write_s")})
    print(json.dumps(total), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
