"""SWAG: BertForMultipleChoice against transformers' (same weights, names that interchange), the csv reader on a file
written here in SWAG's layout, the choice encoding against transformers' tokenizer, a real fine-tune from the MiniLM
weights on a multiple-choice task built from WikiText-2 (the true next sentence among four), its outputs and its
Hugging Face export, and the launcher presets against run_swag.py's own flags."""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import run_swag
from bert_recipe.finetuning import recipe
from bert_recipe.io.checkpoint_io import from_pretrained, load_checkpoint_state
from bert_recipe.tasks.swag import SwagDataError, SwagExample, encode_examples, get_examples, read_swag_examples
from modeling import BertForMultipleChoice
from tokenization import BertTokenizer

HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"


pytestmark = pytest.mark.usefixtures("one_thread_on_a_busy_cpu")


# ----------------------------------------------------------------------------------------------------------------
# The model against transformers


def test_multiple_choice_matches_transformers(minilm_dir):
    """Same parameter names as transformers.BertForMultipleChoice (state dicts load both ways, strictly), and the
    same logits and loss on real choices of different lengths (padding inside the batch)."""
    from transformers import BertConfig as HFConfig
    from transformers import BertForMultipleChoice as HFMultipleChoice

    torch.manual_seed(0)
    ours = from_pretrained(BertForMultipleChoice, minilm_dir, log=None).eval()
    hf = HFMultipleChoice(HFConfig.from_pretrained(str(minilm_dir), attn_implementation="eager")).eval()
    assert set(ours.state_dict()) == set(hf.state_dict())
    hf.load_state_dict(ours.state_dict(), strict=True)  # ours -> transformers
    again = BertForMultipleChoice(ours.config).eval()  # transformers -> ours, through the checkpoint loader
    assert load_checkpoint_state(again, hf.state_dict()).lines() == []
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key

    example = SwagExample(
        "val-0",
        "A man is sitting on a roof.",
        "He",
        (
            "is using wrap to wrap a pair of skis.",
            "is ripping level tiles off.",
            "is holding a rubik's cube.",
            "starts pulling up roofing on a roof.",
        ),
        3,
    )
    other = SwagExample(
        "val-1",
        "A woman stands in a kitchen holding a bowl of batter and a long wooden spoon.",
        "She",
        ("stirs.", "puts the bowl in the oven and closes the door behind it.", "throws it.", "sings."),
        0,
    )
    encoded = encode_examples([example, other], BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True), 64)
    batch = run_swag.collate([recipe.EncodedDataset(encoded)[i] for i in range(2)])
    assert batch["input_ids"].shape[:2] == (2, 4) and (batch["attention_mask"] == 0).any()  # padded choices
    with torch.no_grad():
        loss, logits = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["labels"])
        ref = hf(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        )
    print(f"max abs logit diff vs transformers.BertForMultipleChoice: {(logits - ref.logits).abs().max():.2e}")
    assert logits.shape == (2, 4)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, ref.loss, atol=1e-5, rtol=1e-5)
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(ref.logits, batch["labels"]).item(), abs=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Reading and encoding


def test_swag_csv_parses_exactly(tmp_path):
    """SWAG's layout: unnamed index column, standard CSV quoting (commas, doubled quotes, a line break inside a field),
    CRLF line ends; test.csv without labels; one-line errors naming the file and line."""
    rows = [
        HEADER,
        '0,anetv_jkn6uvmqwh4,3416,"Members of the procession walk down the street holding small horn brass '
        'instruments. A drum line","Members of the procession walk down the street holding small horn brass '
        'instruments.",A drum line,gold,passes by walking down the street playing their instruments.,'
        'has heard approaching them.,"arrives and they\'re outside dancing and asleep.",'
        "turns the lead singer watches the performance.,0",
        '7,lsmdc3001_21_JUMP_STREET-422,17,"Someone, ""the boss"", waits. She","Someone, ""the boss"", waits.",She,'
        'gen,"smiles, then\nleaves.",nods.,runs off.,sits down on a café chair.,3',
    ]
    (tmp_path / "val.csv").write_bytes(("\r\n".join(rows) + "\r\n").encode("utf-8"))
    examples = get_examples(tmp_path, "val")
    assert examples == [
        SwagExample(
            "val-0",
            "Members of the procession walk down the street holding small horn brass instruments.",
            "A drum line",
            (
                "passes by walking down the street playing their instruments.",
                "has heard approaching them.",
                "arrives and they're outside dancing and asleep.",
                "turns the lead singer watches the performance.",
            ),
            0,
        ),
        SwagExample(
            "val-7",
            'Someone, "the boss", waits.',
            "She",
            ("smiles, then\nleaves.", "nods.", "runs off.", "sits down on a café chair."),
            3,
        ),
    ]

    test_header = HEADER.rsplit(",", 1)[0]
    (tmp_path / "test.csv").write_text(test_header + "\n" + rows[1].rsplit(",", 1)[0] + "\n", encoding="utf-8")
    (test,) = get_examples(tmp_path, "test")
    assert test.label is None and test.guid == "test-0" and test.endings == examples[0].endings

    (tmp_path / "train.csv").write_text(test_header + "\n" + rows[1].rsplit(",", 1)[0] + "\n", encoding="utf-8")
    with pytest.raises(SwagDataError, match=r"train.csv: no label column"):
        get_examples(tmp_path, "train")
    (tmp_path / "bad.csv").write_text(HEADER + "\n" + rows[1].rsplit(",", 1)[0] + ",4\n", encoding="utf-8")
    with pytest.raises(SwagDataError, match=r"bad.csv:2: label '4' is not an ending index 0..3"):
        read_swag_examples(tmp_path / "bad.csv")
    (tmp_path / "bad.csv").write_text("sent1,sent2,ending0\na,b,c\n", encoding="utf-8")
    with pytest.raises(SwagDataError, match=r"bad.csv: the header .* needs sent1, sent2 and ending0, ending1"):
        read_swag_examples(tmp_path / "bad.csv")
    with pytest.raises(SwagDataError, match=r"SWAG file .*nowhere.*train.csv not found; is --data_dir"):
        get_examples(tmp_path / "nowhere", "train")


