"""SQuAD: features, post-processing, evaluation and run_squad.py end to end.

References, all independent of tasks/squad.py's own output:
- the gold answers of real SQuAD files (Hugging Face's v2.0 fixtures, the v1.1 dev set): "oracle" logits placed at
  the gold tokens must come back as the gold text (EM 100) and impossible questions as "";
- the definition of max-context windows, written out here as a brute-force loop;
- the official evaluate-v1.1.py / evaluate-v2.0.py, run as subprocesses on imperfect predictions;
- transformers' BertForQuestionAnswering loading the exported Hugging Face directory.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import run_squad
from bert_recipe.io.checkpoint_io import from_pretrained
from bert_recipe.tasks import squad, squad_answers, squad_cache, squad_metrics
from bert_recipe.training import dist_env
from modeling import BertConfig, BertForQuestionAnswering
from tokenization import BertTokenizer

SAMPLE = "hf-test-fixtures/SQUAD/sample.json"  # Hugging Face's flat layout, v2.0 (6 of 14 impossible)
DEV_V2 = "hf-test-fixtures/SQUAD/dev-v2.0.json"  # the official nested layout, v2.0
DEV_V1 = "squad-v1.1-dev/dev-v1.1.json"


@pytest.fixture(scope="module")
def tokenizer(uncased_vocab) -> BertTokenizer:
    return BertTokenizer(uncased_vocab, do_lower_case=True)


@pytest.fixture(scope="module")
def dev_v1(shared_data) -> dict:
    with open(shared_data / DEV_V1, encoding="utf-8") as f:
        return json.load(f)


def oracle_results(features, peak: float = 10.0, noise: float = 0.0, seed: int = 0) -> dict:
    """Logits that peak at each window's training answer positions ((0, 0), i.e. [CLS], when the window lacks it)."""
    rng = np.random.default_rng(seed)
    results = {}
    for f in features:
        start = rng.normal(0.0, noise, len(f.tokens)) if noise else np.zeros(len(f.tokens))
        end = rng.normal(0.0, noise, len(f.tokens)) if noise else np.zeros(len(f.tokens))
        start[f.start_position] += peak
        end[f.end_position] += peak
        results[f.unique_id] = (start, end)
    return results


# --------------------------------------------------------------------------------------------------------------
# Reading and features


def test_both_layouts_read_the_same_questions(shared_data):
    flat = squad.read_squad_examples(shared_data / SAMPLE, is_training=True, version_2_with_negative=True)
    nested = squad.read_squad_examples(shared_data / DEV_V2, is_training=True, version_2_with_negative=True)
    assert [e.qas_id for e in flat] == [e.qas_id for e in nested]
    assert [e.is_impossible for e in flat] == [e.is_impossible for e in nested]
    assert sum(e.is_impossible for e in flat) == 6
    for e in flat:
        if not e.is_impossible:  # the word span holds the annotated text
            assert e.orig_answer_text in " ".join(e.doc_tokens[e.start_position : e.end_position + 1])


@pytest.mark.parametrize("path", [SAMPLE, DEV_V2])
@pytest.mark.parametrize("max_seq_length,doc_stride,max_query_length", [(384, 128, 64), (64, 16, 16), (40, 5, 12)])
def test_oracle_logits_round_trip_gold_answers(
    shared_data, tokenizer, path, max_seq_length, doc_stride, max_query_length
):
    examples = squad.read_squad_examples(shared_data / path, is_training=True, version_2_with_negative=True)
    features = squad.convert_examples_to_features(
        examples, tokenizer, max_seq_length, doc_stride, max_query_length, is_training=True
    )
    for f in features:
        assert len(f.input_ids) == len(f.input_mask) == len(f.segment_ids) == max_seq_length
        assert f.tokens[0] == "[CLS]" and f.tokens[-1] == "[SEP]"
        assert f.input_ids[: len(f.tokens)] == tokenizer.convert_tokens_to_ids(f.tokens)
        example = examples[f.example_index]
        if f.start_position:  # the window's answer tokens are exactly the answer's own WordPiece tokens
            assert f.tokens[f.start_position : f.end_position + 1] == tokenizer.tokenize(example.orig_answer_text)
        else:
            assert f.end_position == 0
    predictions, nbest, null_odds = squad_answers.get_predictions(
        examples,
        features,
        oracle_results(features),
        n_best_size=20,
        max_answer_length=30,
        do_lower_case=True,
        version_2_with_negative=True,
        null_score_diff_threshold=0.0,
    )
    for e in examples:
        assert predictions[e.qas_id] == ("" if e.is_impossible else e.orig_answer_text), e.qas_id
        assert (null_odds[e.qas_id] > 0) == e.is_impossible  # each example's own null score decides
        assert abs(sum(x["probability"] for x in nbest[e.qas_id]) - 1) < 1e-9
    scores = squad_metrics.evaluate_v2(squad.read_gold_answers(shared_data / path), predictions, null_odds)
    assert scores["exact"] == scores["f1"] == 100.0 and scores["total"] == 14

    if max_seq_length < 384:  # the small windows really split the documents and their answers
        windows_with_answer = {}
        for f in features:
            windows_with_answer.setdefault(f.example_index, []).append(f.start_position > 0)
        answerable = [i for i, e in enumerate(examples) if not e.is_impossible]
        assert any(sum(windows_with_answer[i]) >= 2 for i in answerable)  # answer inside two overlapping windows
        assert all(not all(windows_with_answer[i]) for i in answerable)  # and absent from others: (0, 0) there


