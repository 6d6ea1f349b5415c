"""SQuAD's answers from the model's logits: `QASettings` (how questions are cut into windows and answers read
back, the flags of every command that answers), `get_predictions` (the best start/end pairs per example over all its
windows, projected back onto the original characters, with probabilities; for v2.0 the null answer against the best
span) and `answers_from_logits` (the answer records of inference.py and the Triton client).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from bert_recipe.tasks.squad import InputFeatures, SquadExample, convert_examples_to_features
from tokenization import BasicTokenizer

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
    flags of run_squad.py, inference.py and triton/client.py: a section of the configurations of the commands that
    answer (each derives from it to give max_seq_length its own default, or leaves it out). Each group of fields
    stands beside the method that reads it."""

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
    def from_flags(cls, flags: dict[str, Any]) -> QASettings:
        """The settings from a configuration's flat {flag: value} (cfg.flags(): run_squad.py keeps these flags in
        several sections). A command whose section derives from QASettings has its settings in that section."""
        return cls(**{f.name: flags[f.name] for f in dataclasses.fields(cls)})


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
    for _score, order, s, e, sl, el in candidates:
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