def test_choice_encoding_matches_transformers(minilm_dir):
    """Choice j is transformers' encoding of the pair (sent1, sent2 + " " + ending_j); a long ending loses its tail
    (the longer part is cut first) and the length is the budget."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    example = SwagExample(
        "val-0",
        "The chef slices the onions thinly, then heats the pan.",
        "She",
        (
            "adds oil and waits.",
            "",
            "sings about Zoë's café.",
            "pours the whole bowl of batter, eggs, flour and milk into the pan and stirs it slowly.",
        ),
        0,
    )
    ours = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    encoded = encode_examples([example], ours, 128)
    for j, (ids, types) in enumerate(encoded.example(0)):
        ref = hf(example.context, f"{example.start_ending} {example.endings[j]}")
        assert ids.tolist() == ref["input_ids"] and types.tolist() == ref["token_type_ids"], j
    short = encode_examples([example], ours, 24)
    ids, types = short.example(0)[3]
    full_b = hf(f"{example.start_ending} {example.endings[3]}", add_special_tokens=False)["input_ids"]
    full_a = hf(example.context, add_special_tokens=False)["input_ids"]
    n_a = int(types.tolist().count(0)) - 2
    assert len(ids) == 24 and ids[1 : 1 + n_a].tolist() == full_a[:n_a]
    assert ids[2 + n_a : -1].tolist() == full_b[: len(ids) - n_a - 3] and abs(n_a - (len(ids) - n_a - 3)) <= 1
    assert short.truncated >= 1 and encoded.truncated == 0


# ----------------------------------------------------------------------------------------------------------------
# Learning: the true next sentence of a WikiText-2 paragraph among four (three from other articles)

WIKI_TRAIN, WIKI_EVAL = 128, 160
_SENTENCE_END = re.compile(r"(?<= [.?!]) ")


def _wikitext_pairs(path: Path) -> list[list[tuple[str, str]]]:
    """Per article, (sentence, next sentence) pairs of one paragraph, both 5-14 words (short: a fast test)."""
    articles: list[list[tuple[str, str]]] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if re.fullmatch(r"= [^=].* =", line):
            articles.append([])
        elif line and not line.startswith("=") and articles:
            words = [w for w in line.split() if w != "<unk>"]
            sentences = [s for s in _SENTENCE_END.split(" ".join(words).replace(" @-@ ", "-")) if s.strip()]
            articles[-1] += [
                (a, b)
                for a, b in zip(sentences, sentences[1:])
                if 5 <= len(a.split()) <= 14 and 5 <= len(b.split()) <= 14
            ]
    return [a for a in articles if a]


def _write_next_sentence_csv(path: Path, source: Path, n: int, seed: int) -> list[int]:
    """n examples in SWAG's layout: sent1 = a sentence, the endings = its true successor and three sentences of
    other articles, in random order. Returns the labels."""
    rng = random.Random(seed)
    articles = _wikitext_pairs(source)
    labels = []
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(HEADER.split(","))
        for i in range(n):
            k = rng.randrange(len(articles))
            context, truth = rng.choice(articles[k])
            others = [rng.choice(articles[j])[1] for j in rng.sample([j for j in range(len(articles)) if j != k], 3)]
            label = rng.randrange(4)
            endings = others[:label] + [truth] + others[label:]
            out.writerow([i, "wikitext-2", i, context, context, "", "gold", *endings, label])
            labels.append(label)
    return labels


@pytest.fixture(scope="module")
def swag_run(tmp_path_factory, shared_data, minilm_dir) -> tuple[Path, Path, dict]:
    """Fine-tune MiniLM on 128 WikiText-2 valid examples (16 steps of 8, seq 64, fp32), evaluate on 160 from the
    test split (other articles), predictions and the model written."""
    data, out = tmp_path_factory.mktemp("swag_data"), tmp_path_factory.mktemp("swag_out")
    _write_next_sentence_csv(data / "train.csv", shared_data / "wikitext-2" / "valid.txt", WIKI_TRAIN, seed=1)
    _write_next_sentence_csv(data / "val.csv", shared_data / "wikitext-2" / "test.txt", WIKI_EVAL, seed=2)
    results = run_swag.main(
        [
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
            "--max_seq_length",
            "64",
            "--train_batch_size",
            "8",
            "--learning_rate",
            "2e-4",
            "--num_train_epochs",
            "1",
            "--precision",
            "fp32",
            "--seed",
            "1",
            "--disable_progress_bar",
            "--log_freq",
            "4",
        ]
    )
    return data, out, results


def test_learns_next_sentence_from_wikitext(swag_run):
    data, out, results = swag_run
    accuracy = results["eval"]["val"]["acc"]
    print(
        f"WikiText-2 next sentence among 4: accuracy {accuracy:.4f} on {WIKI_EVAL} held-out examples "
        f"(chance 0.25), loss {results['eval']['val']['loss']:.4f} (ln 4 = {math.log(4):.4f})"
    )
    assert results["train"]["steps"] == WIKI_TRAIN // 8 and results["train"]["examples"] == WIKI_TRAIN
    assert accuracy >= 0.40, accuracy  # chance + 15 points: > 4 standard deviations of chance on 160 examples
    assert results["eval"]["val"]["loss"] < math.log(4)

    # predictions.json agrees with results.json and with the labels written above
    predictions = json.loads((out / "predictions.json").read_text())
    gold = [int(row["label"]) for row in csv.DictReader(open(data / "val.csv", encoding="utf-8"))]
    assert list(predictions) == [f"val-{i}" for i in range(WIKI_EVAL)]
    chosen = np.array([p["label"] for p in predictions.values()])
    assert results["eval"]["val"]["acc"] == pytest.approx(np.mean(chosen == np.array(gold)))
    for p in predictions.values():
        assert p["label"] == int(np.argmax(p["probabilities"])) and sum(p["probabilities"]) == pytest.approx(1, 1e-5)
    assert json.loads((out / "results.json").read_text())["eval"] == results["eval"]
    log = [json.loads(line) for line in (out / "dllogger.json").read_text().splitlines()]
    assert log[0]["step"] == "PARAMETER" and log[-1]["step"] == "FINAL" and "val:acc" in log[-1]["data"]


def test_saved_model_reloads_and_matches_transformers(swag_run, minilm_dir):
    """model.pt in our model and hf_model/ in transformers give the same logits; evaluating model.pt again
    reproduces the run's accuracy."""
    from transformers import BertForMultipleChoice as HFMultipleChoice

    data, out, results = swag_run
    saved = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    assert saved["task"] == "swag" and saved["num_choices"] == 4
    ours = from_pretrained(BertForMultipleChoice, out / "model.pt", log=None).eval()
    hf = HFMultipleChoice.from_pretrained(str(out / "hf_model"), attn_implementation="eager").eval()
    assert hf.config.architectures == ["BertForMultipleChoice"]
    examples = get_examples(data, "val")[:6]
    encoded = encode_examples(examples, BertTokenizer(out / "hf_model" / "vocab.txt", do_lower_case=True), 64)
    batch = run_swag.collate([recipe.EncodedDataset(encoded)[i] for i in range(len(examples))])
    with torch.no_grad():
        (logits,) = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        ref = hf(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        ).logits
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)

    again = run_swag.main(
        [
            "--data_dir",
            str(data),
            "--init_checkpoint",
            str(out / "model.pt"),
            "--do_lower_case",
            "--output_dir",
            str(out / "again"),
            "--do_eval",
            "--max_seq_length",
            "64",
            "--max_eval_examples",
            "40",
            "--precision",
            "fp32",
            "--disable_progress_bar",
        ]
    )
    predictions = json.loads((out / "predictions.json").read_text())
    gold = np.array([e.label for e in get_examples(data, "val")[:40]])
    first = np.array([p["label"] for p in list(predictions.values())[:40]])
    assert again["eval"]["val"]["acc"] == pytest.approx(np.mean(first == gold))


