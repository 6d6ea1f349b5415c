"""The straightforward single-process implementation of Google's pre-training data algorithm: the benchmark's peer.

Written for bench/bench_create_pretraining_data.py only; run it from the repository root as a module (it imports
the repository's tokenization.py). It does what the original scripts do, step by step:
read every line, tokenize it alone into WordPiece strings, keep every document of the corpus as lists of token
strings, build each instance as Python lists with one `random.Random`, mask with string tokens, convert to ids,
pad, and write NVIDIA's HDF5 layout (gzip) at the end. Same algorithm and same output layout as
create_pretraining_data.py (not the same random draws), so instances/second and memory compare the pipelines.

    python -m bench.baseline_create_pretraining_data --input_file corpus.txt --output_file out.hdf5 \\
        --vocab_file vocab.txt --dupe_factor 5 [--python_tokenizer]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np

from tokenization import BertTokenizer


def read_documents(paths: list[str], tokenizer) -> list[list[list[str]]]:
    """Every document as a list of tokenized sentences; a blank line ends a document."""
    documents: list[list[list[str]]] = [[]]
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    documents.append([])
                    continue
                tokens = tokenizer.tokenize(line)
                if tokens:
                    documents[-1].append(tokens)
        documents.append([])
    return [d for d in documents if d]


def trim_pair(a: list[str], b: list[str], max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def mask_tokens(
    tokens: list[str],
    masked_lm_prob: float,
    max_predictions: int,
    vocab_words: list[str],
    rng: random.Random,
    whole_word: bool,
):
    groups: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token in ("[CLS]", "[SEP]"):
            continue
        if whole_word and groups and token.startswith("##"):
            groups[-1].append(i)
        else:
            groups.append([i])
    rng.shuffle(groups)
    count = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))))
    output = list(tokens)
    picked: list[tuple[int, str]] = []
    for group in groups:
        if len(picked) >= count:
            break
        if len(picked) + len(group) > count:
            continue
        for i in group:
            r = rng.random()
            if r < 0.8:
                output[i] = "[MASK]"
            elif rng.random() < 0.5:
                output[i] = tokens[i]
            else:
                output[i] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            picked.append((i, tokens[i]))
    picked.sort()
    return output, [i for i, _ in picked], [t for _, t in picked]


def document_instances(documents, index: int, args, vocab_words: list[str], rng: random.Random) -> list[tuple]:
    document = documents[index]
    max_tokens = args.max_seq_length - 3
    target = max_tokens
    if rng.random() < args.short_seq_prob:
        target = rng.randint(2, max_tokens)
    out, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for sentence in chunk[:a_end] for t in sentence]
            b: list[str] = []
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random = True
                for _ in range(10):
                    other = rng.randint(0, len(documents) - 1)
                    if other != index:
                        break
                other_doc = documents[other]
                for sentence in other_doc[rng.randint(0, len(other_doc) - 1) :]:
                    b.extend(sentence)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end
            else:
                is_random = False
                b = [t for sentence in chunk[a_end:] for t in sentence]
            trim_pair(a, b, max_tokens, rng)
            tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
            segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
            tokens, positions, labels = mask_tokens(
                tokens, args.masked_lm_prob, args.max_predictions_per_seq, vocab_words, rng, args.do_whole_word_mask
            )
            out.append((tokens, segments, positions, labels, is_random))
            chunk, length = [], 0
        i += 1
    return out


def write(path: str, instances: list[tuple], tokenizer, args) -> None:
    import h5py

    n, s, p = len(instances), args.max_seq_length, args.max_predictions_per_seq
    arrays = {
        "input_ids": np.zeros((n, s), np.int32),
        "input_mask": np.zeros((n, s), np.int8),
        "segment_ids": np.zeros((n, s), np.int8),
        "masked_lm_positions": np.zeros((n, p), np.int32),
        "masked_lm_ids": np.zeros((n, p), np.int32),
        "next_sentence_labels": np.zeros(n, np.int8),
    }
    for k, (tokens, segments, positions, labels, is_random) in enumerate(instances):
        ids = tokenizer.convert_tokens_to_ids(tokens)
        arrays["input_ids"][k, : len(ids)] = ids
        arrays["input_mask"][k, : len(ids)] = 1
        arrays["segment_ids"][k, : len(segments)] = segments
        arrays["masked_lm_positions"][k, : len(positions)] = positions
        arrays["masked_lm_ids"][k, : len(labels)] = tokenizer.convert_tokens_to_ids(labels)
        arrays["next_sentence_labels"][k] = int(is_random)
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        for name, value in arrays.items():
            f.create_dataset(name, data=value, compression="gzip")
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_file", required=True, help="a file or a comma-separated list")
    p.add_argument("--output_file", required=True)
    p.add_argument("--vocab_file", required=True)
    p.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--masked_lm_prob", type=float, default=0.15)
    p.add_argument("--short_seq_prob", type=float, default=0.1)
    p.add_argument("--dupe_factor", type=int, default=10)
    p.add_argument("--random_seed", type=int, default=12345)
    p.add_argument("--do_whole_word_mask", action="store_true")
    p.add_argument("--python_tokenizer", action="store_true", help="the pure-Python WordPiece (the original's cost)")
    args = p.parse_args(argv)
    start = time.time()
    tokenizer = BertTokenizer(args.vocab_file, do_lower_case=args.do_lower_case, use_fast=not args.python_tokenizer)
    rng = random.Random(args.random_seed)
    documents = read_documents(args.input_file.split(","), tokenizer)
    rng.shuffle(documents)
    vocab_words = list(tokenizer.vocab.keys())
    instances = []
    for _ in range(args.dupe_factor):
        for index in range(len(documents)):
            instances.extend(document_instances(documents, index, args, vocab_words, rng))
    rng.shuffle(instances)
    write(args.output_file, instances, tokenizer, args)
    print(
        json.dumps(
            {
                "instances": len(instances),
                "documents": len(documents),
                "tokens": sum(len(s) for d in documents for s in d),
                "seconds": round(time.time() - start, 3),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
