"""Sentence splitters side by side: blingfire vs pysbd on WikiText-2 (speed, agreement, differences).

Neither needs a model download at run time (nltk's punkt does, and its models are not on PyPI). WikiText-2 is
pre-tokenized (`1 @,@ 000`, `red @-@ tipped`, ` , `, `<unk>`): both splitters are run on the text as shipped ("raw")
and on a detokenized copy ("detok", closer to the prose our formatter writes). There is no gold segmentation of
WikiText-2, so quality is read three ways: agreement between the two (boundary F1 and identical paragraphs), a
sample of the paragraphs where they differ (in the JSON, to read), and a small set of hard cases with gold splits
written out below by hand.

    .venv/bin/python -m bench.bench_sentence_split --output results/bench_sentence_split.json   # from the repo root
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import time
from pathlib import Path

from bert_recipe.io.atomic_io import atomic_write_json

# Hard cases with their gold segmentation (abbreviations, initials, decimals, quotes, ellipses, lists, URLs).
GOLD = [
    ["Dr. Smith went to Washington on Jan. 5, 1990.", "He stayed a week."],
    ["The U.S. Army arrived at 5 p.m. on Monday.", "Nobody was there."],
    ["J. R. R. Tolkien wrote The Hobbit.", "It was published in 1937."],
    ["The price rose to $3.50 per unit.", "Sales fell by 2.5 percent."],
    ['"Why?" she asked.', "He did not answer."],
    ['He said, "I\'ll be back."', "Then he left."],
    ["Wait...", "Is that it?"],
    ["See Fig. 3 for details.", "The results are in Table 2."],
    ["Mr. and Mrs. Jones live at No. 10 Main St. in town.", "They moved in 2001."],
    ["It was built c. 1850 by St. John's church.", "It burned in 1901."],
    ["Visit www.example.com for more.", "Registration is free."],
    ["The ship (HMS Victory) sailed at 6 a.m.", "It reached port by noon."],
    ["Species such as H. americanus are larger.", "They live in the Atlantic."],
    ["The vote was 52 vs. 48 in favour.", "The motion passed."],
    ["He was born in 1899 in Vienna, Austria.", "His father, a doctor, died in 1905."],
    ["Prof. Alan Turing (1912–1954) was a mathematician.", "He worked at Bletchley Park."],
    ["The album sold 1.2 million copies!", "It topped the charts in the U.K."],
    ["They asked: what now?", "Nobody knew."],
    ["The team won 3–1.", "The coach praised them."],
    ["It measures approx. 30 cm in length.", "Its mass is about 2 kg."],
]


def wikitext_paragraphs(path: Path) -> list[str]:
    return [
        line.strip()
        for line in path.read_text(encoding="utf-8").split("\n")
        if line.strip() and not re.fullmatch(r" =+ .* =+ ", line)
    ]


def detokenize(text: str) -> str:
    """Undo WikiText's tokenization (an approximation, enough to look like ordinary prose). `<unk>` becomes a
    capitalised word: lower-case-looking `<unk>` at a sentence start is an artefact real Wikipedia text lacks."""
    text = text.replace("<unk>", "Unk")
    text = re.sub(r" @([-,.])@ ", r"\1", text)
    text = re.sub(r" ([,.;:!?%)\]}])", r"\1", text)
    text = re.sub(r"([(\[{$]) ", r"\1", text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    text = re.sub(r'" (.*?) "', r'"\1"', text)
    return text


def segmenters() -> dict:
    import blingfire
    import pysbd

    seg = pysbd.Segmenter(language="en", clean=False)
    return {
        "blingfire": lambda text: [s for s in blingfire.text_to_sentences(text).split("\n") if s.strip()],
        "pysbd": lambda text: [s for s in seg.segment(text) if s.strip()],
    }


def boundaries(sentences: list[str]) -> set[int]:
    """Sentence ends as offsets into the text with all whitespace removed (comparable across splitters)."""
    ends, pos = set(), 0
    for s in sentences[:-1]:
        pos += len("".join(s.split()))
        ends.add(pos)
    return ends


def time_split(split, paragraphs: list[str], repeats: int) -> tuple[float, list[list[str]]]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = [split(p) for p in paragraphs]
        best = min(best, time.perf_counter() - start)
    return best, out


def compare(a: list[list[str]], b: list[list[str]]) -> dict:
    both = only_a = only_b = same = 0
    for x, y in zip(a, b):
        bx, by = boundaries(x), boundaries(y)
        both, only_a, only_b = both + len(bx & by), only_a + len(bx - by), only_b + len(by - bx)
        same += bx == by
    f1 = 2 * both / max(1, 2 * both + only_a + only_b)
    return {
        "boundary_f1": round(f1, 4),
        "shared_boundaries": both,
        "only_blingfire": only_a,
        "only_pysbd": only_b,
        "identical_paragraphs": round(same / len(a), 4),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wikitext", default="../shared/data/wikitext-2/valid.txt")
    p.add_argument("--repeats", type=int, default=3, help="timing runs per splitter (best is kept)")
    p.add_argument("--samples", type=int, default=12, help="differing paragraphs to keep in the JSON")
    p.add_argument("--output", default="results/bench_sentence_split.json")
    args = p.parse_args(argv)
    path = Path(args.wikitext)
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist (--wikitext: WikiText-2's valid.txt)")
    splitters = segmenters()
    raw = wikitext_paragraphs(path)
    corpora = {"raw": raw, "detok": [detokenize(x) for x in raw]}
    result = {
        "machine": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "paragraphs": len(raw),
        "corpora": {},
    }
    for corpus_name, paragraphs in corpora.items():
        chars = sum(map(len, paragraphs))
        row, splits = {"chars": chars}, {}
        for name, split in splits_in_order(splitters):
            seconds, splits[name] = time_split(split, paragraphs, args.repeats)
            n = sum(map(len, splits[name]))
            row[name] = {
                "seconds": round(seconds, 4),
                "sentences": n,
                "sentences_per_s": round(n / seconds),
                "mb_per_s": round(chars / seconds / 1e6, 3),
            }
        row["speedup_blingfire_over_pysbd"] = round(row["pysbd"]["seconds"] / row["blingfire"]["seconds"], 1)
        row["agreement"] = compare(splits["blingfire"], splits["pysbd"])
        row["differences"] = [
            {"paragraph": para, "blingfire": a, "pysbd": b}
            for para, a, b in zip(paragraphs, splits["blingfire"], splits["pysbd"])
            if boundaries(a) != boundaries(b) and len(para) < 600
        ][: args.samples]
        result["corpora"][corpus_name] = row
    result["gold_hard_cases"] = {}
    for name, split in splits_in_order(splitters):
        correct = [boundaries(split(" ".join(case))) == boundaries(case) for case in GOLD]
        result["gold_hard_cases"][name] = {
            "correct": sum(correct),
            "of": len(GOLD),
            "wrong": [" ".join(c) for c, ok in zip(GOLD, correct) if not ok],
        }
    atomic_write_json(args.output, result)
    print_table(result)
    print(f"\nJSON (with sample differences): {args.output}")
    return 0


def splits_in_order(splitters: dict):
    return [(name, splitters[name]) for name in ("blingfire", "pysbd")]


def print_table(result: dict) -> None:
    print(f"WikiText-2 valid, {result['paragraphs']} paragraphs\n")
    print(
        "| text | splitter | sentences | seconds | sentences/s | MB/s | speed-up | boundary F1 | identical paragraphs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for corpus_name, row in result["corpora"].items():
        for name in ("blingfire", "pysbd"):
            r = row[name]
            speedup = f"{row['speedup_blingfire_over_pysbd']}x" if name == "blingfire" else "1x"
            print(
                f"| {corpus_name} | {name} | {r['sentences']} | {r['seconds']} | {r['sentences_per_s']:,} | "
                f"{r['mb_per_s']} | {speedup} | {row['agreement']['boundary_f1']} | "
                f"{row['agreement']['identical_paragraphs']:.1%} |"
            )
    print("\nHand-labelled hard cases (exact segmentation):")
    for name, r in result["gold_hard_cases"].items():
        print(f"  {name}: {r['correct']}/{r['of']}; wrong: {r['wrong']}")


if __name__ == "__main__":
    sys.exit(main())