def test_run_swag_errors(tmp_path, minilm_dir):
    base = ["--init_checkpoint", str(minilm_dir), "--output_dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match="nothing to do"):
        run_swag.main(["--data_dir", str(tmp_path), *base])
    with pytest.raises(SystemExit, match=r"SWAG file .*val.csv not found; is --data_dir"):
        run_swag.main(["--data_dir", str(tmp_path), *base, "--do_eval"])
    with pytest.raises(SystemExit, match="--init_checkpoint .* not found"):
        run_swag.main(
            [
                "--data_dir",
                str(tmp_path),
                "--init_checkpoint",
                str(tmp_path / "none.pt"),
                "--output_dir",
                str(tmp_path),
                "--do_eval",
            ]
        )
    with pytest.raises(
        SystemExit, match="--train_batch_size 6 must be a positive multiple of --gradient_accumulation_steps 4"
    ):
        run_swag.main(
            [
                "--data_dir",
                str(tmp_path),
                *base,
                "--do_train",
                "--train_batch_size",
                "6",
                "--gradient_accumulation_steps",
                "4",
            ]
        )
    with pytest.raises(SystemExit) as e:
        run_swag.main(["--help"])
    assert e.value.code == 0


# ----------------------------------------------------------------------------------------------------------------
# Launcher presets: every flag they produce is one run_swag.py knows, and the values parse


def _dry_run(repo_root: Path, preset: str | None, *positional: str, env: dict | None = None) -> list[str]:
    script = "source scripts/configs/swag_config.sh && "
    args = f"$({preset})" if preset else " ".join(shlex.quote(a) for a in positional)
    out = subprocess.run(
        ["bash", "-c", script + f"bash scripts/run_swag.sh {args}"],
        cwd=repo_root,
        env={**os.environ, "DRY_RUN": "1", **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(out.stdout.strip())


def test_launcher_presets_use_known_flags(repo_root, minilm_dir):
    parser = run_swag.build_parser()
    known = {s for action in parser._actions for s in action.option_strings}
    listed = subprocess.run(
        ["bash", "-c", "source scripts/configs/swag_config.sh && swag_presets"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"cpu_1gpu_auto", "dgxa100-80g_8gpu_bf16", "dgx2-32g_16gpu_fp16"} <= set(listed)
    for preset in ("cpu_1gpu_auto", "dgxa100-80g_8gpu_bf16", "dgx1-32g_1gpu_fp32", "dgx2-32g_16gpu_fp16"):
        cmd = _dry_run(repo_root, preset)
        script = next(i for i, a in enumerate(cmd) if a.endswith("run_swag.py"))
        flags = cmd[script + 1 :]
        assert {f.split("=")[0] for f in flags if f.startswith("--")} <= known, preset
        args = parser.parse_args(flags)
        assert args.do_train and args.do_eval and args.precision == preset.rsplit("_", 1)[1]
        n = int(re.search(r"_(\d+)gpu_", preset).group(1))
        assert args.train_batch_size * n == 16 or (n == 16 and args.train_batch_size == 1)  # global batch 16
        assert (f"--nproc_per_node={n}" in cmd) == (n > 1)
        if preset.startswith("cpu"):
            assert args.init_checkpoint == str(minilm_dir) and args.vocab_file is None and args.config_file is None
    cmd = _dry_run(
        repo_root,
        None,
        "ckpt.pt",
        "swag",
        "vocab.txt",
        "cfg.json",
        "out",
        "8",
        "4",
        "2",
        "3e-5",
        "0.2",
        "2",
        "-1",
        "bf16",
        "7",
        "eval prediction",
    )
    args = parser.parse_args(cmd[cmd.index(next(a for a in cmd if a.endswith("run_swag.py"))) + 1 :])
    assert "--nproc_per_node=8" not in cmd and args.do_eval and args.do_predict and not args.do_train
    assert (args.init_checkpoint, args.data_dir, args.vocab_file, args.config_file, args.output_dir) == (
        "ckpt.pt",
        "swag",
        "vocab.txt",
        "cfg.json",
        "out",
    )
    assert args.eval_batch_size == 4 and args.seed == 7 and args.precision == "bf16"
    bad = subprocess.run(
        ["bash", "scripts/run_swag.sh", "", "", "", "", "", "2", "3", "2"],
        cwd=repo_root,
        env={**os.environ, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and bad.stderr.strip() == (
        "run_swag.sh: argument 7 (batch_size 3) must be divisible by argument 8 (gradient_accumulation_steps 2)"
    )