def test_v1_dev_oracle_round_trip(shared_data, tokenizer, dev_v1):
    """Real v1.1 articles: every answer that some window holds as exactly its own WordPiece tokens (not a piece
    of a longer word, such as "8" in "20-18") and that fits max_answer_length comes back as its text."""
    data = {"version": "1.1", "data": [dict(a, paragraphs=a["paragraphs"][:12]) for a in dev_v1["data"][1:3]]}
    examples = squad.read_squad_examples(data, is_training=True, version_2_with_negative=False)
    assert len(examples) == sum(len(p["qas"]) for a in data["data"] for p in a["paragraphs"])
    features = squad.convert_examples_to_features(examples, tokenizer, 128, 32, 32, is_training=True)
    predictions, nbest, null_odds = squad_answers.get_predictions(
        examples, features, oracle_results(features), 20, 30, True, False, 0.0
    )
    assert null_odds == {}
    expressible = {
        examples[f.example_index].qas_id
        for f in features
        if f.start_position
        and f.tokens[f.start_position : f.end_position + 1]
        == tokenizer.tokenize(examples[f.example_index].orig_answer_text)
        and f.end_position - f.start_position < 30
    }
    assert len(expressible) > 0.9 * len(examples)
    gold = {e.qas_id: [e.orig_answer_text] for e in examples if e.qas_id in expressible}
    assert squad_metrics.evaluate_v1(gold, predictions)["exact_match"] == 100.0


