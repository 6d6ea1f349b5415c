"""SQuAD v1.1 / v2.0 for BERT: reading examples, sliding-window features, a feature cache, turning logits back into
answer text, and the official evaluation re-implemented.

Read top to bottom:
  1. reading   `read_squad_examples` (the official nested format, or Hugging Face's flat one) and
               `examples_from_qa_pairs` (free question/context pairs for inference) -> SquadExample
  2. features  `convert_examples_to_features`: WordPiece each document once, truncate the question, cut the document
               into windows of `max_seq_length` tokens that start `doc_stride` tokens apart, and record for every
               document token in every window the original word it came from and whether this window is the one
               that gives it the most context -> InputFeatures
  3. cache     `load_or_build_features`: features on disk (numpy .npz, no pickle) keyed by the input file, the
               vocabulary and every length that changes them
  4. answers   `get_predictions`: the best start/end pairs per example over all its windows, projected back onto the
               original characters, with probabilities; for v2.0 the null answer against the best span
  5. metrics   `evaluate_v1` / `evaluate_v2`: the algorithms of the official evaluate-v1.1.py and evaluate-v2.0.py;
               `score_predictions` scores with the one of the data's version

Notation: F features (windows), S max_seq_length, T WordPiece tokens of one document, W windows of one document.

A feature's token layout is `[CLS] question [SEP] document-window [SEP] [PAD]...`, segment 0 up to the first [SEP]
and 1 after it. The triton/ client imports `examples_from_qa_pairs`, `convert_examples_to_features`,
`get_predictions` and `QASettings` (the window and answer settings that inference.py takes too) from here, so their
names and signatures are part of the project's interface.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from bert_recipe.io.atomic_io import atomic_open
from bert_recipe.training.flags import field_docs
from tokenization import BasicTokenizer

logger = logging.getLogger(__name__)

# Google's BERT numbers the features from here; kept so unique ids look like the original's.
FIRST_UNIQUE_ID = 1_000_000_000
# Bump whenever the feature layout or the cache file layout changes: old cache files are then ignored.
FEATURE_FORMAT_VERSION = 1


class SquadFormatError(ValueError):
    """A SQuAD file that cannot be read: the message names the file and what is wrong."""


# ----------------------------------------------------------------------------------------------------------------
# 1. Reading


@dataclass
class SquadExample:
    """One question about one context.

    `doc_tokens` is the context split on whitespace (the "words" that answers are projected back onto);
    `start_position`/`end_position` index doc_tokens (inclusive) for training examples, -1 otherwise or when the
    question is impossible. `gold_answers` holds every annotated answer text, for evaluation.
    """

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str = ""
    start_position: int = -1
    end_position: int = -1
    is_impossible: bool = False
    gold_answers: list[str] = field(default_factory=list)


def _is_whitespace(c: str) -> bool:
    # U+202F (narrow no-break space) separates words in some SQuAD contexts; Python's split() would agree, but
    # the character offsets below need the exact rule the original used.
    return c in (" ", "\t", "\r", "\n") or ord(c) == 0x202F


def split_context(context: str) -> tuple[list[str], list[int]]:
    """Split a context on whitespace. Returns (words, char_to_word) where char_to_word[i] is the index of the word
    holding character i (a whitespace character maps to the word before it, -1 before the first word)."""
    words: list[str] = []
    char_to_word: list[int] = []
    previous_is_space = True
    for c in context:
        if _is_whitespace(c):
            previous_is_space = True
        elif previous_is_space:
            words.append(c)
            previous_is_space = False
        else:
            words[-1] += c
        char_to_word.append(len(words) - 1)
    return words, char_to_word


def _load_json(path_or_json: str | os.PathLike | Mapping) -> tuple[dict, str]:
    """The parsed SQuAD JSON and a name for messages."""
    if isinstance(path_or_json, Mapping):
        return dict(path_or_json), "<json>"
    path = Path(path_or_json)
    if not path.is_file():
        raise SquadFormatError(f"SQuAD file {path} not found")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), str(path)
    except json.JSONDecodeError as e:
        raise SquadFormatError(f"SQuAD file {path} is not valid JSON ({e}); expected {{'data': [...]}}") from None
    except UnicodeDecodeError as e:
        raise SquadFormatError(f"SQuAD file {path} is not UTF-8 text (byte {e.start}): convert it to UTF-8") from None


def squad_articles(path_or_json: str | os.PathLike | Mapping) -> list[dict]:
    """The `data` list in the official nested layout (articles -> paragraphs -> qas), whichever of the two layouts
    the file uses. Hugging Face's flat layout ({"data": [{id, question, context, answers: {text, answer_start}}]})
    is regrouped: consecutive rows with the same context become one paragraph."""
    obj, name = _load_json(path_or_json)
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        raise SquadFormatError(f"{name}: no 'data' list at the top level; is this a SQuAD file?")
    if not data or "paragraphs" in data[0]:
        for i, article in enumerate(data):
            if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
                raise SquadFormatError(f"{name}: data[{i}] has no 'paragraphs' list; is this a SQuAD file?")
        return data
    paragraphs: list[dict] = []
    for i, row in enumerate(data):
        if not isinstance(row, dict) or not all(k in row for k in ("id", "question", "context")):
            raise SquadFormatError(
                f"{name}: data[{i}] has neither 'paragraphs' nor id/question/context keys; is this a SQuAD file?"
            )
        answers = row.get("answers") or {"text": [], "answer_start": []}
        qa = {
            "id": str(row["id"]),
            "question": row["question"],
            "is_impossible": not answers["text"],
            "answers": [{"text": t, "answer_start": s} for t, s in zip(answers["text"], answers["answer_start"])],
        }
        if not paragraphs or paragraphs[-1]["context"] != row["context"]:
            paragraphs.append({"context": row["context"], "qas": []})
        paragraphs[-1]["qas"].append(qa)
    return [{"title": "", "paragraphs": paragraphs}]


def read_squad_examples(
    path_or_json: str | os.PathLike | Mapping, is_training: bool, version_2_with_negative: bool
) -> list[SquadExample]:
    """Read a SQuAD file (a path, or the parsed JSON) into examples, in file order.

    Training examples get the word span of their first answer; an answer whose text is not found at its offset in
    the whitespace-split context is skipped with a warning (as the original does: a few SQuAD offsets are off).
    Examples of one paragraph share one `doc_tokens` list, so the document is WordPiece-tokenized once.
    """
    articles = squad_articles(path_or_json)
    name = str(path_or_json) if not isinstance(path_or_json, Mapping) else "<json>"
    examples: list[SquadExample] = []
    skipped = 0
    for article in articles:
        for paragraph in article["paragraphs"]:
            words, char_to_word = split_context(paragraph.get("context", ""))
            for qa in paragraph.get("qas", []):
                example = _make_example(qa, words, char_to_word, is_training, version_2_with_negative, name)
                if example is None:
                    skipped += 1
                else:
                    examples.append(example)
    if skipped:
        logger.warning("%s: skipped %d training question(s) whose answer text is not at its offset", name, skipped)
    return examples


def _make_example(
    qa: dict, words: list[str], char_to_word: list[int], is_training: bool, version_2: bool, name: str
) -> SquadExample | None:
    try:
        qas_id, question = str(qa["id"]), qa["question"]
    except KeyError as e:
        raise SquadFormatError(f"{name}: a question lacks the key {e}") from None
    answers = qa.get("answers") or []
    gold = [a["text"] for a in answers]
    is_impossible = bool(qa.get("is_impossible", False)) if version_2 else False
    example = SquadExample(qas_id, question, words, is_impossible=is_impossible, gold_answers=gold)
    if not is_training or is_impossible:
        return example
    if not answers:
        raise SquadFormatError(
            f"{name}: training question {qas_id} has no answer; for SQuAD 2.0 data pass --version_2_with_negative"
        )
    text, offset = answers[0]["text"], int(answers[0]["answer_start"])
    if not text or offset < 0 or offset + len(text) > len(char_to_word):
        return None
    start, end = char_to_word[offset], char_to_word[offset + len(text) - 1]
    # The annotated text must be what the offset points at (modulo whitespace), else the offset is wrong.
    actual = " ".join(words[max(start, 0) : end + 1])
    if " ".join(text.split()) not in actual:
        return None
    example.orig_answer_text, example.start_position, example.end_position = text, start, end
    return example


def examples_from_qa_pairs(items: Sequence[Mapping[str, Any]]) -> list[SquadExample]:
    """Examples for inference from [{"id"?: str, "question": str, "context": str}, ...]; a missing id becomes the
    item's index. Items with the same context text share one doc_tokens list (WordPiece'd once)."""
    examples: list[SquadExample] = []
    split_cache: dict[str, list[str]] = {}
    for i, item in enumerate(items):
        if (
            not isinstance(item, Mapping)
            or not isinstance(item.get("question"), str)
            or not isinstance(item.get("context"), str)
        ):
            raise ValueError(f"item {i} needs string 'question' and 'context' fields, got {item!r:.200}")
        context = item["context"]
        if context not in split_cache:
            split_cache[context] = split_context(context)[0]
        examples.append(SquadExample(str(item.get("id", i)), item["question"], split_cache[context]))
    return examples


def read_gold_answers(path_or_json: str | os.PathLike | Mapping) -> dict[str, list[str]]:
    """qas_id -> every annotated answer text (empty for an unanswerable question), in file order, for evaluation."""
    gold: dict[str, list[str]] = {}
    for article in squad_articles(path_or_json):
        for paragraph in article["paragraphs"]:
            for qa in paragraph.get("qas", []):
                gold[str(qa["id"])] = [a["text"] for a in qa.get("answers") or []]
    return gold


# ----------------------------------------------------------------------------------------------------------------
# 2. Features


@dataclass
class InputFeatures:
    """One window of one example, ready for the model.

    input_ids, input_mask, segment_ids: [S] lists (padded with 0). tokens: the unpadded tokens. token_to_orig_map:
    feature position -> index into the example's doc_tokens, for the document tokens of this window.
    token_is_max_context: feature position -> whether this window gives that token its most context (only such
    positions may start an answer). start_position/end_position: the answer's feature positions for training,
    (0, 0) ([CLS]) when the answer is not wholly inside this window or the question is impossible.
    """

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: list[str]
    token_to_orig_map: dict[int, int]
    token_is_max_context: dict[int, bool]
    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    start_position: int = 0
    end_position: int = 0
    is_impossible: bool = False


@dataclass
class _Document:
    """A context after WordPiece: tokens/ids [T], tok_to_orig [T] (word of each piece), orig_to_tok (first piece
    of each word, len(doc_tokens) entries)."""

    tokens: list[str]
    ids: list[int]
    tok_to_orig: list[int]
    orig_to_tok: list[int]


def _wordpiece_document(words: list[str], tokenizer) -> _Document:
    # One call for all the words of the document: the Rust fast path tokenizes the whole list at once. Each word is
    # tokenized on its own, as the original does, so pieces never straddle a whitespace boundary.
    pieces_per_word = tokenizer.tokenize_batch(words) if words else []
    tokens: list[str] = []
    tok_to_orig: list[int] = []
    orig_to_tok: list[int] = []
    for word_index, pieces in enumerate(pieces_per_word):
        orig_to_tok.append(len(tokens))
        tokens.extend(pieces)
        tok_to_orig.extend([word_index] * len(pieces))
    return _Document(tokens, tokenizer.convert_tokens_to_ids(tokens), tok_to_orig, orig_to_tok)


def _improve_answer_span(doc: _Document, start: int, end: int, answer_tokens: list[str]) -> tuple[int, int]:
    """The smallest sub-span of doc.tokens[start:end+1] equal to the answer's own WordPiece tokens, if any.

    Word-level spans are coarse: for the answer "1895" in the word "(1895-1943)." the word span covers
    "( 1895 - 1943 ) ." while the answer is one piece of it.
    """
    n = len(answer_tokens)
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if new_end - new_start + 1 == n and doc.tokens[new_start : new_end + 1] == answer_tokens:
                return new_start, new_end
    return start, end


def doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """Windows (start, length) over a document of num_tokens tokens: each at most max_tokens long, each starting
    min(length, doc_stride) after the previous one, the last one reaching the end. An empty document gets one
    empty window so that every example has a feature."""
    if max_tokens < 1 or doc_stride < 1:
        raise ValueError(f"max tokens per window ({max_tokens}) and doc_stride ({doc_stride}) must be >= 1")
    spans = []
    start = 0
    while True:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, doc_stride)


def max_context_windows(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For each document token, the index of the window that gives it the most context.

    A token at position p of window (start, length) has score min(p - start, start + length - 1 - p)
    + 0.01 * length: the context on its poorer side, ties broken towards longer windows, then towards the
    earlier window. Returns [T] window indices. Each window updates only its own tokens, so time and memory grow
    linearly with the document (a [windows, tokens] score matrix grew quadratically: ~1 GB for 200,000 characters).
    """
    best = np.zeros(num_tokens, dtype=np.int64)
    best_score = np.full(num_tokens, -np.inf)
    for index, (start, length) in enumerate(spans):
        offset = np.arange(length)
        score = np.minimum(offset, length - 1 - offset) + 0.01 * length
        better = score > best_score[start : start + length]  # strictly: the earlier window keeps a tie
        best_score[start : start + length][better] = score[better]
        best[start : start + length][better] = index
    return best


