"""SQuAD's official evaluation, re-implemented: the algorithms of evaluate-v1.1.py (`evaluate_v1`: exact match and
F1 over every question) and evaluate-v2.0.py (`evaluate_v2`: the same with no-answer questions, their HasAns/NoAns
breakdown and the best no-answer threshold), on the answers normalised as the scripts normalise them
(`normalize_answer`). `score_predictions` scores with the one of the data's version. Plain Python: the tests compare
it with the official scripts themselves (../shared/data).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence


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
