"""A learned vocabulary against bert-base-uncased's, on held-out Wikipedia, and the time to learn one.

The Wikipedia slice (../shared/data/wikipedia-en-slice: 200 WikiExtractor files, 32.5 M words) is split by file:
the last `--held_out` files (sorted order: AB/wiki_90 .. AB/wiki_99 by default) are never seen by the learner, the
others are its training text. For each size, data/create_vocab.py learns an uncased vocabulary from the training
files (Google's layout, every character of the text kept); then the held-out text is split into words exactly as
our BasicTokenizer splits it (punctuation marks are words of their own) and each word is WordPiece-tokenized with
the learned vocabulary and with bert-base-uncased's (tokenization.WordpieceTokenizer: greedy longest match first,
[UNK] for a word with an unmatchable piece or over 100 characters). Reported per vocabulary:
  * unk_rate: the fraction of held-out words that become [UNK];
  * pieces_per_word: WordPiece tokens per word (1.0 = every word is one entry);
  * split_rate: the fraction of words cut into more than one piece.
Then the whole slice (all 200 files) is learned from once, timed (wall and CPU seconds), at --full_size.

    .venv/bin/python -m bench.bench_vocab        # from the repo root; about 5 CPU minutes in all
    .venv/bin/python -m bench.bench_vocab --sizes 8000 --no_full --out /tmp/v.json   # a quick look

Writes JSON (--out, default bench/results/data/bench_vocab.json) and prints a Markdown table (--print JSON prints
it again from the JSON). Learning times are CPU seconds of the whole process (every thread) and wall seconds: on a
machine shared with other jobs the wall time says more about them than about the learner.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import tokenizers

from bench.study_utils import DATA, REPO, cpu_description
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.prep.vocab import PreSplitter, VocabSettings, iter_chunks, learn_vocab, list_input_files, write_vocab
from tokenization import WordpieceTokenizer, load_vocab


def machine() -> dict:
    """CPU model, core count and the bf16 flags precision_policy.py reads, for the record."""
    model, flags = cpu_description()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
    }


def held_out_words(files: list[Path], lower: bool) -> collections.Counter:
    """BasicTokenizer's words of the files (create_vocab's pre-splitting, proven equal to it), counted."""
    splitter, counts = PreSplitter(lower), collections.Counter()
    for chunk in iter_chunks(files):
        counts.update(splitter.words(chunk))
    return counts


def evaluate(vocab_file: Path, words: collections.Counter) -> dict:
    """[UNK] rate, pieces per word and split rate of `words` (word -> count) under the vocabulary."""
    vocab = load_vocab(vocab_file)
    wordpiece = WordpieceTokenizer(vocab)
    total = unk = pieces = split = 0
    for word, n in words.items():
        tokens = wordpiece.tokenize(word)
        total += n
        pieces += n * len(tokens)
        unk += n * (tokens == ["[UNK]"])
        split += n * (len(tokens) > 1)
    return {
        "words": total,
        "unk_rate": unk / total,
        "pieces_per_word": pieces / total,
        "split_rate": split / total,
        "characters": sum(len(token) == 1 for token in vocab),
    }


def learn(files: list[Path], size: int, out: Path, limit_alphabet: int | None = None) -> dict:
    start_wall, start_cpu = time.time(), time.process_time()  # process time: every thread's, the trainer's too
    result = learn_vocab(files, VocabSettings(size, do_lower_case=True, limit_alphabet=limit_alphabet))
    wall, cpu = time.time() - start_wall, time.process_time() - start_cpu
    write_vocab(out, result.tokens)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **result.summary()}


def markdown(report: dict) -> str:
    lines = [
        "| vocabulary | entries | single characters | [UNK] per word | pieces per word | words split "
        f"| to learn ({report['train_files']} files): CPU s (wall s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        learned = row.get("learn")
        took = f"{learned['cpu_s']:.0f} ({learned['wall_s']:.0f})" if learned else "(Google's)"
        lines.append(
            f"| {row['name']} | {row['entries']:,} | {row['characters']:,} | {100 * row['unk_rate']:.3f}% "
            f"| {row['pieces_per_word']:.3f} | {100 * row['split_rate']:.1f}% | {took} |"
        )
    text = "\n".join(lines)
    full = report.get("full_slice")
    if full:
        text += (
            f"\n\nLearning from the whole slice ({full['files']} files, {full['words'] / 1e6:.1f} M words as "
            f"BasicTokenizer splits them), {full['vocab_size']:,} entries: {full['wall_s']:.0f} s wall, "
            f"{full['cpu_s']:.0f} s CPU ({full['seconds']['alphabet']:.0f} s reading the alphabet, "
            f"{full['seconds']['learn']:.0f} s pre-splitting and learning)."
        )
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", type=Path, default=DATA / "wikipedia-en-slice" / "text", help="the slice's WikiExtractor folder"
    )
    p.add_argument("--reference", type=Path, default=DATA / "bert-vocab" / "bert-base-uncased-vocab.txt")
    p.add_argument("--held_out", type=int, default=10, help="files held out (the last ones in sorted order)")
    p.add_argument("--sizes", default="8000,16000,30522", help="vocabulary sizes to learn, comma-separated")
    p.add_argument(
        "--limited",
        default="8000:1000",
        help="SIZE:N rows learned with --limit_alphabet N too (comma-separated; '' for none)",
    )
    p.add_argument("--full_size", type=int, default=30522, help="the size learned from the whole slice, timed")
    p.add_argument("--no_full", action="store_true", help="skip the whole-slice timing")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "data" / "bench_vocab.json")
    p.add_argument(
        "--print",
        dest="print_only",
        type=Path,
        metavar="JSON",
        help="only print the Markdown table of an earlier run's JSON",
    )
    args = p.parse_args(argv)
    if args.print_only:
        print(markdown(json.loads(args.print_only.read_text())))
        return 0
    files = list_input_files([args.data])
    if len(files) <= args.held_out:
        raise SystemExit(f"error: {args.data} has {len(files)} files: fewer than --held_out {args.held_out} + 1")
    train, test = files[: -args.held_out], files[-args.held_out :]
    report = {
        "command": " ".join([Path(sys.executable).name, "-m", "bench.bench_vocab", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_before": os.getloadavg(),
        "train_files": len(train),
        "held_out_files": [str(f.relative_to(args.data)) for f in test],
        "rows": [],
    }
    start = time.time()
    words = held_out_words(test, lower=True)
    report["held_out_words"] = sum(words.values())
    report["held_out_distinct_words"] = len(words)
    print(f"held out: {len(test)} files, {sum(words.values()):,} words ({len(words):,} distinct)", flush=True)
    report["rows"].append({"name": "bert-base-uncased (Google)", "entries": 30522, **evaluate(args.reference, words)})
    jobs = [(int(size), None) for size in args.sizes.split(",") if size]
    jobs += [tuple(int(x) for x in item.split(":")) for item in args.limited.split(",") if item]
    with tempfile.TemporaryDirectory() as tmp:
        for size, limit in jobs:
            vocab_file = Path(tmp) / f"vocab_{size}_{limit}.txt"
            learned = learn(train, size, vocab_file, limit)
            name = f"ours, {size:,}" + (f", {limit:,} characters (--limit_alphabet)" if limit else "")
            report["rows"].append({"name": name, "entries": size, **evaluate(vocab_file, words), "learn": learned})
            print(f"{name}: learned in {learned['wall_s']} s", flush=True)
        if not args.no_full:
            report["full_slice"] = learn(files, args.full_size, Path(tmp) / "full.txt")
            print(f"whole slice: {report['full_slice']['wall_s']} s", flush=True)
    report["load_average_after"] = os.getloadavg()
    report["wall_s"] = round(time.time() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