def brute_force_windows(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    windows, start = [], 0
    while True:
        length = min(max_tokens, num_tokens - start)
        windows.append((start, length))
        if start + length >= num_tokens:
            return windows
        start += min(length, stride)


def brute_force_best_window(windows, position: int) -> int:
    """The definition: among windows holding the token, the highest min(left, right) + 0.01 * length; the first
    one wins a tie."""
    best, best_score = None, None
    for index, (start, length) in enumerate(windows):
        end = start + length - 1
        if not start <= position <= end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best, best_score = index, score
    return best


@pytest.mark.parametrize(
    "num_tokens,max_tokens,stride",
    [(1, 5, 2), (10, 4, 1), (37, 10, 3), (100, 30, 7), (64, 16, 16), (50, 20, 25), (0, 8, 4)],
)
def test_max_context_matches_brute_force(num_tokens, max_tokens, stride):
    windows = squad.doc_spans(num_tokens, max_tokens, stride)
    assert windows == brute_force_windows(num_tokens, max_tokens, stride)
    best = squad.max_context_windows(windows, num_tokens)
    assert best.tolist() == [brute_force_best_window(windows, p) for p in range(num_tokens)]


def test_feature_max_context_flags_match_brute_force(shared_data, tokenizer):
    """On real features: every document token is max-context in exactly the window the definition picks."""
    examples = squad.read_squad_examples(shared_data / DEV_V2, is_training=False, version_2_with_negative=True)
    max_seq_length, stride, max_query = 48, 7, 16
    features = squad.convert_examples_to_features(examples, tokenizer, max_seq_length, stride, max_query, False)
    for index, example in enumerate(examples):
        doc_tokens = [piece for word in example.doc_tokens for piece in tokenizer.tokenize(word)]
        query = tokenizer.tokenize(example.question_text)[:max_query]
        windows = brute_force_windows(len(doc_tokens), max_seq_length - len(query) - 3, stride)
        mine = [f for f in features if f.example_index == index]
        assert len(mine) == len(windows)
        for f, (start, length) in zip(mine, windows):
            offset = len(query) + 2
            assert f.tokens[offset : offset + length] == doc_tokens[start : start + length]
            for i in range(length):
                expected = brute_force_best_window(windows, start + i) == f.doc_span_index
                assert f.token_is_max_context[offset + i] == expected


def test_feature_cache_round_trip_and_invalidation(shared_data, tokenizer, tmp_path):
    path = shared_data / DEV_V2
    examples = squad.read_squad_examples(path, is_training=True, version_2_with_negative=True)
    settings = squad_answers.QASettings(
        max_seq_length=64, doc_stride=16, max_query_length=16, version_2_with_negative=True
    )
    args = (path, examples, tokenizer, settings, True, tmp_path)
    built, how = squad_cache.load_or_build_features(*args)
    assert how.startswith("built, cached in")
    cached, how = squad_cache.load_or_build_features(*args)
    assert how.startswith("cache ")
    assert [vars(f) for f in cached] == [vars(f) for f in built]
    cache_file = Path(how.split(" ", 1)[1])
    with np.load(cache_file, allow_pickle=False) as z:  # plain arrays only
        assert all(z[k].dtype != object for k in z.files)
    # Another stride is another cache file; a damaged file is rebuilt, not trusted.
    _, how = squad_cache.load_or_build_features(
        path, examples, tokenizer, dataclasses.replace(settings, doc_stride=8), True, tmp_path
    )
    assert how.startswith("built, cached in") and Path(how.split(" in ", 1)[1]) != cache_file
    cache_file.write_bytes(b"not a zip file")
    rebuilt, how = squad_cache.load_or_build_features(*args)
    assert how.startswith("built") and [vars(f) for f in rebuilt] == [vars(f) for f in built]


def test_get_final_text_projects_onto_original_characters():
    # WordPiece normalises (lower case, accents, split punctuation); the answer must come back as written.
    assert squad_answers.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert squad_answers.get_final_text("1895", "(1895-1943).", True) == "1895"
    assert squad_answers.get_final_text("cafe", "Café,", True) == "Café"
    assert squad_answers.get_final_text("missing", "Steve Smith", True) == "Steve Smith"  # cannot align: the whole span


# --------------------------------------------------------------------------------------------------------------
# Evaluation against the official scripts


def run_official(script: Path, *args) -> dict:
    done = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def perturb(gold: dict[str, list[str]], seed: int) -> dict[str, str]:
    """Imperfect predictions: exact, a dropped word, an extra word, wrong text, "" (missing answer)."""
    rng = random.Random(seed)
    predictions = {}
    for qid, answers in gold.items():
        text = answers[0] if answers else "some made up answer"
        words = text.split()
        kind = rng.randrange(6)
        if kind == 1 and len(words) > 1:
            text = " ".join(words[1:])
        elif kind == 2:
            text = f"the {text} of it"
        elif kind == 3:
            text = "Denver Broncos"
        elif kind == 4:
            text = ""
        predictions[qid] = text
    return predictions


def test_v1_evaluation_equals_official_script(shared_data, dev_v1, tmp_path, tokenizer):
    data = {"version": "1.1", "data": dev_v1["data"][2:5]}
    data_file = tmp_path / "dev.json"
    data_file.write_text(json.dumps(data), encoding="utf-8")
    gold = squad.read_gold_answers(data_file)
    script = shared_data / "squad-eval-scripts" / "evaluate-v1.1.py"

    predictions = perturb(gold, seed=1)
    del predictions[next(iter(predictions))]  # a missing prediction scores 0
    (tmp_path / "pred.json").write_text(json.dumps(predictions), encoding="utf-8")
    ours = squad_metrics.evaluate_v1(gold, predictions)
    assert ours == run_official(script, data_file, tmp_path / "pred.json")
    assert 20 < ours["exact_match"] < 80 and ours["f1"] > ours["exact_match"]

    # Predictions from noisy logits through the whole post-processing.
    examples = squad.read_squad_examples(data_file, is_training=True, version_2_with_negative=False)
    features = squad.convert_examples_to_features(examples, tokenizer, 128, 48, 32, is_training=True)
    predictions, _, _ = squad_answers.get_predictions(
        examples, features, oracle_results(features, 3.0, 1.5), 20, 30, True, False, 0.0
    )
    (tmp_path / "pred.json").write_text(json.dumps(predictions), encoding="utf-8")
    ours = squad_metrics.evaluate_v1(gold, predictions)
    assert ours == run_official(script, data_file, tmp_path / "pred.json")
    assert 10 < ours["exact_match"] < 95


def test_v2_evaluation_equals_official_script(shared_data, tmp_path, tokenizer):
    data_file = shared_data / DEV_V2
    gold = squad.read_gold_answers(data_file)
    script = shared_data / "squad-eval-scripts" / "evaluate-v2.0.py"
    rng = random.Random(3)
    for seed in range(3):
        predictions = perturb(gold, seed)
        # na_probs with ties and values beyond the script's default threshold of 1.0
        null_odds = {qid: rng.choice([-2.0, -0.5, 0.0, 0.7, 1.5, 3.0]) for qid in gold}
        (tmp_path / "pred.json").write_text(json.dumps(predictions), encoding="utf-8")
        (tmp_path / "na.json").write_text(json.dumps(null_odds), encoding="utf-8")
        official = run_official(script, data_file, tmp_path / "pred.json", "--na-prob-file", tmp_path / "na.json")
        assert squad_metrics.evaluate_v2(gold, predictions, null_odds) == official
        assert set(official) >= {"HasAns_exact", "NoAns_f1", "best_exact_thresh", "best_f1"}
        official = run_official(script, data_file, tmp_path / "pred.json")
        assert squad_metrics.evaluate_v2(gold, predictions) == official

    examples = squad.read_squad_examples(data_file, is_training=True, version_2_with_negative=True)
    features = squad.convert_examples_to_features(examples, tokenizer, 96, 32, 32, is_training=True)
    predictions, _, null_odds = squad_answers.get_predictions(
        examples, features, oracle_results(features, 3.0, 2.0, seed=5), 20, 30, True, True, 0.0
    )
    (tmp_path / "pred.json").write_text(json.dumps(predictions), encoding="utf-8")
    (tmp_path / "na.json").write_text(json.dumps(null_odds), encoding="utf-8")
    ours = squad_metrics.evaluate_v2(gold, predictions, null_odds)
    assert ours == run_official(script, data_file, tmp_path / "pred.json", "--na-prob-file", tmp_path / "na.json")
    assert 0 < ours["exact"] < 100


# --------------------------------------------------------------------------------------------------------------
# run_squad.py


TINY_CONFIG = {
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
    "hidden_act": "gelu",
}


@pytest.fixture(scope="module")
def squad_subset(dev_v1, tmp_path_factory) -> Path:
    """Three paragraphs of each of the first two dev articles."""
    data = {"version": "1.1", "data": [dict(a, paragraphs=a["paragraphs"][:3]) for a in dev_v1["data"][:2]]}
    path = tmp_path_factory.mktemp("squad") / "subset-v1.1.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_run_squad_end_to_end(squad_subset, uncased_vocab, shared_data, tmp_path, capsys):
    from modeling import BertForQuestionAnswering

    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(TINY_CONFIG))
    out = tmp_path / "out"
    common = [
        "--vocab_file",
        str(uncased_vocab),
        "--do_lower_case",
        "--predict_file",
        str(squad_subset),
        "--max_seq_length",
        "96",
        "--doc_stride",
        "32",
        "--max_query_length",
        "24",
        "--predict_batch_size",
        "16",
        "--cache_dir",
        str(tmp_path / "cache"),
        "--disable_progress_bar",
    ]
    summary = run_squad.main(
        [
            "--config_file",
            str(config_file),
            "--train_file",
            str(squad_subset),
            "--do_train",
            "--do_eval",
            "--max_steps",
            "2",
            "--train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            "2",
            "--bf16",
            "--output_dir",
            str(out),
            "--eval_script",
            str(shared_data / "squad-eval-scripts" / "evaluate-v1.1.py"),
            *common,
        ]
    )
    assert summary["global_step"] == 2 and np.isfinite(summary["final_loss"])

    gold = squad.read_gold_answers(squad_subset)
    predictions = json.loads((out / "predictions.json").read_text())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert list(predictions) == list(gold) and set(nbest) == set(gold)
    assert all(abs(sum(e["probability"] for e in v) - 1) < 1e-6 for v in nbest.values())
    results = json.loads((out / "eval_results.json").read_text())
    assert results["eval"] == results["eval_script"]  # in-process = the official script on the same file
    assert summary["exact_match"] == results["eval"]["exact_match"]
    log = [json.loads(line) for line in (out / "dllogger.json").read_text().splitlines()]
    assert log[-1]["step"] == "FINAL" and any(r["step"] == 2 for r in log)

    # The checkpoint (weights_only) and the Hugging Face export hold the same model.
    state = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    assert state["global_step"] == 2 and state["config"]["hidden_size"] == 32
    ours = from_pretrained(BertForQuestionAnswering, out / "model.pt", log=None).eval()
    from transformers.models.bert.modeling_bert import BertForQuestionAnswering as HFBertForQuestionAnswering

    hf = HFBertForQuestionAnswering.from_pretrained(out / "hf_model").eval()
    ids = torch.randint(1000, 30000, (2, 40))
    types = torch.cat([torch.zeros(2, 15), torch.ones(2, 25)], 1).long()
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    with torch.no_grad():
        start, end = ours(ids, types, mask)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(start, ref.start_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, ref.end_logits, atol=1e-5, rtol=1e-5)

    # Predicting again from the saved checkpoint reads the cached features and gives the same answers.
    capsys.readouterr()
    again = tmp_path / "again"
    run_squad.main(["--init_checkpoint", str(out / "model.pt"), "--do_predict", "--output_dir", str(again), *common])
    assert "(cache " in capsys.readouterr().err
    assert json.loads((again / "predictions.json").read_text()) == predictions


