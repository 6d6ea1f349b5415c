"""SQuAD v1.1 / v2.0 for BERT: reading examples and cutting them into the sliding-window features the model reads.

Read top to bottom:
  1. reading   `read_squad_examples` (the official nested format, or Hugging Face's flat one) and
               `examples_from_qa_pairs` (free question/context pairs for inference) -> SquadExample
  2. features  `convert_examples_to_features`: WordPiece each document once, truncate the question, cut the document
               into windows of `max_seq_length` tokens that start `doc_stride` tokens apart, and record for every
               document token in every window the original word it came from and whether this window is the one
               that gives it the most context -> InputFeatures
The rest of SQuAD follows in modules of its own: squad_cache.py (the features on disk), squad_answers.py
(`QASettings`, answers from the windows' logits) and squad_metrics.py (the official evaluation).

Notation: F features (windows), S max_seq_length, T WordPiece tokens of one document, W windows of one document.

A feature's token layout is `[CLS] question [SEP] document-window [SEP] [PAD]...`, segment 0 up to the first [SEP]
and 1 after it. The triton/ client imports `examples_from_qa_pairs` and `convert_examples_to_features` from here
(and `get_predictions`, `QASettings` from squad_answers.py), so their names and signatures are part of the
project's interface.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)

# Google's BERT numbers the features from here; kept so unique ids look like the original's.
FIRST_UNIQUE_ID = 1_000_000_000


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