def convert_examples_to_features(
    examples: Sequence[SquadExample],
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> list[InputFeatures]:
    """Turn examples into windows (features), in example order, unique ids counting up from FIRST_UNIQUE_ID.

    `tokenizer` is a tokenization.BertTokenizer (tokenize_batch, convert_tokens_to_ids, vocab). Training features
    carry the answer's token positions in the window, or (0, 0) when it is not wholly inside. `progress` wraps the
    example loop (e.g. tqdm).
    """
    if max_seq_length < max_query_length + 4:
        raise ValueError(
            f"max_seq_length ({max_seq_length}) must exceed max_query_length ({max_query_length}) + 3 "
            "([CLS] and two [SEP]) by at least one document token"
        )
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    questions = tokenizer.tokenize_batch([e.question_text for e in examples])
    documents: dict[int, _Document] = {}  # id(doc_tokens) -> its WordPiece; examples keep the lists alive meanwhile
    features: list[InputFeatures] = []
    indexed = enumerate(examples)
    for example_index, example in progress(indexed) if progress else indexed:
        doc = documents.get(id(example.doc_tokens))
        if doc is None:
            doc = documents[id(example.doc_tokens)] = _wordpiece_document(example.doc_tokens, tokenizer)
        query = questions[example_index][:max_query_length]
        answer = _answer_token_span(example, doc, tokenizer) if is_training else None
        max_doc_tokens = max_seq_length - len(query) - 3
        spans = doc_spans(len(doc.tokens), max_doc_tokens, doc_stride)
        best_window = max_context_windows(spans, len(doc.tokens))
        frame = _Frame(
            ["[CLS]"] + query + ["[SEP]"],
            [cls_id] + tokenizer.convert_tokens_to_ids(query) + [sep_id],
            sep_id,
            max_seq_length,
        )
        for span_index, (start, length) in enumerate(spans):
            feature = _make_feature(doc, start, length, span_index, best_window, frame, answer)
            feature.unique_id = FIRST_UNIQUE_ID + len(features)
            feature.example_index = example_index
            feature.is_impossible = example.is_impossible
            features.append(feature)
    return features


def _answer_token_span(example: SquadExample, doc: _Document, tokenizer) -> tuple[int, int] | None:
    """The answer's (first, last) WordPiece token in the document, or None for an impossible question."""
    if example.is_impossible or example.start_position < 0:
        return None
    start = doc.orig_to_tok[example.start_position]
    last_word = example.end_position
    end = doc.orig_to_tok[last_word + 1] - 1 if last_word + 1 < len(doc.orig_to_tok) else len(doc.tokens) - 1
    answer_tokens = tokenizer.tokenize(" ".join(example.orig_answer_text.split()))
    return _improve_answer_span(doc, start, end, answer_tokens)


@dataclass(frozen=True)
class _Frame:
    """What surrounds each document window of one question: `[CLS] question [SEP]` before it (`tokens`, `ids`),
    [SEP] (`sep_id`) after it, then padding up to `max_seq_length`."""

    tokens: list[str]
    ids: list[int]
    sep_id: int
    max_seq_length: int


def _make_feature(
    doc: _Document,
    start: int,
    length: int,
    span_index: int,
    best_window: np.ndarray,
    frame: _Frame,
    answer: tuple[int, int] | None,
) -> InputFeatures:
    """One window: [CLS] query [SEP] doc[start:start+length] [SEP], padded to max_seq_length."""
    offset = len(frame.tokens)  # feature position of the window's first document token
    tokens = frame.tokens + doc.tokens[start : start + length] + ["[SEP]"]
    input_ids = frame.ids + doc.ids[start : start + length] + [frame.sep_id]
    segment_ids = [0] * offset + [1] * (length + 1)
    input_mask = [1] * len(input_ids)
    padding = [0] * (frame.max_seq_length - len(input_ids))
    window_best = best_window[start : start + length] == span_index
    token_to_orig_map = {offset + i: doc.tok_to_orig[start + i] for i in range(length)}
    token_is_max_context = {offset + i: bool(window_best[i]) for i in range(length)}
    start_position = end_position = 0
    if answer is not None and start <= answer[0] and answer[1] < start + length:
        start_position, end_position = answer[0] - start + offset, answer[1] - start + offset
    return InputFeatures(
        0,
        0,
        span_index,
        tokens,
        token_to_orig_map,
        token_is_max_context,
        input_ids + padding,
        input_mask + padding,
        segment_ids + padding,
        start_position,
        end_position,
    )


# ----------------------------------------------------------------------------------------------------------------
# 3. Feature cache: one .npz of integer arrays (np.load(..., allow_pickle=False)), written atomically.


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def feature_cache_path(
    cache_dir: str | os.PathLike,
    input_file: str | os.PathLike,
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    version_2_with_negative: bool,
) -> Path:
    """The cache file for these features: its name holds a hash of everything the features depend on."""
    key = json.dumps(
        {
            "format": FEATURE_FORMAT_VERSION,
            "input": file_sha256(input_file),
            "vocab": file_sha256(tokenizer.vocab_file),
            "do_lower_case": tokenizer.do_lower_case,
            "max_seq_length": max_seq_length,
            "doc_stride": doc_stride,
            "max_query_length": max_query_length,
            "is_training": is_training,
            "v2": version_2_with_negative,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(input_file).stem)
    return Path(cache_dir) / f"{stem}.{'train' if is_training else 'predict'}.{max_seq_length}.{digest}.npz"


def save_features(path: str | os.PathLike, features: Sequence[InputFeatures]) -> None:
    """Write features as flat integer arrays; the per-window maps are concatenated with offsets."""

    if not features:
        raise ValueError("no features to cache")
    doc_offset = [min(f.token_to_orig_map, default=len(f.tokens) - 1) for f in features]
    map_lengths = [len(f.token_to_orig_map) for f in features]
    arrays = {
        "format": np.array(FEATURE_FORMAT_VERSION),
        "unique_id": np.array([f.unique_id for f in features], dtype=np.int64),
        "example_index": np.array([f.example_index for f in features], dtype=np.int64),
        "doc_span_index": np.array([f.doc_span_index for f in features], dtype=np.int32),
        "num_tokens": np.array([len(f.tokens) for f in features], dtype=np.int32),
        "input_ids": np.array([f.input_ids for f in features], dtype=np.int32).reshape(len(features), -1),
        "segment_ids": np.array([f.segment_ids for f in features], dtype=np.int8).reshape(len(features), -1),
        "start_position": np.array([f.start_position for f in features], dtype=np.int32),
        "end_position": np.array([f.end_position for f in features], dtype=np.int32),
        "is_impossible": np.array([f.is_impossible for f in features], dtype=bool),
        "doc_offset": np.array(doc_offset, dtype=np.int32),
        "map_offsets": np.concatenate([[0], np.cumsum(map_lengths, dtype=np.int64)]).astype(np.int64),
        "orig_index": np.array([i for f in features for i in f.token_to_orig_map.values()], dtype=np.int32),
        "is_max_context": np.array([b for f in features for b in f.token_is_max_context.values()], dtype=bool),
    }
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)


def load_features(path: str | os.PathLike, tokenizer) -> list[InputFeatures]:
    """Read features written by save_features (no pickled objects are accepted)."""
    with np.load(path, allow_pickle=False) as z:
        if int(z["format"]) != FEATURE_FORMAT_VERSION:
            raise ValueError(f"{path}: feature format {int(z['format'])}, expected {FEATURE_FORMAT_VERSION}")
        a = {k: z[k] for k in z.files}
    features = []
    for i in range(len(a["unique_id"])):
        n = int(a["num_tokens"][i])
        ids = a["input_ids"][i].tolist()
        lo, hi = int(a["map_offsets"][i]), int(a["map_offsets"][i + 1])
        offset = int(a["doc_offset"][i])
        positions = range(offset, offset + hi - lo)
        features.append(
            InputFeatures(
                unique_id=int(a["unique_id"][i]),
                example_index=int(a["example_index"][i]),
                doc_span_index=int(a["doc_span_index"][i]),
                tokens=tokenizer.convert_ids_to_tokens(ids[:n]),
                token_to_orig_map=dict(zip(positions, a["orig_index"][lo:hi].tolist())),
                token_is_max_context=dict(zip(positions, a["is_max_context"][lo:hi].tolist())),
                input_ids=ids,
                input_mask=[1] * n + [0] * (len(ids) - n),
                segment_ids=a["segment_ids"][i].tolist(),
                start_position=int(a["start_position"][i]),
                end_position=int(a["end_position"][i]),
                is_impossible=bool(a["is_impossible"][i]),
            )
        )
    return features


def load_or_build_features(
    input_file: str | os.PathLike,
    examples: Sequence[SquadExample],
    tokenizer,
    settings: QASettings,
    is_training: bool,
    cache_dir: str | os.PathLike | None,
    write_cache: bool = True,
    progress=None,
) -> tuple[list[InputFeatures], str]:
    """Features from the cache when it has them, else built (and cached when `write_cache`) with the window
    settings of `settings`. `cache_dir` None means no cache at all. Returns (features, how: "cache <path>" /
    "built" / "built, cached in <path>")."""
    max_seq_length, doc_stride, max_query_length = (
        settings.max_seq_length,
        settings.doc_stride,
        settings.max_query_length,
    )
    path = None
    if cache_dir is not None:
        path = feature_cache_path(
            cache_dir,
            input_file,
            tokenizer,
            max_seq_length,
            doc_stride,
            max_query_length,
            is_training,
            settings.version_2_with_negative,
        )
        if path.is_file():
            try:
                features = load_features(path, tokenizer)
                if features and features[-1].example_index == len(examples) - 1:
                    return features, f"cache {path}"
                logger.warning("feature cache %s does not match the examples; rebuilding it", path)
            except (OSError, ValueError, KeyError) as e:  # a truncated or foreign file: rebuild rather than fail
                logger.warning("feature cache %s unreadable (%s); rebuilding it", path, e)
    features = convert_examples_to_features(
        examples, tokenizer, max_seq_length, doc_stride, max_query_length, is_training, progress=progress
    )
    if path is not None and write_cache:
        try:
            save_features(path, features)
            return features, f"built, cached in {path}"
        except (OSError, ValueError) as e:  # a read-only data folder must not stop a run
            logger.warning("could not write feature cache %s: %s", path, e)
    return features, "built"


# ----------------------------------------------------------------------------------------------------------------
# 4. Answers from logits


RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])