def test_run_squad_v2_writes_null_odds(shared_data, uncased_vocab, tmp_path):

    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(TINY_CONFIG))
    run_squad.main(
        [
            "--config_file",
            str(config_file),
            "--vocab_file",
            str(uncased_vocab),
            "--do_lower_case",
            "--predict_file",
            str(shared_data / DEV_V2),
            "--do_eval",
            "--version_2_with_negative",
            "--max_seq_length",
            "96",
            "--doc_stride",
            "32",
            "--max_query_length",
            "24",
            "--skip_cache",
            "--output_dir",
            str(tmp_path),
            "--disable_progress_bar",
            "--eval_script",
            str(shared_data / "squad-eval-scripts" / "evaluate-v2.0.py"),
        ]
    )
    null_odds = json.loads((tmp_path / "null_odds.json").read_text())
    assert set(null_odds) == set(squad.read_gold_answers(shared_data / DEV_V2))
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["eval"] == results["eval_script"]


def test_length_grouped_batches_cover_every_window_once():

    lengths = np.random.default_rng(0).integers(20, 384, size=1001)
    ranks = [run_squad.length_grouped_batches(lengths, 8, seed=1, epoch=0, rank=r, world_size=2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])
    seen = [i for batches in ranks for batch in batches for i in batch]
    assert len(seen) == 1002 and set(seen) == set(range(1001))  # one window wrapped round to even the shards
    # Within a batch lengths are close (sorted groups): far less padding than random batches.
    waste = np.mean([max(lengths[b]) * len(b) - sum(lengths[b]) for b in ranks[0]])
    random_waste = np.mean([max(lengths[b]) * len(b) - sum(lengths[b]) for b in np.array_split(np.arange(1001), 125)])
    assert waste < 0.2 * random_waste
    assert ranks[0] != run_squad.length_grouped_batches(lengths, 8, seed=1, epoch=1, rank=0, world_size=2)


