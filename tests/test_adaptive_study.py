"""bench/adaptive_study.py: SST-2's text as pre-training documents, and the four-start study end to end at a tiny
size (three run_cpu_demo.sh runs; sixteen fine-tunings, four starts x two rates x two seeds, each run_glue.py
command run in this process by --glue_in_process, whose start-up would be most of their time; one linear probe)."""

from __future__ import annotations

import json
import statistics

import pytest
from helpers import no_training

from bench import adaptive_study, linear_probe, pretrain_study, results_page, scaling_study, stability

TINY_CONFIG = {
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
}


def test_sst2_sentences_become_documents_without_their_labels(tmp_path):
    folder = tmp_path / "glue-sst2"
    folder.mkdir()
    (folder / "train.tsv").write_text(
        "sentence\tlabel\nit 's a charming journey \t1\ndull \t0\n"
        "a gorgeous , witty film\t1\nnot worth the price\t0\nfine\t1\n"
    )
    stats = adaptive_study.sst2_documents(folder, tmp_path / "text.txt", per_doc=2)
    assert (tmp_path / "text.txt").read_text() == (
        "it 's a charming journey\ndull\n\na gorgeous , witty film\nnot worth the price\n\nfine\n\n"
    )
    assert stats == {"sentences": 5, "documents": 3, "words": 5 + 1 + 5 + 4 + 1}


