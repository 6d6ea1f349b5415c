"""GLUE: readers on the real files and on tsv files laid out as GLUE's, metrics against formulas written out here,
pair encoding against Hugging Face's tokenizer, real learning from the real MiniLM weights, the regression path,
the Hugging Face export against transformers, and the launcher presets against run_glue.py's own flags."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import run_glue
from bench import nan_probe
from bert_recipe.finetuning import recipe
from bert_recipe.io.checkpoint_io import from_pretrained
from bert_recipe.prediction import predict
from bert_recipe.tasks.glue import (
    TASKS,
    EncodedExamples,
    GlueDataError,
    compute_metrics,
    encode_examples,
    get_dev_examples,
    get_task,
    get_test_examples,
    get_train_examples,
    read_examples,
    truncate_seq_pair,
)
from modeling import BertForSequenceClassification
from tokenization import BertTokenizer

# ----------------------------------------------------------------------------------------------------------------
# Readers on the real files (counts from ../shared/data/README.md and the PROVENANCE files)


def _label_counts(examples) -> dict:
    counts: dict = {}
    for e in examples:
        counts[e.label] = counts.get(e.label, 0) + 1
    return counts


def test_mrpc_real_files(shared_data):
    task = get_task("MRPC")
    train = get_train_examples(shared_data / "glue-mrpc", task)
    dev = get_dev_examples(shared_data / "glue-mrpc", task)
    test = get_test_examples(shared_data / "glue-mrpc", task)
    assert len(train) == 3668 and _label_counts(train) == {"1": 2474, "0": 1194}
    assert list(dev) == ["dev"] and len(dev["dev"]) == 408 and _label_counts(dev["dev"]) == {"1": 279, "0": 129}
    assert len(test["test"]) == 1725 and all(e.label is None for e in test["test"])
    # The BOM is gone and quotes are kept verbatim (no csv quoting): the first dev pair as it is in the file.
    first = dev["dev"][0]
    assert first.text_a == "He said the foodservice pie business doesn't fit the company's long-term growth strategy."
    assert first.text_b == '"The foodservice pie business does not fit our long-term growth strategy.'
    assert all("\ufeff" not in e.text_a + e.text_b for e in train + dev["dev"])
    # test guids carry GLUE's submission index
    assert test["test"][0].guid == "test-0" and test["test"][-1].guid == "test-1724"


def test_sst2_and_cola_real_files(shared_data):
    sst = get_task("sst-2")
    dev = get_dev_examples(shared_data / "glue-sst2", sst)["dev"]
    assert len(dev) == 872 and _label_counts(dev) == {"1": 444, "0": 428}
    assert dev[0].text_a.startswith("it 's a charming and often affecting journey") and dev[0].text_b is None
    assert len(get_test_examples(shared_data / "glue-sst2", sst)["test"]) == 1821

    cola = get_task("cola")
    folder = shared_data / "glue-cola"  # the raw public release: no header, 4 columns
    train = get_train_examples(folder, cola)
    assert len(train) == 8551 and _label_counts(train) == {"1": 6023, "0": 2528}
    in_domain = read_examples([folder / "in_domain_dev.tsv"], cola, "dev", cola.layout)
    assert len(in_domain) == 527 and _label_counts(in_domain) == {"1": 365, "0": 162}
    dev = get_dev_examples(folder, cola)["dev"]  # GLUE's dev set = in-domain + out-of-domain dev
    assert len(dev) == 527 + 516 and _label_counts(dev) == {"1": 365 + 354, "0": 162 + 162}
    assert dev[0].text_a == "The sailors rode the breeze clear of the rocks."


def test_hf_fixture_files(shared_data):
    mrpc = get_dev_examples(shared_data / "hf-test-fixtures" / "MRPC", get_task("mrpc"))["dev"]
    assert len(mrpc) == 6 and {e.label for e in mrpc} <= {"0", "1"}
    stsb = get_dev_examples(shared_data / "hf-test-fixtures" / "STS-B", get_task("sts-b"))["dev"]
    assert len(stsb) == 9
    assert stsb[0].text_a == "A man with a hard hat is dancing." and float(stsb[0].label) == 5.0
    assert all(0.0 <= float(e.label) <= 5.0 for e in stsb)
    assert [e.guid for e in stsb] == [f"dev-{i}" for i in range(9)]


# ----------------------------------------------------------------------------------------------------------------
# Readers on files laid out as GLUE's (headers and columns of download_glue_data.py's output)

MNLI_DEV_HEADER = (
    "index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse "
    "sentence2_parse sentence1 sentence2 label1 label2 label3 label4 label5 gold_label"
).split()
MNLI_TRAIN_HEADER = MNLI_DEV_HEADER[:11] + ["gold_label"]
MNLI_TEST_HEADER = MNLI_DEV_HEADER[:10]


def _write(path: Path, rows: list[list[str]], bom: bool = False) -> None:
    text = "".join("\t".join(row) + "\n" for row in rows)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


def _mnli_row(i, s1, s2, labels):
    return [
        str(i),
        "31193",
        f"{31193 + i}n",
        "government",
        "( ( parse",
        "( parse )",
        "(ROOT (S ...))",
        "(ROOT ...)",
        s1,
        s2,
        *labels,
    ]


def test_mnli_matched_and_mismatched(tmp_path):
    _write(
        tmp_path / "train.tsv",
        [
            MNLI_TRAIN_HEADER,
            _mnli_row(
                0,
                "Conceptually cream skimming has two basic dimensions.",
                "Product and geography are what make cream skimming work.",
                ["neutral", "neutral"],
            ),
            _mnli_row(1, 'He said "yes".', "He agreed.", ["entailment", "entailment"]),
        ],
    )
    _write(
        tmp_path / "dev_matched.tsv",
        [
            MNLI_DEV_HEADER,
            _mnli_row(
                0,
                "The new rights are nice enough",
                "Everyone really likes them",
                ["neutral", "entailment", "neutral", "neutral", "neutral", "neutral"],
            ),
        ],
    )
    _write(
        tmp_path / "dev_mismatched.tsv",
        [MNLI_DEV_HEADER, _mnli_row(7, "Your contribution helped.", "It did not help at all.", ["contradiction"] * 6)],
    )
    _write(tmp_path / "test_matched.tsv", [MNLI_TEST_HEADER, _mnli_row(42, "A test premise.", "A hypothesis.", [])])
    _write(tmp_path / "test_mismatched.tsv", [MNLI_TEST_HEADER, _mnli_row(9, "Another.", "One more.", [])])
    task = get_task("MNLI")
    train = get_train_examples(tmp_path, task)
    assert [(e.text_b, e.label) for e in train] == [
        ("Product and geography are what make cream skimming work.", "neutral"),
        ("He agreed.", "entailment"),
    ]
    assert train[1].text_a == 'He said "yes".'
    dev = get_dev_examples(tmp_path, task)
    assert list(dev) == ["dev_matched", "dev_mismatched"]
    # gold_label (the last column), not label1 (the first annotator)
    assert dev["dev_matched"][0].label == "neutral" and dev["dev_mismatched"][0].label == "contradiction"
    assert dev["dev_mismatched"][0].guid == "dev_mismatched-7"
    test = get_test_examples(tmp_path, task)
    assert test["test_matched"][0].guid == "test_matched-42" and test["test_matched"][0].label is None
    assert get_task("mnli-mm") is task and task.labels == ("contradiction", "entailment", "neutral")


def test_qqp_qnli_rte_wnli_stsb_layouts(tmp_path):
    cases = {
        "qqp": (
            [
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                ["133273", "213221", "213222", "How is the life of a math student?", "Which level of math?", "0"],
                ["402555", "536040", "536041", "How do I control my horny emotions?", "How do you control it?", "1"],
                ["999", "1", "2", "a row with a question missing"],
            ],  # the public file has a few such rows
            ("qqp", "train-402555", "How do I control my horny emotions?", "How do you control it?", "1"),
        ),
        "qnli": (
            [
                ["index", "question", "sentence", "label"],
                [
                    "0",
                    "When did the third Digimon series begin?",
                    "Unlike the two seasons before it, the third season is darker.",
                    "not_entailment",
                ],
            ],
            (
                "qnli",
                "train-0",
                "When did the third Digimon series begin?",
                "Unlike the two seasons before it, the third season is darker.",
                "not_entailment",
            ),
        ),
        "rte": (
            [
                ["index", "sentence1", "sentence2", "label"],
                ["0", "No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons Found in Iraq.", "not_entailment"],
                ["1", "A place of sorrow.", "Sorrow exists.", "entailment"],
            ],
            ("rte", "train-1", "A place of sorrow.", "Sorrow exists.", "entailment"),
        ),
        "wnli": (
            [
                ["index", "sentence1", "sentence2", "label"],
                [
                    "0",
                    "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
                    "The carrot had a hole.",
                    "1",
                ],
            ],
            (
                "wnli",
                "train-0",
                "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
                "The carrot had a hole.",
                "1",
            ),
        ),
        "sts-b": (
            [
                [
                    "index",
                    "genre",
                    "filename",
                    "year",
                    "old_index",
                    "source1",
                    "source2",
                    "sentence1",
                    "sentence2",
                    "score",
                ],
                [
                    "0",
                    "main-captions",
                    "MSRvid",
                    "2012test",
                    "0001",
                    "none",
                    "none",
                    "A plane is taking off.",
                    "An air plane is taking off.",
                    "5.000",
                ],
                [
                    "1",
                    "main-captions",
                    "MSRvid",
                    "2012test",
                    "0004",
                    "none",
                    "none",
                    "A man is playing a flute.",
                    "A man is playing a bamboo flute.",
                    "3.800",
                ],
            ],
            ("sts-b", "train-1", "A man is playing a flute.", "A man is playing a bamboo flute.", "3.800"),
        ),
    }
    for name, (rows, (task_name, guid, text_a, text_b, label)) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        _write(folder / "train.tsv", rows, bom=name == "qnli")  # a BOM before the header is dropped
        examples = get_train_examples(folder, get_task(task_name))
        assert len(examples) == len(rows) - 1 - (name == "qqp"), name
        found = next(e for e in examples if e.guid == guid)
        assert (found.text_a, found.text_b, found.label) == (text_a, text_b, label), name
    assert get_task("STSB").is_regression and get_task("sts-b").num_labels == 1
    assert {n: len(t.labels or ()) for n, t in TASKS.items()} == {
        "cola": 2,
        "sst-2": 2,
        "mrpc": 2,
        "sts-b": 0,
        "qqp": 2,
        "mnli": 3,
        "qnli": 2,
        "rte": 2,
        "wnli": 2,
    }


def test_glue_layout_cola_and_sst2_test_files(tmp_path):
    # GLUE's CoLA: train/dev without a header, test with "index<TAB>sentence"; SST-2 test likewise.
    _write(
        tmp_path / "train.tsv",
        [["gj04", "1", "", "Our friends won't buy this analysis."], ["gj04", "0", "*", "They drank the pub."]],
    )
    _write(tmp_path / "dev.tsv", [["gj04", "1", "", "The sailors rode the breeze clear of the rocks."]])
    _write(tmp_path / "test.tsv", [["index", "sentence"], ["0", "Bill whistled past the house."]])
    cola = get_task("CoLA")
    train = get_train_examples(tmp_path, cola)
    assert [(e.text_a, e.label) for e in train] == [
        ("Our friends won't buy this analysis.", "1"),
        ("They drank the pub.", "0"),
    ]
    assert len(get_dev_examples(tmp_path, cola)["dev"]) == 1  # dev.tsv wins over the raw release's files
    assert get_test_examples(tmp_path, cola)["test"][0].text_a == "Bill whistled past the house."


def test_bad_input_is_one_line_error(tmp_path):
    task = get_task("rte")
    with pytest.raises(GlueDataError, match=r"RTE train set not found: no .*train\.tsv"):
        get_train_examples(tmp_path, task)
    with pytest.raises(GlueDataError, match="not a directory"):
        get_train_examples(tmp_path / "nowhere", task)
    _write(tmp_path / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "maybe"]])
    with pytest.raises(GlueDataError, match=r"train\.tsv:2: label 'maybe' is not one of \['entailment'"):
        get_train_examples(tmp_path, task)
    _write(tmp_path / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b"]])
    with pytest.raises(GlueDataError, match=r"train\.tsv:2: 3 tab-separated fields, expected at least 4"):
        get_train_examples(tmp_path, task)
    _write(tmp_path / "train.tsv", [["index", "premise", "hypothesis", "label"], ["0", "a", "b", "entailment"]])
    with pytest.raises(GlueDataError, match="no column 'sentence1' in the header"):
        get_train_examples(tmp_path, task)
    with pytest.raises(GlueDataError, match="unknown --task_name 'squad'"):
        get_task("squad")


# ----------------------------------------------------------------------------------------------------------------
# Metrics against their formulas


def test_metrics_against_formulas():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    preds = np.where(rng.random(200) < 0.7, labels, 1 - labels)
    tp = int(((preds == 1) & (labels == 1)).sum())
    tn = int(((preds == 0) & (labels == 0)).sum())
    fp = int(((preds == 1) & (labels == 0)).sum())
    fn = int(((preds == 0) & (labels == 1)).sum())
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    f1 = 2 * tp / (2 * tp + fp + fn)
    acc = (tp + tn) / 200

    cola = compute_metrics(get_task("cola"), preds, labels)
    assert cola["mcc"] == pytest.approx(mcc, abs=1e-12) and cola["acc"] == pytest.approx(acc)
    for name in ("mrpc", "qqp"):
        m = compute_metrics(get_task(name), preds, labels)
        assert m == pytest.approx({"acc": acc, "f1": f1, "acc_and_f1": (acc + f1) / 2}, abs=1e-12)
    for name in ("sst-2", "qnli", "rte", "wnli"):
        assert compute_metrics(get_task(name), preds, labels) == pytest.approx({"acc": acc})
    three = rng.integers(0, 3, 50)
    assert compute_metrics(get_task("mnli"), three, np.roll(three, 1))["acc"] == pytest.approx(
        np.mean(three == np.roll(three, 1))
    )
    # All one class: MCC is 0 by convention (the numerator is 0), F1 of never predicting "1" is 0.
    assert compute_metrics(get_task("cola"), np.ones(10, int), labels[:10])["mcc"] == 0.0
    assert compute_metrics(get_task("mrpc"), np.zeros(10, int), np.ones(10, int))["f1"] == 0.0


def test_regression_metrics_against_formulas():
    rng = np.random.default_rng(1)
    labels = rng.uniform(0, 5, 100)
    preds = labels + rng.normal(0, 1.0, 100)  # continuous: no ties, so ranks are a permutation
    xm, ym = preds - preds.mean(), labels - labels.mean()
    pearson = (xm * ym).sum() / math.sqrt((xm**2).sum() * (ym**2).sum())
    rank_x, rank_y = np.argsort(np.argsort(preds)), np.argsort(np.argsort(labels))
    d = (rank_x - rank_y).astype(float)
    spearman = 1 - 6 * (d**2).sum() / (100 * (100**2 - 1))
    m = compute_metrics(get_task("sts-b"), preds, labels)
    assert m["pearson"] == pytest.approx(pearson, abs=1e-10)
    assert m["spearmanr"] == pytest.approx(spearman, abs=1e-10)
    assert m["corr"] == pytest.approx((pearson + spearman) / 2, abs=1e-10)
    assert compute_metrics(get_task("sts-b"), np.full(100, 2.5), labels)["pearson"] is None  # undefined


@pytest.mark.filterwarnings("ignore:A single label was found")  # scikit-learn on the one-class case
def test_metrics_equal_scikit_learn_and_scipy_with_ties_and_three_classes():
    """GLUE's own evaluation computes its metrics with scikit-learn and scipy; ours are numpy: the same numbers on
    predictions with many ties (Spearman's average ranks), three classes (Matthews' R_K), and degenerate cases."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef

    rng = np.random.default_rng(3)
    for n in (2, 7, 300):
        labels = rng.integers(0, 6, n) / 2  # scores 0-2.5 in halves: many ties
        preds = np.round(labels + rng.normal(0, 0.8, n), 1)
        if np.ptp(preds) == 0 or np.ptp(labels) == 0:
            continue
        m = compute_metrics(get_task("sts-b"), preds, labels)
        assert m["pearson"] == pytest.approx(pearsonr(preds, labels)[0], abs=1e-12)
        assert m["spearmanr"] == pytest.approx(spearmanr(preds, labels)[0], abs=1e-12)
    for k, n in ((2, 9), (2, 500), (3, 500)):
        labels, preds = rng.integers(0, k, n), rng.integers(0, k, n)
        preds[: n // 2] = labels[: n // 2]
        assert compute_metrics(get_task("cola"), preds, labels)["mcc"] == pytest.approx(
            matthews_corrcoef(labels, preds), abs=1e-12
        )
        if k == 2:
            assert compute_metrics(get_task("mrpc"), preds, labels)["f1"] == pytest.approx(
                f1_score(labels, preds, pos_label=1, zero_division=0.0), abs=1e-12
            )
    for preds, labels in (
        (np.zeros(5, int), np.zeros(5, int)),
        (np.ones(5, int), np.zeros(5, int)),
        (np.array([0, 1, 1, 0]), np.array([1, 0, 0, 1])),
    ):
        assert compute_metrics(get_task("cola"), preds, labels)["mcc"] == pytest.approx(
            matthews_corrcoef(labels, preds), abs=1e-12
        )
        assert compute_metrics(get_task("mrpc"), preds, labels)["f1"] == pytest.approx(
            f1_score(labels, preds, pos_label=1, zero_division=0.0), abs=1e-12
        )


# ----------------------------------------------------------------------------------------------------------------
# Encoding


def test_truncate_seq_pair_longest_first():
    a, b = list(range(10)), list(range(100, 104))
    truncate_seq_pair(a, b, 9)  # the long one loses tokens until it is no longer the longer
    assert a == list(range(5)) and b == list(range(100, 104))
    a, b = list(range(7)), list(range(100, 107))
    truncate_seq_pair(a, b, 9)  # equal lengths: B loses first, then they alternate
    assert a == list(range(5)) and b == list(range(100, 104))
    a, b = [1, 2], [3]
    truncate_seq_pair(a, b, 5)
    assert (a, b) == ([1, 2], [3])


def test_pair_encoding_matches_transformers(shared_data, minilm_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    ours = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    task = get_task("mrpc")
    examples = get_dev_examples(shared_data / "glue-mrpc", task)["dev"][:100]
    encoded = encode_examples(examples, ours, 128, task)
    assert encoded.truncated == 0
    for i, e in enumerate(examples):  # no truncation needed: exactly transformers' [CLS] A [SEP] B [SEP]
        ref = hf(e.text_a, e.text_b)
        ids, types = encoded.example(i)
        assert ids.tolist() == ref["input_ids"] and types.tolist() == ref["token_type_ids"], i

    # Truncated: both parts are prefixes of the full WordPiece sequences, the total is the budget, and the longer
    # one was shortened first (lengths within one token, or the shorter one intact). transformers' Rust
    # longest-first gives the odd token to B where Google's gives it to A, so it is not the reference here.
    short = encode_examples(examples, ours, 32, task)
    assert short.truncated > 0
    for i, e in enumerate(examples):
        full_a = hf(e.text_a, add_special_tokens=False)["input_ids"]
        full_b = hf(e.text_b, add_special_tokens=False)["input_ids"]
        ids, types = short.example(i)
        n_a = int(short.len_a[i]) - 2
        a, b = ids[1 : 1 + n_a].tolist(), ids[2 + n_a : -1].tolist()
        assert a == full_a[: len(a)] and b == full_b[: len(b)]
        assert len(ids) == min(32, len(full_a) + len(full_b) + 3)
        if len(a) < len(full_a) and len(b) < len(full_b):
            assert len(a) - len(b) in (0, 1)
        elif len(a) < len(full_a) or len(b) < len(full_b):
            assert len(a) >= len(b) if len(a) < len(full_a) else len(b) >= len(a)
        assert types.tolist() == [0] * (n_a + 2) + [1] * (len(b) + 1)


def test_collate_pads_to_the_longest_in_the_batch():
    ids = np.array([101, 5, 6, 102, 101, 7, 102, 8, 9, 102], dtype=np.int32)
    encoded = EncodedExamples(
        ids=ids,
        offsets=np.array([0, 4, 10]),
        len_a=np.array([4, 3], dtype=np.int32),
        labels=np.array([1, 0]),
        truncated=0,
    )
    batch = run_glue.collate([recipe.EncodedDataset(encoded)[i] for i in (0, 1)])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}  # the model's argument names
    assert batch["input_ids"].tolist() == [[101, 5, 6, 102, 0, 0], [101, 7, 102, 8, 9, 102]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [1, 0]
    order = predict.length_sorted_batches(np.array([3, 9, 5, 7]), 2)
    assert order == [[1, 3], [2, 0]]


def test_optimizer_step_count():
    # ceil over epochs of ceil(batches / accumulation); max_steps wins
    assert recipe.count_optimizer_steps(batches_per_epoch=10, accumulation=3, epochs=2, max_steps=-1) == 8
    assert recipe.count_optimizer_steps(10, 1, 0.5, -1) == 5
    assert recipe.count_optimizer_steps(10, 1, 3, 7) == 7


# ----------------------------------------------------------------------------------------------------------------
# Real learning from the real MiniLM weights, in --precision auto (bf16 only on a CPU that has it natively: about
# twice as fast as fp32 there, and 20x slower than fp32 where it is emulated)
#
# SST-2 learns from 480 sentences in 2 epochs: 75.5% and 78% dev accuracy with seeds 2 and 3, against 50.5% for the
# majority class (320 sentences x 3 epochs, the same cost, gave 76-76.5%; 320 x 2 gave 66.5% or 75.5%).
# MRPC does not fit this file's time budget: few-sample MRPC is the unstable case (Mosbach et al., 2021), and with
# MiniLM-L6 320 pairs plateau at 70-72% accuracy after 3-6 epochs (majority 68.5% on the first 200 dev pairs) while
# 640 pairs x 3 epochs gave 75% with one seed and 69% with another, at about 7 CPU-minutes a run. MRPC learning is
# therefore shown by bench/glue_acceptance.py on the full training set (F1 86.9, accuracy 80.6 against 81.2 / 68.4);
# here MRPC runs a short end-to-end fine-tune whose outputs are checked (predictions, results, model.pt, hf_model/).

DEV_EXAMPLES = 200
SST2 = dict(train=480, epochs=2, batch=16, lr=1e-4, margin=0.15)


pytestmark = pytest.mark.usefixtures("one_thread_on_a_busy_cpu")


def _run(out: Path, minilm_dir, task: str, data_dir: Path, *flags: str) -> dict:
    return run_glue.main(
        [
            "--task_name",
            task,
            "--data_dir",
            str(data_dir),
            "--init_checkpoint",
            str(minilm_dir),
            "--do_lower_case",
            "--output_dir",
            str(out),
            "--precision",
            "auto",
            "--seed",
            "2",
            "--disable_progress_bar",
            *flags,
        ]
    )


def _majority(dev, task) -> float:
    gold = np.array([task.labels.index(e.label) for e in dev])
    return float(max(np.mean(gold == 0), np.mean(gold == 1)))


def _check_outputs(out: Path, dev, task) -> dict:
    """results.json and predictions.json are complete and agree: the accuracy recomputed from the written
    predictions is the reported one; the latency percentiles are ordered."""
    results = json.loads((out / "results.json").read_text())
    metrics = results["eval"]["dev"]
    predictions = json.loads((out / "predictions.json").read_text())
    assert list(predictions) == [e.guid for e in dev]
    assert set(predictions.values()) <= set(task.labels)
    gold = np.array([task.labels.index(e.label) for e in dev])
    pred = np.array([task.labels.index(predictions[e.guid]) for e in dev])
    assert metrics["acc"] == pytest.approx(np.mean(pred == gold)) and metrics["examples"] == len(dev)
    inference = results["inference"]
    assert 0 < inference["latency_ms_p50"] <= inference["latency_ms_p90"] <= inference["latency_ms_p99"]
    assert inference["sequences"] == len(dev) and inference["sequences_per_second"] > 0
    return results


def test_auto_trains_as_the_hardware_decides_and_evaluation_alone_is_fp32(tmp_path, shared_data, minilm_dir, cpu_bf16):
    """--precision auto: a run with --do_train trains (and evaluates) in the fastest native precision, which is
    what the CPU decides (cpu_bf16: as one with and one without native bf16); a run that only evaluates the saved
    model is fp32 on either, and equals the explicit fp32 evaluation."""
    data = shared_data / "glue-sst2"
    # One optimizer step and 8 sentences: the decision is what is checked, and bf16 on a CPU without it is emulated.
    trained = _run(
        tmp_path / "train",
        minilm_dir,
        "sst-2",
        data,
        "--do_train",
        "--max_train_examples",
        "8",
        "--max_steps",
        "1",
        "--train_batch_size",
        "8",
        "--max_seq_length",
        "32",
        "--do_eval",
        "--max_eval_examples",
        "8",
    )
    assert trained["precision"] == cpu_bf16 and trained["train"]["steps"] == 1
    evaluate = ["--do_eval", "--max_eval_examples", "8", "--max_seq_length", "32"]
    alone = _run(tmp_path / "eval", tmp_path / "train" / "model.pt", "sst-2", data, *evaluate)
    assert alone["precision"] == "fp32" and "only reads a model" in alone["precision_reason"]
    named = _run(tmp_path / "eval32", tmp_path / "train" / "model.pt", "sst-2", data, *evaluate, "--precision", "fp32")
    assert alone["eval"]["dev"] == named["eval"]["dev"]


def test_sst2_learns_from_minilm(tmp_path, shared_data, minilm_dir):
    task, data = get_task("sst-2"), shared_data / "glue-sst2"
    _run(
        tmp_path,
        minilm_dir,
        "sst-2",
        data,
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--skip_checkpoint",
        "--max_train_examples",
        str(SST2["train"]),
        "--max_eval_examples",
        str(DEV_EXAMPLES),
        "--num_train_epochs",
        str(SST2["epochs"]),
        "--train_batch_size",
        str(SST2["batch"]),
        "--learning_rate",
        str(SST2["lr"]),
    )
    dev = get_dev_examples(data, task)["dev"][:DEV_EXAMPLES]
    results = _check_outputs(tmp_path, dev, task)
    accuracy, majority = results["eval"]["dev"]["acc"], _majority(dev, task)
    print(f"SST-2: dev accuracy {accuracy:.4f} vs majority {majority:.4f} on {len(dev)} dev sentences")
    assert results["train"]["examples"] == SST2["train"]
    assert accuracy >= majority + SST2["margin"], (accuracy, majority)


MRPC_EVAL = 64


@pytest.fixture(scope="module")
def mrpc_run(tmp_path_factory, shared_data, minilm_dir) -> Path:
    """A short MRPC fine-tune (64 pairs, 4 optimizer steps) with every output written."""
    out = tmp_path_factory.mktemp("mrpc")
    _run(
        out,
        minilm_dir,
        "mrpc",
        shared_data / "glue-mrpc",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--max_train_examples",
        "64",
        "--max_eval_examples",
        str(MRPC_EVAL),
        "--max_steps",
        "4",
        "--train_batch_size",
        "16",
        "--learning_rate",
        "1e-4",
        "--precision",
        "fp32",
    )  # its re-evaluation (fp32 on every CPU) is compared with its scores at 1e-6
    return out


def test_mrpc_outputs_and_reload(mrpc_run, tmp_path, shared_data):
    """results/predictions of the fine-tune are consistent, and evaluating its model.pt and its hf_model/ in a new
    run (no training) reproduces the same predictions and metrics."""
    task, data = get_task("mrpc"), shared_data / "glue-mrpc"
    dev = get_dev_examples(data, task)["dev"][:MRPC_EVAL]
    results = _check_outputs(mrpc_run, dev, task)
    assert results["train"]["steps"] == 4 and results["train"]["examples"] == 64
    assert set(results["eval"]["dev"]) == {"acc", "f1", "acc_and_f1", "loss", "examples"}
    for source in ("model.pt", "hf_model"):
        out = tmp_path / source
        again = _run(
            out, mrpc_run / source, "mrpc", data, "--do_eval", "--do_predict", "--max_eval_examples", str(MRPC_EVAL)
        )
        assert json.loads((out / "predictions.json").read_text()) == json.loads(
            (mrpc_run / "predictions.json").read_text()
        )
        assert again["eval"]["dev"] == pytest.approx(results["eval"]["dev"], abs=1e-6)


def test_hf_export_matches_transformers(mrpc_run, shared_data):
    """The fine-tuned model's hf_model/ in transformers gives the logits of our model.pt in our model."""
    from transformers.models.bert.modeling_bert import BertForSequenceClassification as HFBert

    saved = torch.load(mrpc_run / "model.pt", map_location="cpu", weights_only=True)
    assert saved["task"] == "mrpc" and saved["labels"] == ["0", "1"] and saved["num_labels"] == 2
    ours = from_pretrained(BertForSequenceClassification, mrpc_run / "model.pt", log=None, num_labels=2).eval()
    hf = HFBert.from_pretrained(str(mrpc_run / "hf_model"), attn_implementation="eager").eval()
    assert hf.config.id2label == {0: "0", 1: "1"}

    task = get_task("mrpc")
    examples = get_dev_examples(shared_data / "glue-mrpc", task)["dev"][:8]
    encoded = encode_examples(
        examples, BertTokenizer(mrpc_run / "hf_model" / "vocab.txt", do_lower_case=True), 128, task
    )
    batch = run_glue.collate([recipe.EncodedDataset(encoded)[i] for i in range(len(examples))])
    with torch.no_grad():
        (logits,) = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        ref = hf(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        ).logits
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# STS-B: the regression head end to end


def test_stsb_regression_end_to_end(tmp_path, shared_data, minilm_dir):
    rows = (shared_data / "hf-test-fixtures" / "STS-B" / "dev.tsv").read_bytes()
    data = tmp_path / "STS-B"
    data.mkdir()
    (data / "train.tsv").write_bytes(rows)  # the fixture has dev rows only: train on them too
    (data / "dev.tsv").write_bytes(rows)
    out = tmp_path / "out"
    results = run_glue.main(
        [
            "--task_name",
            "STS-B",
            "--data_dir",
            str(data),
            "--init_checkpoint",
            str(minilm_dir),
            "--do_lower_case",
            "--output_dir",
            str(out),
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--max_steps",
            "2",
            "--train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "2",
            "--learning_rate",
            "1e-4",
            "--disable_progress_bar",
            "--skip_checkpoint",
        ]
    )
    assert results["train"]["steps"] == 2
    predictions = json.loads((out / "predictions.json").read_text())
    dev = get_dev_examples(data, get_task("sts-b"))["dev"]
    preds = np.array([predictions[e.guid] for e in dev])
    gold = np.array([float(e.label) for e in dev])
    assert preds.dtype == np.float64 and len(set(preds.tolist())) == len(preds)
    metrics = results["eval"]["dev"]
    assert metrics["pearson"] == pytest.approx(np.corrcoef(preds, gold)[0, 1], abs=1e-6)
    assert -1.0 <= metrics["spearmanr"] <= 1.0
    assert metrics["loss"] == pytest.approx(np.mean((preds - gold) ** 2), rel=1e-5)
    assert json.loads((out / "results.json").read_text())["eval"]["dev"]["pearson"] == metrics["pearson"]


def test_run_glue_errors(tmp_path, minilm_dir, shared_data):
    base = ["--init_checkpoint", str(minilm_dir), "--output_dir", str(tmp_path / "o"), "--do_eval"]
    with pytest.raises(SystemExit, match="unknown --task_name 'mrcp'"):
        run_glue.main(["--task_name", "mrcp", "--data_dir", str(tmp_path), *base])
    with pytest.raises(SystemExit, match=r"MRPC dev set not found: no .*dev\.tsv; is --data_dir"):
        run_glue.main(["--task_name", "mrpc", "--data_dir", str(tmp_path), *base])
    with pytest.raises(SystemExit, match="nothing to do"):
        run_glue.main(
            [
                "--task_name",
                "mrpc",
                "--data_dir",
                str(tmp_path),
                "--init_checkpoint",
                str(minilm_dir),
                "--output_dir",
                str(tmp_path),
            ]
        )
    with pytest.raises(SystemExit, match="--init_checkpoint .* not found"):
        run_glue.main(
            [
                "--task_name",
                "mrpc",
                "--data_dir",
                str(shared_data / "glue-mrpc"),
                "--init_checkpoint",
                str(tmp_path / "missing.pt"),
                "--output_dir",
                str(tmp_path),
                "--do_eval",
            ]
        )


def test_diverged_fine_tuning_is_an_error_not_a_result(tmp_path, minilm_dir, shared_data):
    """A learning rate of 1e30 makes the weights overflow after one update: the run stops with one line naming
    the step, and writes no results.json that would report a NaN model's accuracy (a GPU run once wrote
    acc 0.4908, every prediction one class, with exit status 0)."""
    out = tmp_path / "o"
    with pytest.raises(SystemExit, match=r"^run_glue\.py: error: the loss became non-finite at fine-tuning step \d+"):
        _run(
            out,
            minilm_dir,
            "sst-2",
            shared_data / "glue-sst2",
            "--do_train",
            "--do_eval",
            "--learning_rate",
            "1e30",
            "--warmup_proportion",
            "0",
            "--max_train_examples",
            "64",
            "--max_eval_examples",
            "16",
            "--max_steps",
            "4",
            "--train_batch_size",
            "16",
            "--skip_checkpoint",
        )
    assert not (out / "results.json").exists()


def test_nan_probe_finds_the_first_non_finite_micro_batch(tmp_path, minilm_dir, shared_data):
    """bench/nan_probe.py on the same diverging run: micro-batch 1 meets the real weights and is finite; its update
    of about lr = 1e30 per weight makes micro-batch 2 overflow, in fp32 as well, which the replays must show; the
    saved batch and weights load with weights_only=True and hold those enormous weights. A healthy run reports
    first_bad null after all its micro-batches."""
    glue = [
        "--task_name",
        "sst-2",
        "--data_dir",
        str(shared_data / "glue-sst2"),
        "--init_checkpoint",
        str(minilm_dir),
        "--do_lower_case",
        "--do_train",
        "--warmup_proportion",
        "0",
        "--max_train_examples",
        "64",
        "--train_batch_size",
        "16",
        "--max_steps",
        "3",
        "--skip_checkpoint",
        "--disable_progress_bar",
        "--seed",
        "2",
    ]
    report = nan_probe.main(
        ["--out", str(tmp_path / "bad"), "--", *glue, "--output_dir", str(tmp_path / "o1"), "--learning_rate", "1e30"]
    )
    assert report["first_bad"] == 2
    assert not math.isfinite(report["loss"]) and report["bad_parameters"]
    assert report["replays"]["as_run"]["loss_finite"] is False and report["replays"]["fp32"]["loss_finite"] is False
    assert not any(name.startswith("sdpa_") for name in report["replays"])  # GPU-only replays
    saved = torch.load(tmp_path / "bad" / "bad_batch.pt", weights_only=True)
    assert saved["batch"]["input_ids"].shape[0] == 16
    assert max(float(v.abs().max()) for v in saved["model"].values() if v.is_floating_point()) > 1e25
    healthy = nan_probe.main(
        ["--out", str(tmp_path / "good"), "--", *glue, "--output_dir", str(tmp_path / "o2"), "--learning_rate", "1e-4"]
    )
    assert healthy == {"first_bad": None, "micro_batches": 3}
    # an infinite learning rate: micro-batch 1 is finite, and it is the update after it that breaks the weights
    broken = nan_probe.main(
        ["--out", str(tmp_path / "update"), "--", *glue, "--output_dir", str(tmp_path / "o3"), "--learning_rate", "inf"]
    )
    assert broken["first_bad_update"] == 1 and broken["learning_rate"] == math.inf
    assert "bert.embeddings.word_embeddings.weight" in broken["bad_parameters"]
    assert all(math.isfinite(g) for g in broken["their_grad_max_abs"])
    saved = torch.load(tmp_path / "update" / "bad_update.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in saved["weights_before"])


# ----------------------------------------------------------------------------------------------------------------
# Launcher presets: every flag they produce is one run_glue.py knows, and the values parse


def _dry_run(repo_root: Path, preset: str | None, *positional: str) -> list[str]:
    script = "source scripts/configs/glue_config.sh && "
    args = f"$({preset})" if preset else " ".join(shlex.quote(a) for a in positional)
    out = subprocess.run(
        ["bash", "-c", script + f"bash scripts/run_glue.sh {args}"],
        cwd=repo_root,
        env={**os.environ, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(out.stdout.strip())


def test_launcher_presets_use_known_flags(repo_root):
    parser = run_glue.build_parser()
    known = {s for action in parser._actions for s in action.option_strings}
    presets = [
        "mrpc_dgx1-32g_8gpu_fp16",
        "sst-2_dgx1-32g_1gpu_fp32",
        "mnli_dgx2-32g_16gpu_fp16",
        "qqp_dgxa100-80g_8gpu_bf16",
        "cola_dgxh100-80g_4gpu_tf32",
        "sts-b_cpu_1gpu_bf16",
        "rte_cpu_1gpu_fp32",
    ]
    for preset in presets:
        cmd = _dry_run(repo_root, preset)
        script = next(i for i, a in enumerate(cmd) if a.endswith("run_glue.py"))
        flags = cmd[script + 1 :]
        assert {f.split("=")[0] for f in flags if f.startswith("--")} <= known, preset
        args = parser.parse_args(flags)  # values of the right types
        assert args.do_train and args.do_eval and args.task_name == preset.split("_")[0]
        if "16gpu" in preset:
            assert "--nproc_per_node=16" in cmd
        assert args.precision == preset.rsplit("_", 1)[1]
        if "dgx1-32g_1gpu_fp32" in preset:  # 1024 per step = 16 micro-batches of 64 (the fp32 capacity)
            assert (args.train_batch_size, args.gradient_accumulation_steps) == (1024, 16)
    # positional arguments in the original's order, mode "eval" on one process
    cmd = _dry_run(
        repo_root,
        None,
        "ckpt.pt",
        "glue/RTE",
        "vocab.txt",
        "cfg.json",
        "out",
        "rte",
        "8",
        "32",
        "2",
        "3e-5",
        "0.2",
        "2",
        "-1",
        "bf16",
        "7",
        "eval prediction",
    )
    args = parser.parse_args(cmd[cmd.index(next(a for a in cmd if a.endswith("run_glue.py"))) + 1 :])
    assert "--nproc_per_node=8" not in cmd and args.do_eval and args.do_predict and not args.do_train
    assert (args.init_checkpoint, args.data_dir, args.vocab_file, args.config_file, args.output_dir) == (
        "ckpt.pt",
        "glue/RTE",
        "vocab.txt",
        "cfg.json",
        "out",
    )
    assert args.eval_batch_size == 32 and args.seed == 7 and args.precision == "bf16" and args.task_name == "rte"