def test_torchrun_two_processes_match_one_process(squad_subset, uncased_vocab, tmp_path, repo_root):
    """DDP over 2 CPU processes (gloo) with 4 windows each per step = 1 process with 8 windows per step: every step
    sees the same 8 windows (process r takes every 2nd window of the shuffle), so without dropout the weights
    after 3 steps agree."""
    import os

    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(dict(TINY_CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))
    common = [
        "--config_file",
        str(config_file),
        "--vocab_file",
        str(uncased_vocab),
        "--do_lower_case",
        "--train_file",
        str(squad_subset),
        "--do_train",
        "--max_steps",
        "3",
        "--max_seq_length",
        "96",
        "--doc_stride",
        "32",
        "--max_query_length",
        "24",
        "--cache_dir",
        str(tmp_path / "cache"),
        "--disable_progress_bar",
        "--learning_rate",
        "1e-3",
        "--seed",
        "5",
        "--precision",
        "fp32",
    ]  # an fp32-tolerance comparison: never bf16, whatever auto would pick here
    run_squad.main(common + ["--train_batch_size", "8", "--output_dir", str(tmp_path / "one")])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "run_squad.py",
            *common,
            "--train_batch_size",
            "4",
            "--output_dir",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    one = torch.load(tmp_path / "one" / "model.pt", weights_only=True)["model"]
    two = torch.load(tmp_path / "two" / "model.pt", weights_only=True)["model"]
    dist_env.set_seed(5)  # the initial weights both runs started from
    initial = BertForQuestionAnswering(BertConfig.from_json_file(config_file)).state_dict()
    assert not torch.allclose(one["qa_outputs.weight"], initial["qa_outputs.weight"])  # 3 steps really trained
    for key in one:
        torch.testing.assert_close(two[key], one[key], atol=2e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--do_predict"], "--predict_file"),
        (["--do_train"], "--train_file"),
        (["--do_predict", "--predict_file", "/nonexistent/dev.json"], "/nonexistent/dev.json not found"),
        ([], "nothing to do"),
    ],
)
def test_run_squad_bad_arguments(argv, message, uncased_vocab, tmp_path):

    base = ["--output_dir", str(tmp_path), "--config_file", str(uncased_vocab)]
    with pytest.raises(SystemExit) as e:
        run_squad.main(base + argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_run_squad_malformed_json_fails_in_one_line(uncased_vocab, tmp_path):
    bad = tmp_path / "dev.json"
    bad.write_text('{"data": [ {"paragraphs": ')
    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(TINY_CONFIG))

    with pytest.raises(SystemExit) as exc:  # main's one-line error: what the process prints on stderr, exit 1
        run_squad.main(
            [
                "--config_file",
                str(config_file),
                "--vocab_file",
                str(uncased_vocab),
                "--do_predict",
                "--predict_file",
                str(bad),
                "--max_seq_length",
                "96",
                "--max_query_length",
                "24",
                "--output_dir",
                str(tmp_path / "out"),
                "--disable_progress_bar",
            ]
        )
    message = str(exc.value.code)
    assert message.startswith("run_squad.py: error: ") and "\n" not in message
    assert str(bad) in message and "not valid JSON" in message