@pytest.fixture(scope="module")
def tiny_adaptive(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("adaptive")
    (root / "tiny.json").write_text(json.dumps(TINY_CONFIG))
    lines = (shared_data / "wikitext-2" / "valid.txt").read_text().splitlines(keepends=True)
    (root / "wiki.txt").write_text("".join(lines[:300]))
    sst2 = root / "data" / "glue-sst2"
    sst2.mkdir(parents=True)
    for name, n in (("train.tsv", 241), ("dev.tsv", 41)):  # the header and 240 / 40 sentences
        real = (shared_data / "glue-sst2" / name).read_text().splitlines(keepends=True)
        (sst2 / name).write_text("".join(real[:n]))
    argv = [
        "--out",
        str(root / "study"),
        "--config",
        str(root / "tiny.json"),
        "--corpus",
        str(root / "wiki.txt"),
        "--vocab_size",
        "1000",
        "--wiki_steps",
        "3",
        "--task_steps",
        "2",
        "--task_dupe_factor",
        "1",
        "--doc_sentences",
        "4",
        "--phase2_steps",
        "1",
        "--batch",
        "4",
        "--seeds",
        "1,2",
        "--small_lr",
        "1e-4,1e-3",
        "--sst2_max_train_examples",
        "16",
        "--max_steps",
        "1",
        "--small_batch",
        "8",
        "--max_seq_length",
        "32",
        "--parallel",
        "1",
        "--data_root",
        str(root / "data"),
        "--glue_in_process",
    ]
    (root / "argv.json").write_text(json.dumps(argv))  # for the second call (test_second_call_reuses_everything)
    return root, adaptive_study.main(argv)


def test_four_starts_are_fine_tuned_and_probed(tiny_adaptive):
    root, report = tiny_adaptive
    study = root / "study"

    def phase1_params(arm):
        log = next((study / arm / "pretrain").glob("run_*/bert_cpu_demo.phase1.json"))
        return next(
            json.loads(line)["data"] for line in log.read_text().splitlines() if json.loads(line)["step"] == "PARAMETER"
        )

    wiki_ckpt = report["arms"]["wikipedia"]["checkpoint"]
    vocab = study / "wikipedia" / "pretrain" / "vocab.txt"
    # the SST-2 runs read SST-2's text with the Wikipedia run's vocabulary; one starts from its last checkpoint
    tapt, both = phase1_params("sst2-text"), phase1_params("wikipedia+sst2-text")
    assert tapt["vocab_file"] == both["vocab_file"] == str(vocab)
    assert tapt.get("init_checkpoint") is None and both["init_checkpoint"] == wiki_ckpt
    assert wiki_ckpt.endswith("ckpt_4.pt") and report["arms"]["sst2-text"]["checkpoint"].endswith("ckpt_3.pt")
    train_text = (study / "sst2-text" / "pretrain" / "text" / "train.txt").read_text()
    dev = [
        line.split("\t")[0].strip() for line in (root / "data" / "glue-sst2" / "dev.tsv").read_text().splitlines()[1:]
    ]
    assert "hide new secretions from the parental units" in train_text and not any(s in train_text for s in dev)
    assert (
        report["sst2_text"] == {"sentences": 240, "documents": 60, "words": report["sst2_text"]["words"]}
        and report["sst2_text"]["words"] > 240
    )
    # each arm's scores at each rate are its runs' own dev accuracies; the verdicts follow the written-out rule
    assert report["learning_rates"] == ["0.0001", "0.001"]
    folders = {
        "random": ("wikipedia", "random_sst2"),
        "wikipedia": ("wikipedia", "pretrained_sst2"),
        "sst2-text": ("sst2-text", "pretrained_sst2"),
        "wikipedia+sst2-text": ("wikipedia+sst2-text", "pretrained_sst2"),
    }

    def beats(a, b):
        difference = statistics.mean(a) - statistics.mean(b)
        spread = max(statistics.stdev(a), statistics.stdev(b))
        return {"difference": pytest.approx(difference), "spread": pytest.approx(spread), "beats": difference > spread}

    scores = {arm: {} for arm in folders}
    for arm, (run, folder) in folders.items():
        for lr in ("0.0001", "0.001"):
            results = [
                json.loads((study / run / f"lr{lr}_n16" / folder / f"seed_{s}" / "results.json").read_text())
                for s in (1, 2)
            ]
            runs = json.loads((study / run / f"lr{lr}_n16" / folder / "stability_sst-2.json").read_text())["runs"]
            assert [float(r["command"][r["command"].index("--learning_rate") + 1]) for r in runs] == [float(lr)] * 2
            scores[arm][lr] = [r["eval"]["dev"]["acc"] for r in results]
            assert report["arms"][arm]["sst2"][lr]["scores"] == scores[arm][lr]
        best = max(("0.0001", "0.001"), key=lambda lr: statistics.mean(scores[arm][lr]))
        assert report["arms"][arm]["best_lr"] == best
    init = json.loads(
        (study / "wikipedia+sst2-text" / "lr0.001_n16" / "pretrained_sst2" / "seed_1" / "results.json").read_text()
    )
    assert init["init_checkpoint"] == report["arms"]["wikipedia+sst2-text"]["checkpoint"]
    top = {arm: scores[arm][report["arms"][arm]["best_lr"]] for arm in folders}
    for arm in ("wikipedia", "sst2-text", "wikipedia+sst2-text"):
        v = report["arms"][arm]["against_random"]
        for lr in ("0.0001", "0.001"):
            assert v["same_lr"][lr] == beats(scores[arm][lr], scores["random"][lr])
        assert v["best"] == beats(top[arm], top["random"])
    assert report["pairs"]["wikipedia+sst2-text against sst2-text"] == beats(
        top["wikipedia+sst2-text"], top["sst2-text"]
    )
    probe = json.loads((study / "linear_probe.json").read_text())
    assert probe["train_examples"] == 240 and probe["dev_examples"] == 40
    for arm in folders:
        assert report["arms"][arm]["linear_probe"] == {
            k: probe["results"][arm][k]["dev_accuracy"] for k in ("cls", "mean")
        }
        assert probe["results"][arm]["checkpoint"] == report["arms"][arm]["checkpoint"]
    # fine-tuned on 16 labelled sentences, not the default 10,000: the folders and the report say so
    assert "| wikipedia+sst2-text |" in (study / "adaptive_study_n16.md").read_text()
    assert json.loads((study / "adaptive_study_n16.json").read_text())["finetuning"]["sst2_max_train_examples"] == 16


def test_second_call_reuses_everything(tiny_adaptive, monkeypatch):
    """The same command again trains nothing and probes nothing: the pre-trainings, fine-tunings and the probe
    are read back, and the report's numbers are the first call's."""
    root, first = tiny_adaptive
    no_training(monkeypatch, (pretrain_study, scaling_study), stability)
    monkeypatch.setattr(linear_probe, "main", lambda *a, **k: pytest.fail(f"the probe ran again: {a}"))
    again = adaptive_study.main(json.loads((root / "argv.json").read_text()))
    for arm in adaptive_study.ARMS:
        assert again["arms"][arm]["sst2"] == first["arms"][arm]["sst2"]
        assert again["arms"][arm]["linear_probe"] == first["arms"][arm]["linear_probe"]


def test_results_page_renders_the_study(tiny_adaptive, tmp_path):

    root, report = tiny_adaptive
    absent = results_page.main(["--studies", str(tmp_path / "none"), "--out", str(tmp_path / "absent.md")])
    assert "Not run: no --adaptive file given" in absent
    text = results_page.main(
        [
            "--studies",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "RESULTS.md"),
            "--adaptive",
            str(root / "study" / "adaptive_study_n16.json"),
        ]
    )
    section = text.split("## Task-adaptive pre-training: four starts for SST-2")[1]
    random_row = next(line for line in section.splitlines() if line.startswith("| random |"))
    for lr in ("0.0001", "0.001"):
        s = report["arms"]["random"]["sst2"][lr]
        assert f"{s['mean']:.4f} ± {s['std']:.4f}" in random_row


def test_help_and_nothing_at_import():
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, bench.adaptive_study; "
            "print(sorted(m for m in ('torch', 'h5py', 'matplotlib') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        cwd=adaptive_study.REPO,
        check=True,
    )
    assert out.stdout.strip() == "[]"
    with pytest.raises(SystemExit) as e:
        adaptive_study.main(["--help"])
    assert e.value.code == 0


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--small_lr", "fast"], ("--small_lr", "positive learning rates")),
        (["--small_lr", "0,1e-3"], ("--small_lr", "positive learning rates")),
        (["--data_root", "/nonexistent"], ("--data_root", "train.tsv not found")),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        adaptive_study.main(["--out", str(tmp_path / "study"), *argv])
    message = str(e.value.code)
    assert message.startswith("adaptive_study: error: ") and "\n" not in message
    assert all(w in message for w in words), message
    assert not (tmp_path / "study").exists()
