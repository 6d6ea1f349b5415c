"""inference.py: sliding windows over long contexts, JSON output, classification with a GLUE checkpoint, bad input.

References: a model whose logits the test controls (it points at one chosen token, wherever it is), the tokens of
the context written out by the test, and transformers' BertForSequenceClassification on the same directory.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch
from helpers import help_of
from torch import nn

import inference
from bert_recipe.io.checkpoint_io import export_state_dict, save_hf_directory
from bert_recipe.io.triton_scripts import load_triton_script
from bert_recipe.prediction import predict
from bert_recipe.prediction.items import read_items
from bert_recipe.tasks import squad, squad_answers
from modeling import BertConfig, BertForQuestionAnswering, BertForSequenceClassification
from tokenization import BertTokenizer

TINY = dict(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)


@pytest.fixture(scope="module")
def tokenizer(uncased_vocab) -> BertTokenizer:
    return BertTokenizer(uncased_vocab, do_lower_case=True)


@pytest.fixture(scope="module")
def long_context(tokenizer):
    """long_context(n_words, answer): n_words distinct whole-word tokens of the vocabulary (so the text of every
    window occurs once in the context), then a sentence with the answer."""
    words = [w for w in list(tokenizer.vocab)[2000:3000] if w.isalpha() and w not in ("madagascar", "lagos")]

    def make(n_words: int, answer: str) -> str:
        assert n_words <= len(words)
        return " ".join(words[:n_words]) + f" until it reaches {answer} at last."

    return make


class PointingModel(nn.Module):
    """A stand-in QA model: start and end logits 8 at every `target` token, 0 elsewhere; [CLS] gets `null`."""

    def __init__(self, target: int, null: float = 0.0):
        super().__init__()
        self.target, self.null = target, null
        self.dummy = nn.Parameter(torch.zeros(()))  # gives the module a device
        self.windows = []  # (input_ids, token_type_ids) of every window it saw

    def forward(self, input_ids, token_type_ids, attention_mask):
        self.windows.extend(zip(input_ids.tolist(), token_type_ids.tolist()))
        logits = (input_ids == self.target).float() * 8.0
        logits[:, 0] = self.null
        return logits, logits.clone()


def test_long_context_is_covered_by_windows_and_answer_in_last_window_found(tokenizer, long_context):
    context = long_context(400, "Madagascar")  # ~410 tokens, far beyond one 64-token window
    target = tokenizer.vocab["madagascar"]
    model = PointingModel(target)
    items = [{"id": "q1", "question": "Where does the river go?", "context": context}]
    settings = squad_answers.QASettings(max_seq_length=64, doc_stride=24, max_query_length=16, n_best_size=5)
    out = predict.answer_questions(model, tokenizer, items, settings, predict.Runtime(batch_size=4))
    assert out[0]["id"] == "q1" and out[0]["answer"] == "Madagascar"
    assert out[0]["probability"] > 0.99 and out[0]["nbest"][0]["text"] == "Madagascar"
    json.dumps(out)  # JSON-ready

    # The windows the model saw cover every token of the context, in order, and only the last holds the answer.
    doc_ids = tokenizer.encode(context)
    question_len = len(tokenizer.tokenize(items[0]["question"]))
    seen = set()
    for ids, types in model.windows:
        doc_part = [t for t, s in zip(ids, types) if s == 1 and t != 0][:-1]  # segment 1 without the final [SEP]
        start = next(i for i in range(len(doc_ids)) if doc_ids[i : i + len(doc_part)] == doc_part)
        seen.update(range(start, start + len(doc_part)))
        assert (
            len(ids) <= 64 and ids[0] == tokenizer.vocab["[CLS]"] and ids[question_len + 1] == tokenizer.vocab["[SEP]"]
        )
    assert seen == set(range(len(doc_ids))) and len(model.windows) > 10
    assert [target in ids for ids, _ in model.windows] == [False] * (len(model.windows) - 1) + [True]


def test_null_answer_for_v2_models(tokenizer, long_context):
    context = long_context(50, "Madagascar")
    model = PointingModel(tokenizer.vocab["madagascar"], null=20.0)  # [CLS] beats every span: no answer
    item = [{"question": "Where?", "context": context}]
    settings = squad_answers.QASettings(
        max_seq_length=48, doc_stride=16, max_query_length=8, version_2_with_negative=True
    )
    out = predict.answer_questions(model, tokenizer, item, settings)
    assert out[0]["answer"] == "" and out[0]["null_score_diff"] > 0 and out[0]["id"] == "0"
    out = predict.answer_questions(model, tokenizer, item, dataclasses.replace(settings, version_2_with_negative=False))
    assert out[0]["answer"] == "Madagascar"


def test_windows_match_the_feature_builder(tokenizer, long_context):
    """The same features as tasks.squad builds for training/evaluation (the Triton client reuses them)."""
    items = [{"id": "a", "question": "Where does it go?", "context": long_context(120, "Lagos")}]
    examples = squad.examples_from_qa_pairs(items)
    features = squad.convert_examples_to_features(examples, tokenizer, 64, 24, 16, is_training=False)
    covered = set()
    for f in features:
        covered.update(orig for pos, orig in f.token_to_orig_map.items())
    assert covered == set(range(len(examples[0].doc_tokens)))
    model = PointingModel(tokenizer.vocab["lagos"])
    settings = squad_answers.QASettings(max_seq_length=64, doc_stride=24, max_query_length=16)
    predict.answer_questions(model, tokenizer, items, settings)
    assert [ids[: sum(1 for t in ids if t)] for ids, _ in model.windows] == [
        f.input_ids[: len(f.tokens)] for f in features
    ]


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory, uncased_vocab):
    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(**TINY))
    path = tmp_path_factory.mktemp("qa") / "hf_model"
    save_hf_directory(model, path, uncased_vocab)
    return path


def test_cli_question_and_context_prints_json(qa_dir, capsys, tmp_path, long_context):
    context = long_context(300, "Madagascar")
    out = inference.main(
        [
            "--init_checkpoint",
            str(qa_dir),
            "--question",
            "Where does the river go?",
            "--context",
            context,
            "--max_seq_length",
            "64",
            "--max_query_length",
            "16",
            "--doc_stride",
            "24",
            "--n_best_size",
            "3",
            "--output_file",
            str(tmp_path / "answers.json"),
            "--bf16",
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "answers.json").read_text())
    assert printed[0]["answer"] in context and len(printed[0]["nbest"]) == 3
    assert printed[0]["answer"] == out[0]["answer"]


def test_default_precision_is_fp32_on_every_cpu(qa_dir, capsys, long_context, cpu_bf16):
    """inference.py only reads a model: auto is fp32 whether or not the CPU decides for bf16 in training (cpu_bf16),
    and gives the explicit fp32 run's scores; bf16 runs only when named."""
    context = long_context(120, "Madagascar")
    argv = [
        "--init_checkpoint",
        str(qa_dir),
        "--question",
        "Where does the river go?",
        "--context",
        context,
        "--max_seq_length",
        "64",
        "--max_query_length",
        "16",
        "--doc_stride",
        "24",
        "--n_best_size",
        "3",
    ]
    default = inference.main(argv)
    assert "inference.py: precision fp32 (auto: fp32 because this command only reads a model" in capsys.readouterr().err
    assert default == inference.main(argv + ["--precision", "fp32"])
    named = inference.main(argv + ["--bf16"])
    assert "inference.py: precision bf16 (asked for bf16)" in capsys.readouterr().err
    assert named[0]["nbest"][0]["start_logit"] != default[0]["nbest"][0]["start_logit"]  # bf16 really ran