def _logits_of(all_results, unique_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(start [n], end [n]) logits of one feature, from a mapping uid -> RawResult / (start, end) / dict."""
    result = all_results[unique_id]
    if isinstance(result, Mapping):
        start, end = result["start_logits"], result["end_logits"]
    elif hasattr(result, "start_logits"):
        start, end = result.start_logits, result.end_logits
    else:
        start, end = result
    return np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def _window_candidates(
    feature: InputFeatures, start_logits: np.ndarray, end_logits: np.ndarray, n_best_size: int, max_answer_length: int
) -> list[tuple[float, int, int, float, float]]:
    """Valid (score, start, end, start_logit, end_logit) spans of one window.

    Valid: start and end inside the window's document tokens, the start in its max-context window, end >= start,
    at most max_answer_length tokens. The n_best_size best starts and ends are picked among valid positions only
    (the original ranked all positions, query and padding included, then dropped invalid pairs, so it could end
    up with fewer or no candidates).
    """
    positions = np.fromiter(feature.token_to_orig_map.keys(), dtype=np.int64)  # document positions of the window
    positions = positions[positions < min(len(start_logits), len(end_logits))]
    if positions.size == 0:
        return []
    max_context = np.array([feature.token_is_max_context.get(int(p), False) for p in positions], dtype=bool)
    starts = positions[max_context]
    starts = starts[np.argsort(-start_logits[starts], kind="stable")[:n_best_size]]  # [<=n]
    ends = positions[np.argsort(-end_logits[positions], kind="stable")[:n_best_size]]  # [<=n]
    s, e = np.meshgrid(starts, ends, indexing="ij")  # [n, n] every pair
    ok = (e >= s) & (e - s + 1 <= max_answer_length)
    s, e = s[ok], e[ok]
    return [
        (float(start_logits[a] + end_logits[b]), int(a), int(b), float(start_logits[a]), float(end_logits[b]))
        for a, b in zip(s, e)
    ]


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool, normalized: str | None = None) -> str:
    """Project a prediction made of WordPiece text back onto the original characters.

    `pred_text` is the joined (de-##'d) tokens, normalised (lower-cased, accents stripped, punctuation split);
    `orig_text` the original words the span covers. Normalise orig_text the same way (or pass that as
    `normalized`), find pred_text in it, and map that character range back through an alignment of the two texts
    without their spaces. When they cannot be aligned (normalisation changed the number of characters) the whole
    orig_text is the answer, as in the original.
    """
    if normalized is None:
        from tokenization import BasicTokenizer

        normalized = " ".join(BasicTokenizer(do_lower_case=do_lower_case).tokenize(orig_text))
    begin = normalized.find(pred_text)
    if begin < 0:
        return orig_text
    last = begin + len(pred_text) - 1

    orig_index = [i for i, c in enumerate(orig_text) if c != " "]  # k-th non-space character -> its position
    norm_index = [i for i, c in enumerate(normalized) if c != " "]
    if len(orig_index) != len(norm_index):
        return orig_text
    # Character i of `normalized` is the k-th non-space character, which sits at orig_index[k] in orig_text.
    norm_to_k = {position: k for k, position in enumerate(norm_index)}
    if begin not in norm_to_k or last not in norm_to_k:
        return orig_text
    return orig_text[orig_index[norm_to_k[begin]] : orig_index[norm_to_k[last]] + 1]


class _NormalizedWords:
    """BasicTokenizer output of each word of a document, computed once per word and joined per span.

    Tokenizing " ".join(words[a:b+1]) equals joining the tokenization of each word: every step of BasicTokenizer
    works within whitespace-separated pieces, and the words contain no whitespace their split did not see.
    """

    def __init__(self, words: list[str], do_lower_case: bool):

        self.words = words
        self.basic = BasicTokenizer(do_lower_case=do_lower_case)
        self.cache: dict[int, str] = {}

    def span(self, first: int, last: int) -> str:
        parts = []
        for i in range(first, last + 1):
            if i not in self.cache:
                self.cache[i] = " ".join(self.basic.tokenize(self.words[i]))
            if self.cache[i]:
                parts.append(self.cache[i])
        return " ".join(parts)


def _span_text(example: SquadExample, feature: InputFeatures, start: int, end: int, words: _NormalizedWords) -> str:
    tok_text = " ".join(feature.tokens[start : end + 1]).replace(" ##", "").replace("##", "")
    tok_text = " ".join(tok_text.split())
    first, last = feature.token_to_orig_map[start], feature.token_to_orig_map[end]
    orig_text = " ".join(example.doc_tokens[first : last + 1])
    return get_final_text(tok_text, orig_text, words.basic.do_lower_case, normalized=words.span(first, last))


def get_predictions(
    examples: Sequence[SquadExample],
    features: Sequence[InputFeatures],
    all_results,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    do_lower_case: bool = True,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, list[dict]], dict[str, float]]:
    """Answers from the model's logits.

    all_results: unique_id -> RawResult / (start_logits, end_logits) / {"start_logits", "end_logits"}, each [n]
    with n >= len(feature.tokens) (padding beyond is ignored). Every example needs a result for each of its
    features.

    Per example, over all its windows: the valid spans (see _window_candidates), best first by start + end logit,
    de-duplicated by answer text, the first n_best_size kept, probabilities by softmax over their scores. For v2.0
    the null answer's score is the smallest [CLS] score (start + end logit at position 0) over this example's
    windows; the example's answer is "" when null score - best span score > null_score_diff_threshold.

    Returns (predictions: qas_id -> text, nbest: qas_id -> [{text, probability, start_logit, end_logit}],
    null_odds: qas_id -> null score - best span score, for v2.0 only, else empty).
    """
    features_of: dict[int, list[InputFeatures]] = collections.defaultdict(list)
    for feature in features:
        features_of[feature.example_index].append(feature)
    predictions: dict[str, str] = {}
    nbest_json: dict[str, list[dict]] = {}
    null_odds: dict[str, float] = {}
    normalized: dict[int, _NormalizedWords] = {}  # id(doc_tokens) -> its words normalised, shared by questions
    for example_index, example in enumerate(examples):
        words = normalized.get(id(example.doc_tokens))
        if words is None:
            words = normalized[id(example.doc_tokens)] = _NormalizedWords(example.doc_tokens, do_lower_case)
        nbest, null_score, best_span = _example_nbest(
            example,
            features_of[example_index],
            all_results,
            n_best_size,
            max_answer_length,
            words,
            version_2_with_negative,
        )
        nbest_json[example.qas_id] = nbest
        if not version_2_with_negative:
            predictions[example.qas_id] = nbest[0]["text"] if nbest else ""
            continue
        # No span at all (an empty context): the null answer by a wide margin, kept finite for JSON.
        score_diff = null_score - best_span[0] if best_span is not None else 1e4
        null_odds[example.qas_id] = score_diff
        predictions[example.qas_id] = (
            "" if best_span is None or score_diff > null_score_diff_threshold else best_span[1]
        )
    return predictions, nbest_json, null_odds


def answers_from_logits(
    examples: Sequence,
    features: Sequence,
    results: dict,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    do_lower_case: bool = True,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> list[dict[str, Any]]:
    """The answer records of predict.answer_questions and triton/client.py from the windows' logits:
    get_predictions, then per question {"id", "question", "answer", "probability" (of the answer's n-best
    entry), "nbest"} and, for SQuAD 2.0 models, "null_score_diff"."""
    predictions, nbest, null_odds = get_predictions(
        examples,
        features,
        results,
        n_best_size,
        max_answer_length,
        do_lower_case,
        version_2_with_negative,
        null_score_diff_threshold,
    )
    out = []
    for example in examples:
        answer = predictions[example.qas_id]
        entries = nbest[example.qas_id]
        probability = next((e["probability"] for e in entries if e["text"] == answer), 0.0)
        record = {
            "id": example.qas_id,
            "question": example.question_text,
            "answer": answer,
            "probability": probability,
            "nbest": entries,
        }
        if version_2_with_negative:
            record["null_score_diff"] = null_odds[example.qas_id]
        out.append(record)
    return out


@dataclass(frozen=True)
class QASettings:
    """How questions are cut into windows and answers read back from the windows' logits, under the names of the
    flags of run_squad.py, inference.py and triton/client.py. Each group of fields stands beside the method that
    reads it."""

    # The windows: max_seq_length tokens (S) each, one starting every doc_stride document tokens, after the question
    # cut to max_query_length tokens.
    max_seq_length: int = 384
    """tokens per window"""
    doc_stride: int = 128
    """tokens between the starts of consecutive windows"""
    max_query_length: int = 64
    """questions are cut to this many tokens"""

    def features(self, examples: Sequence[SquadExample], tokenizer) -> list[InputFeatures]:
        """The windows of `examples` to predict (convert_examples_to_features without answers)."""
        return convert_examples_to_features(
            examples, tokenizer, self.max_seq_length, self.doc_stride, self.max_query_length, is_training=False
        )

    # The answers: the n_best_size best spans of at most max_answer_length tokens; for a SQuAD 2.0 model, "" when
    # null score - best span score exceeds null_score_diff_threshold.
    n_best_size: int = 20
    """answers listed per question"""
    max_answer_length: int = 30
    """longest answer, in WordPiece tokens"""
    version_2_with_negative: bool = False
    """the model may answer "" (SQuAD 2.0)"""
    null_score_diff_threshold: float = 0.0
    """v2.0: answer "" when null score - best span score exceeds this"""

    def answers(
        self, examples: Sequence[SquadExample], features: Sequence[InputFeatures], results: dict, do_lower_case: bool
    ) -> list[dict[str, Any]]:
        """answers_from_logits with these settings; `do_lower_case` is the tokenizer's."""
        return answers_from_logits(
            examples,
            features,
            results,
            self.n_best_size,
            self.max_answer_length,
            do_lower_case,
            self.version_2_with_negative,
            self.null_score_diff_threshold,
        )

    @classmethod
    def add_arguments(cls, parser, prefix: str = "") -> None:
        """Every field but max_seq_length (whose default is each command's) as a flag of the commands that answer
        questions (inference.py, triton/client.py, triton/model_repository.py's text model): these defaults, the
        field docstrings as help, after `prefix`."""
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            if f.name == "max_seq_length":
                continue
            if isinstance(f.default, bool):
                parser.add_argument(f"--{f.name}", action="store_true", help=prefix + docs[f.name])
            else:
                parser.add_argument(f"--{f.name}", type=type(f.default), default=f.default, help=prefix + docs[f.name])

    @classmethod
    def from_args(cls, args, **overrides) -> QASettings:
        """The settings from a script's flags of the same names (a parsed namespace, or a configuration's flat
        {flag: value}), `overrides` (e.g. a resolved max_seq_length) taking the place of some."""
        flags = args if isinstance(args, dict) else vars(args)
        return cls(**{**{f.name: flags[f.name] for f in dataclasses.fields(cls)}, **overrides})


def _example_nbest(
    example: SquadExample,
    features: list[InputFeatures],
    all_results,
    n_best_size: int,
    max_answer_length: int,
    words: _NormalizedWords,
    version_2: bool,
) -> tuple[list[dict], float, tuple[float, str] | None]:
    """(n-best entries, null score, (score, text) of the best non-null span or None) of one example."""
    candidates = []  # (score, window order, start, end, start_logit, end_logit)
    null = (math.inf, 0.0, 0.0)  # (score, start_logit, end_logit) of the smallest [CLS] score
    for order, feature in enumerate(features):
        start_logits, end_logits = _logits_of(all_results, feature.unique_id)
        if version_2 and start_logits[0] + end_logits[0] < null[0]:
            null = (float(start_logits[0] + end_logits[0]), float(start_logits[0]), float(end_logits[0]))
        for score, s, e, sl, el in _window_candidates(
            feature, start_logits, end_logits, n_best_size, max_answer_length
        ):
            candidates.append((score, order, s, e, sl, el))
    best_span = None
    if candidates:
        score, order, s, e = max(candidates, key=lambda c: c[0])[:4]  # max() keeps the first of equal scores
        best_span = (score, _span_text(example, features[order], s, e, words))
    if version_2:
        candidates.append((null[0], -1, 0, 0, null[1], null[2]))  # order -1: the null answer
    candidates.sort(key=lambda c: -c[0])  # stable: equal scores keep window order

    entries: list[dict] = []
    seen: set[str] = set()
    for score, order, s, e, sl, el in candidates:
        if len(entries) >= n_best_size:
            break
        text = "" if order < 0 else _span_text(example, features[order], s, e, words)
        if text in seen:
            continue
        seen.add(text)
        entries.append({"text": text, "start_logit": sl, "end_logit": el})
    if version_2 and "" not in seen:
        entries.append({"text": "", "start_logit": null[1], "end_logit": null[2]})
    probabilities = _softmax([x["start_logit"] + x["end_logit"] for x in entries])
    nbest = [
        {"text": x["text"], "probability": p, "start_logit": x["start_logit"], "end_logit": x["end_logit"]}
        for x, p in zip(entries, probabilities)
    ]
    return nbest, null[0], best_span


# ----------------------------------------------------------------------------------------------------------------
# 5. Evaluation: the official scripts' algorithms, re-implemented (tests compare with the scripts themselves).


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    s = "".join(c for c in s.lower() if c not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


_PUNCTUATION = frozenset(string.punctuation)


def exact_match_score(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, version_2: bool = False) -> float:
    """Token-overlap F1 of the normalised texts. v2.0 scores an empty prediction against an empty gold (the no
    answer) as 1 and against anything else as 0; v1.1 gives 0 whenever nothing overlaps."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if version_2 and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def evaluate_v1(gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match", "f1"} in percent over all gold questions (a missing prediction scores 0),
    each the maximum over the question's gold answers."""
    exact = f1 = 0.0
    for qid, golds in gold_answers.items():
        if not golds:
            raise ValueError(f"question {qid} has no gold answer: evaluate SQuAD 2.0 data with version 2")
        if qid not in predictions:
            continue
        exact += max(exact_match_score(predictions[qid], g) for g in golds)
        f1 += max(f1_score(predictions[qid], g) for g in golds)
    total = len(gold_answers)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def evaluate_v2(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """evaluate-v2.0.py: exact/f1/total, HasAns_* and NoAns_* breakdowns; with na_probs (the null_odds) also
    best_exact/best_f1 and their thresholds. A question whose na_prob exceeds na_prob_thresh counts as answered
    with "" (the script's --na-prob-thresh, default 1.0). Questions without a prediction are left out."""
    has_answer = {qid: bool(golds) for qid, golds in gold_answers.items()}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for qid, golds in gold_answers.items():
        if qid not in predictions:
            continue
        golds = [g for g in golds if normalize_answer(g)] or [""]
        exact_raw[qid] = max(exact_match_score(predictions[qid], g) for g in golds)
        f1_raw[qid] = max(f1_score(predictions[qid], g, version_2=True) for g in golds)
    probs = dict(na_probs) if na_probs is not None else {qid: 0.0 for qid in predictions}
    exact = _apply_na_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1 = _apply_na_threshold(f1_raw, probs, has_answer, na_prob_thresh)
    out = _mean_scores(exact, f1, list(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in exact if has_answer[qid] == wanted]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in _mean_scores(exact, f1, qids).items()})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(predictions, exact_raw, probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(predictions, f1_raw, probs, has_answer)
    return out


def _apply_na_threshold(scores, na_probs, has_answer, thresh):
    return {qid: float(not has_answer[qid]) if na_probs[qid] > thresh else s for qid, s in scores.items()}


def _mean_scores(exact, f1, qids) -> dict[str, float]:
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / total,
        "f1": 100.0 * sum(f1[q] for q in qids) / total,
        "total": total,
    }


def _best_threshold(predictions, scores, na_probs, has_answer) -> tuple[float, float]:
    """Sweep the no-answer threshold over the sorted na_probs: start with every question answered "" (all NoAns
    right), then answer them one by one in order of increasing na_prob, keeping the best total."""
    score = best = sum(1 for v in has_answer.values() if not v)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        elif predictions[qid]:
            score -= 1
        if score > best:
            best, best_thresh = score, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def score_predictions(
    gold_answers: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    version_2_with_negative: bool,
    null_odds: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The official scores of `predictions`: evaluate_v2 (with null_odds as the no-answer probabilities) for SQuAD
    2.0, else evaluate_v1."""
    if version_2_with_negative:
        return evaluate_v2(gold_answers, predictions, null_odds)
    return evaluate_v1(gold_answers, predictions)


def first_sentence_baseline(path_or_json: str | os.PathLike | Mapping) -> dict[str, str]:
    """qas_id -> the first sentence of its context (up to the first '.', '!' or '?' followed by whitespace): a
    floor that any trained model must beat by far."""
    predictions = {}
    for article in squad_articles(path_or_json):
        for paragraph in article["paragraphs"]:
            context = paragraph.get("context", "")
            match = re.search(r"[.!?](\s|$)", context)
            first = context[: match.start() + 1] if match else context
            for qa in paragraph.get("qas", []):
                predictions[str(qa["id"])] = first.strip()
    return predictions