# --------------------------------------------------------------------------------------------------------------
# Launcher and presets


def test_presets_produce_commands_run_squad_accepts(repo_root):
    import shlex

    script = (
        "source scripts/configs/squad_config.sh && for p in $(squad_presets); do "
        'echo "$p"; DRY_RUN=1 bash scripts/run_squad.sh $($p) || exit 1; done'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=repo_root, check=True)
    lines = done.stdout.strip().splitlines()
    presets, commands = lines[0::2], lines[1::2]
    assert {"dgx1_8gpu_fp16", "dgx2_16gpu_fp16", "dgxa100_8gpu_tf32", "dgxh100_8gpu_bf16", "cpu_1gpu_bf16"} <= set(
        presets
    )
    parser = run_squad.build_parser()
    for preset, command in zip(presets, commands):
        argv = shlex.split(command)
        script_at = next(i for i, a in enumerate(argv) if a.endswith("run_squad.py"))
        args = parser.parse_args(argv[script_at + 1 :])  # argparse exits on any flag it does not know
        assert args.do_train and args.do_eval and args.num_train_epochs == 2.0, preset
        assert ("--nproc_per_node=8" in command) == ("_8gpu" in preset), preset
    # One preset through the launcher's own defaults: NVIDIA's 13 positional arguments, in order.
    done = subprocess.run(
        [
            "bash",
            "scripts/run_squad.sh",
            "ckpt.pt",
            "1.5",
            "12",
            "4e-5",
            "bf16",
            "1",
            "7",
            "/sq",
            "/v.txt",
            "/out",
            "prediction",
            "/c.json",
            "10",
        ],
        capture_output=True,
        text=True,
        cwd=repo_root,
        env={"DRY_RUN": "1", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    args = parser.parse_args(shlex.split(done.stdout)[2:])
    assert (
        args.init_checkpoint,
        args.predict_batch_size,
        args.seed,
        args.predict_file,
        args.vocab_file,
        args.output_dir,
        args.config_file,
        args.precision,
        args.do_train,
        args.do_eval,
    ) == ("ckpt.pt", 12, 7, "/sq/dev-v1.1.json", "/v.txt", "/out", "/c.json", "bf16", False, False)