def test_cli_input_file_json_lines_and_squad(qa_dir, capsys, tmp_path, shared_data):
    lines = [
        {"id": "x", "question": "Who?", "context": "Alice met Bob."},
        {"id": "y", "question": "What?", "context": "A cat sat on the mat."},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    inference.main(["--init_checkpoint", str(qa_dir), "--input_file", str(path), "--no_cuda"])
    printed = json.loads(capsys.readouterr().out)
    assert [p["id"] for p in printed] == ["x", "y"]
    assert all(p["answer"] in item["context"] for p, item in zip(printed, lines))
    inference.main(
        [
            "--init_checkpoint",
            str(qa_dir),
            "--input_file",
            str(shared_data / "hf-test-fixtures/SQUAD/dev-v2.0.json"),
            "--version_2_with_negative",
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    assert len(printed) == 14 and all("null_score_diff" in p for p in printed)


@pytest.mark.parametrize("layout", ["pt", "hf"])
def test_classification_mode_prints_labels(layout, tmp_path, capsys, uncased_vocab):
    """A GLUE model as run_glue.py saves it: model.pt with "labels", or hf_model/ with id2label."""
    torch.manual_seed(1)
    model = BertForSequenceClassification(BertConfig(**TINY), num_labels=3).eval()
    labels = ["entailment", "neutral", "contradiction"]
    if layout == "pt":
        path = tmp_path / "model.pt"
        torch.save(
            {"model": export_state_dict(model), "config": model.config.to_dict(), "num_labels": 3, "labels": labels},
            path,
        )
        (tmp_path / "vocab.txt").write_bytes(uncased_vocab.read_bytes())
    else:
        path = tmp_path / "hf_model"
        save_hf_directory(model, path, uncased_vocab)
        config = json.loads((path / "config.json").read_text())
        config["id2label"] = {str(i): name for i, name in enumerate(labels)}
        (path / "config.json").write_text(json.dumps(config))
    pairs = [("A man is playing a guitar.", "Someone plays music."), ("The sky is green.", None)]
    argv = ["--mode", "classify", "--init_checkpoint", str(path)]
    inference.main(argv + ["--text_a", pairs[0][0], "--text_b", pairs[0][1]])
    first = json.loads(capsys.readouterr().out)[0]
    items = tmp_path / "items.json"
    items.write_text(json.dumps([{"id": "p", "text_a": a, "text_b": b} for a, b in pairs]))
    inference.main(argv + ["--input_file", str(items)])
    printed = json.loads(capsys.readouterr().out)
    assert printed[0]["probabilities"] == first["probabilities"]

    # Independent reference: transformers' model on the same weights and the same token ids.
    from transformers.models.bert.modeling_bert import BertForSequenceClassification as HFBertForSequenceClassification

    hf_dir = tmp_path / "reference"
    save_hf_directory(model, hf_dir)
    hf = HFBertForSequenceClassification.from_pretrained(hf_dir).eval()
    tok = BertTokenizer(uncased_vocab, do_lower_case=True)
    for record, (a, b) in zip(printed, pairs):
        ids = [101, *tok.encode(a), 102] + ([*tok.encode(b), 102] if b else [])
        types = [0] * (len(tok.encode(a)) + 2) + [1] * (len(ids) - len(tok.encode(a)) - 2)
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0]
        expected = torch.softmax(logits, -1)
        assert record["label"] == labels[int(expected.argmax())]
        got = torch.tensor([record["probabilities"][name] for name in labels])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_model_files_are_found_and_checked_as_the_fine_tuning_scripts_do(tmp_path, capsys, uncased_vocab):
    """run_glue.py's output folder (model.pt, with the vocabulary only in hf_model/) needs no --vocab_file; a
    vocabulary larger than the model's embedding table is refused in one line before any forward pass."""
    torch.manual_seed(3)
    model = BertForSequenceClassification(BertConfig(**TINY), num_labels=2).eval()
    torch.save(
        {"model": export_state_dict(model), "config": model.config.to_dict(), "num_labels": 2, "labels": ["no", "yes"]},
        tmp_path / "model.pt",
    )
    save_hf_directory(model, tmp_path / "hf_model", uncased_vocab)
    text = "The cat sat on the mat."
    printed = inference.main(
        ["--mode", "classify", "--init_checkpoint", str(tmp_path / "model.pt"), "--text_a", text, "--no_cuda"]
    )
    capsys.readouterr()
    tok = BertTokenizer(uncased_vocab, do_lower_case=True)
    with torch.no_grad():  # the reference: the model itself on ids the test writes out
        logits = model(torch.tensor([[101, *tok.encode(text), 102]]))[0][0]
    expected = torch.softmax(logits, -1)
    assert printed[0]["label"] == ["no", "yes"][int(expected.argmax())]
    torch.testing.assert_close(
        torch.tensor([printed[0]["probabilities"][k] for k in ("no", "yes")]), expected, atol=1e-5, rtol=1e-4
    )

    small = BertForSequenceClassification(BertConfig(**{**TINY, "vocab_size": 100}), num_labels=2)
    save_hf_directory(small, tmp_path / "small", uncased_vocab)
    with pytest.raises(SystemExit) as e:
        inference.main(["--mode", "classify", "--init_checkpoint", str(tmp_path / "small"), "--text_a", text])
    lines = str(e.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("inference.py: error: --vocab_file "), lines
    assert f"has {len(tok.vocab)} tokens but the model only 100" in lines[0]


def test_help_lists_the_modes():
    out = help_of(inference.main)
    for flag in (
        "--mode",
        "--question",
        "--context",
        "--input_file",
        "--doc_stride",
        "--version_2_with_negative",
        "--text_a",
        "--bf16",
    ):
        assert flag in out


def test_bad_input_one_line_errors(qa_dir, tmp_path, minilm_dir):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"question": "Who?", "context": ')
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('[{"question": "Qui?",\n "context": "Ren\u00e9e."}]'.encode("latin-1"))
    offset = latin1.read_bytes().index(b"\xe9")
    cases = [
        (["--init_checkpoint", str(qa_dir), "--input_file", str(bad)], "is not JSON"),
        (["--init_checkpoint", str(qa_dir), "--input_file", str(tmp_path / "none.json")], "not found"),
        (["--init_checkpoint", str(tmp_path / "missing")], "not found"),
        (["--init_checkpoint", str(qa_dir), "--question", "Who?"], "--context"),
        (["--init_checkpoint", str(minilm_dir), "--question", "Who?", "--context", "Bob."], "no qa_outputs head"),
        (["--init_checkpoint", str(qa_dir), "--mode", "classify", "--text_a", "Hi."], "no classifier head"),
        (["--init_checkpoint", str(qa_dir), "--question", "Who?", "--context", "  "], "--context is empty"),
        (["--init_checkpoint", str(qa_dir), "--question", "", "--context", "Bob."], "--question is empty"),
        (["--init_checkpoint", str(qa_dir), "--mode", "classify", "--text_a", ""], "--text_a is empty"),
        (
            ["--init_checkpoint", str(qa_dir), "--mode", "classify", "--text_a", "Hi.", "--text_b", " "],
            "--text_b is empty",
        ),
        (
            ["--init_checkpoint", str(qa_dir), "--input_file", str(latin1)],
            f"--input_file: input file {latin1} is not UTF-8: byte 0xe9 at offset {offset} (line 2)",
        ),
        (
            ["--init_checkpoint", str(qa_dir), "--max_windows", "-1", "--question", "Who?", "--context", "Bob."],
            "--max_windows must be >= 0",
        ),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            inference.main(argv)
        assert str(e.value).startswith("inference.py: error: "), str(e.value)
        assert message in str(e.value) and "\n" not in str(e.value), (argv, str(e.value))
    bad.write_text(json.dumps([{"question": "Who?"}]))
    with pytest.raises(SystemExit) as e:
        inference.main(["--init_checkpoint", str(qa_dir), "--input_file", str(bad)])
    assert "item 0 needs string 'question' and 'context'" in str(e.value)


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails the test: the input checks must refuse before any model work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(inference, "load_model", refuse)


def test_inputs_are_checked_before_the_model_is_loaded(qa_dir, tmp_path, no_model):
    """Non-UTF-8 text, over-long text and an unusable --output_file are refused in one line before any work."""
    qa = ["--init_checkpoint", str(qa_dir)]
    surrogate = "Ren\udce9e"  # how Python receives the argument bytes b"Ren\xe9e" (PEP 383)
    items = tmp_path / "items.json"
    items.write_text(
        json.dumps([{"question": "Who?", "context": "Bob."}, {"question": "Who?", "context": "Bob \ud800."}])
    )  # a JSON lone surrogate
    (tmp_path / "a_file").write_text("x")
    cases = [
        (
            qa + ["--question", "Who?", "--context", surrogate],
            "--context is not UTF-8 text (byte 0xe9 at offset 3: invalid continuation byte)",
        ),
        (qa + ["--question", surrogate, "--context", "Bob."], "--question is not UTF-8 text (byte 0xe9 at offset 3"),
        (qa + ["--mode", "classify", "--text_a", "Hi.", "--text_b", surrogate], "--text_b is not UTF-8 text"),
        (
            qa + ["--input_file", str(items)],
            f"item 1 of --input_file {items}: the context is not UTF-8 text (lone surrogate U+D800 at character 4)",
        ),
        (
            qa + ["--question", "Who?", "--context", "word " * 20_001],
            "--context has 100,005 characters, over the limit max_context_chars=100,000; raise it with "
            "--max_context_chars (0 = no limit)",
        ),
        (
            qa + ["--question", "Who?", "--context", "Bob and Alice.", "--max_context_chars", "10"],
            "--context has 14 characters, over the limit max_context_chars=10",
        ),
        (
            qa + ["--question", "Who? " * 401, "--context", "Bob."],
            "--question has 2,005 characters, over the limit max_question_chars=2,000; raise it with "
            "--max_question_chars",
        ),
        (
            qa + ["--mode", "classify", "--text_a", "Hi. " * 30, "--max_context_chars", "100"],
            "--text_a has 120 characters, over the limit max_context_chars=100",
        ),
        (
            qa + ["--question", "Who?", "--context", "Bob.", "--output_file", str(tmp_path)],
            f"--output_file {tmp_path} is a folder: name a file",
        ),
        (
            qa + ["--question", "Who?", "--context", "Bob.", "--output_file", str(tmp_path / "no" / "out.json")],
            f"--output_file {tmp_path / 'no' / 'out.json'}: {tmp_path / 'no'} does not exist",
        ),
        (
            qa + ["--question", "Who?", "--context", "Bob.", "--output_file", str(tmp_path / "a_file" / "out.json")],
            f"{tmp_path / 'a_file'} is not a folder",
        ),
        (
            qa + ["--question", "Who?", "--context", "Bob.", "--output_file", "/proc/out.json"],
            "--output_file /proc/out.json: cannot write in /proc",
        ),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            inference.main(argv)
        assert str(e.value).startswith("inference.py: error: "), str(e.value)
        assert message in str(e.value) and "\n" not in str(e.value), (argv[2:], str(e.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "items.json"]  # no probe file left behind


def test_max_windows_refuses_before_any_forward_pass(tokenizer, long_context, qa_dir):
    context = long_context(400, "Madagascar")  # ~17 windows of 64 tokens at stride 24
    model = PointingModel(tokenizer.vocab["madagascar"])
    items = [
        {"id": "short", "question": "Who?", "context": "Bob."},
        {"id": "long", "question": "Where does the river go?", "context": context},
    ]
    settings = squad_answers.QASettings(max_seq_length=64, doc_stride=24, max_query_length=16)
    with pytest.raises(
        ValueError,
        match=r"item 1 \(id 'long', context of 2,\d{3} characters at max_seq_length 64, "
        r"doc_stride 24\) needs \d+ windows, over the limit max_windows=5",
    ):
        predict.answer_questions(model, tokenizer, items, settings, max_windows=5)
    assert model.windows == []
    out = predict.answer_questions(model, tokenizer, items, settings, max_windows=100)
    assert out[1]["answer"] == "Madagascar" and len(model.windows) > 5

    with pytest.raises(SystemExit) as e:
        inference.main(
            [
                "--init_checkpoint",
                str(qa_dir),
                "--question",
                "Where?",
                "--context",
                context,
                "--max_seq_length",
                "64",
                "--doc_stride",
                "24",
                "--max_query_length",
                "16",
                "--max_windows",
                "5",
            ]
        )
    assert "over the limit max_windows=5; raise it with --max_windows (0 = no limit)" in str(e.value)
    assert "\n" not in str(e.value)


def test_progress_bar_for_long_inputs(qa_dir, long_context, capsys):
    argv = [
        "--init_checkpoint",
        str(qa_dir),
        "--question",
        "Where does the river go?",
        "--context",
        long_context(400, "Madagascar"),
        "--max_seq_length",
        "64",
        "--doc_stride",
        "24",
        "--max_query_length",
        "16",
        "--batch_size",
        "2",
    ]
    inference.main(argv)
    captured = capsys.readouterr()
    assert re.search(r"inference\.py: 100%.*\b(\d+)/\1 \[", captured.err), captured.err
    inference.main(argv + ["--disable_progress_bar"])
    assert "%|" not in capsys.readouterr().err
    inference.main(argv[:4] + ["--context", "Bob went to Paris."])  # one window: no bar
    assert "%|" not in capsys.readouterr().err


def test_cli_errors_are_one_line_and_debug_shows_the_traceback(qa_dir, repo_root, tmp_path):
    """Run as a program: argument bytes that are not UTF-8 give one stderr line and exit 1; --debug the traceback."""
    base = [
        sys.executable,
        str(repo_root / "inference.py"),
        "--init_checkpoint",
        str(qa_dir),
        "--question",
        "Who?",
        "--no_cuda",
    ]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        base + [b"--context", b"Ren\xe9e is here.", "--output_file", str(tmp_path / "o.json")],
        capture_output=True,
        cwd=repo_root,
        env=env,
        timeout=120,
    )
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    assert done.returncode == 1 and done.stdout == b""
    assert lines == [
        "inference.py: error: --context is not UTF-8 text (byte 0xe9 at offset 3: invalid continuation byte)"
    ], lines
    assert not (tmp_path / "o.json").exists()
    debug = subprocess.run(
        base + ["--context", " ", "--debug"], capture_output=True, text=True, cwd=repo_root, env=env, timeout=120
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "--context is empty" in debug.stderr


def test_input_file_layouts_and_strict_errors_shared_with_the_triton_client(tmp_path, shared_data):
    """inference.py and triton/client.py read --input_file with one function (prediction.items.read_items): the
    same layouts accepted, the same one-line errors for what is not an item."""
    client = load_triton_script("client")
    item = {"id": "a", "question": "Who?", "context": "Bob."}
    path = tmp_path / "items.json"
    path.write_text(json.dumps([item, item]))
    assert read_items(path) == [item, item]
    path.write_text(json.dumps(item) + "\n\n  \n" + json.dumps(item) + "\n")  # JSON lines, blank lines skipped
    assert read_items(path) == [item, item]
    path.write_text(json.dumps(item))  # a single object is a one-line JSON-lines file
    assert read_items(path) == [item]
    squad_items = read_items(shared_data / "hf-test-fixtures/SQUAD/dev-v2.0.json")
    assert len(squad_items) == 14 and all(set(x) == {"id", "question", "context"} for x in squad_items)
    assert all(isinstance(x["id"], str) and isinstance(x["context"], str) for x in squad_items)

    paragraph = {"context": "Bob.", "qas": [{"id": "q", "question": "Who?"}]}
    cases = [  # (file content, what the error says)
        (
            {"data": [{"title": "t", "paragraphs": [paragraph, {"context": "Bob."}]}]},
            "data[0].paragraphs[1] needs a 'context' string and a 'qas' list",
        ),
        (
            {"data": [{"title": "t", "paragraphs": [{"context": "Bob.", "qas": [{"question": "Who?"}]}]}]},
            "data[0].paragraphs[0].qas[0] needs 'id' and 'question'",
        ),
        ({"data": [{"title": "t", "paragraphs": [{"context": "Bob.", "qas": []}]}]}, "holds no questions"),
        ([item, "Who?"], "item 1 is a JSON str, expected an object"),
        ([], "holds no items"),
        (3, "holds a JSON int, expected a list of objects"),
        ('{"id": "a"}\n{"id": ', "line 2 is not JSON"),
    ]
    for content, message in cases:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(ValueError, match=re.escape(message)):
            read_items(path)
        for main, argv in (
            (inference.main, ["--init_checkpoint", str(tmp_path), "--input_file", str(path)]),
            (client.main, ["--url", "127.0.0.1:1", "--input_file", str(path)]),
        ):
            with pytest.raises(SystemExit) as e:
                main(argv)
            assert message in str(e.value) and "\n" not in str(e.value), (content, str(e.value))
    with pytest.raises(FileNotFoundError, match="not found"):
        read_items(tmp_path / "missing.json")
