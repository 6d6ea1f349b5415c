"""The fine-tuning recipe (finetuning/recipe.py) against loops written out here by hand.

Each test runs a script's main() (run_glue.py on real MRPC pairs from the real MiniLM weights, run_squad.py on real
SQuAD questions with a tiny random model), then repeats the same run with a plain loop: the seed, the fresh head,
the shuffled micro-batches padded by hand, the loss averaged over an accumulation group, BertAdam and the linear
warm-up stepped once per group; then prediction over the same length-sorted batches. Dropout is off, so the
trained weights, the predictions and the scores must be the same to the bit: the recipe adds nothing to the
arithmetic of a fine-tuning run, whatever task supplies the parts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import run_glue
import run_squad
from bert_recipe.finetuning import recipe
from bert_recipe.finetuning.config import FinetuneConfig, FinetuneModel, FinetuneRun
from bert_recipe.io.checkpoint_io import export_state_dict, from_pretrained
from bert_recipe.prediction import predict
from bert_recipe.tasks import squad, squad_answers, squad_metrics
from bert_recipe.tasks.glue import compute_metrics, encode_examples, get_dev_examples, get_task, get_train_examples
from bert_recipe.training import dist_env
from modeling import BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification
from optimization import BertAdam, param_groups_for_bert
from run_swag import collate as swag_collate
from schedulers import LinearWarmUpScheduler
from tokenization import BertTokenizer

pytestmark = pytest.mark.usefixtures("one_thread_for_the_module")

SEED, STEPS, BATCH, ACCUMULATION, LR = 3, 3, 8, 2, 1e-4


def padded(rows: list[list[int]]) -> torch.Tensor:
    """Rows of token ids (or token types) zero-padded to the longest, int64 [B, S]."""
    width = max(map(len, rows))
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)


def hand_trained(model: torch.nn.Module, micro_batches: list[dict]) -> None:
    """STEPS optimizer steps of ACCUMULATION micro-batches each: the loss of a group is the mean of its
    micro-batches' losses; BertAdam over the no-decay groups (clip 1.0), the linear warm-up over STEPS steps."""
    optimizer = BertAdam(param_groups_for_bert(model, 0.01), lr=LR, weight_decay=0.01, max_grad_norm=1.0)
    scheduler = LinearWarmUpScheduler(optimizer, warmup=0.1, total_steps=STEPS)
    model.train()
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        for batch in micro_batches[step * ACCUMULATION : (step + 1) * ACCUMULATION]:
            (model(**batch).loss / ACCUMULATION).backward()
        optimizer.step()
        scheduler.step()


def assert_same_weights(saved: Path, model: torch.nn.Module) -> None:
    recipe_weights = torch.load(saved, map_location="cpu", weights_only=True)["model"]
    mine = export_state_dict(model)
    assert recipe_weights.keys() == mine.keys()
    for key in mine:
        assert torch.equal(recipe_weights[key], mine[key]), key


def no_dropout_config(source: Path, target: Path) -> Path:
    config = json.loads(source.read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    target.write_text(json.dumps(config))
    return target


def test_glue_recipe_equals_a_hand_written_loop(tmp_path, shared_data, minilm_dir):
    data, out = shared_data / "glue-mrpc", tmp_path / "out"
    config = no_dropout_config(minilm_dir / "config.json", tmp_path / "config.json")
    results = run_glue.main(
        [
            "--task_name",
            "mrpc",
            "--data_dir",
            str(data),
            "--init_checkpoint",
            str(minilm_dir),
            "--config_file",
            str(config),
            "--do_lower_case",
            "--output_dir",
            str(out),
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--precision",
            "fp32",
            "--seed",
            str(SEED),
            "--max_train_examples",
            "32",
            "--max_eval_examples",
            "24",
            "--max_seq_length",
            "64",
            "--max_steps",
            str(STEPS),
            "--train_batch_size",
            str(BATCH),
            "--gradient_accumulation_steps",
            str(ACCUMULATION),
            "--learning_rate",
            str(LR),
            "--eval_batch_size",
            "8",
            "--disable_progress_bar",
        ]
    )

    task = get_task("mrpc")
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    train = encode_examples(get_train_examples(data, task)[:32], tokenizer, 64, task)
    dist_env.set_seed(SEED)  # the fresh classifier
    model = from_pretrained(BertForSequenceClassification, minilm_dir, config=str(config), log=None, num_labels=2)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(SEED)).tolist()  # RandomSampler's
    micro = BATCH // ACCUMULATION
    micro_batches = []
    for lo in range(0, STEPS * BATCH, micro):
        rows = [train.example(i) for i in order[lo : lo + micro]]
        micro_batches.append(
            {
                "input_ids": padded([ids.tolist() for ids, _ in rows]),
                "token_type_ids": padded([types.tolist() for _, types in rows]),
                "attention_mask": padded([[1] * len(ids) for ids, _ in rows]),
                "labels": torch.from_numpy(train.labels[order[lo : lo + micro]]),
            }
        )
    hand_trained(model, micro_batches)
    assert_same_weights(out / "model.pt", model)

    dev_examples = get_dev_examples(data, task)["dev"][:24]
    dev = encode_examples(dev_examples, tokenizer, 64, task)
    logits = np.zeros((len(dev), 2), dtype=np.float32)
    model.eval()
    with torch.no_grad():  # the same length-sorted batches of 8, longest first
        for index in np.array_split(np.argsort(-dev.lengths, kind="stable"), 3):
            rows = [dev.example(i) for i in index]
            logits[index] = model(
                padded([ids.tolist() for ids, _ in rows]),
                padded([types.tolist() for _, types in rows]),
                padded([[1] * len(ids) for ids, _ in rows]),
            ).logits.numpy()
    preds = logits.argmax(-1)
    predictions = json.loads((out / "predictions.json").read_text())
    assert predictions == {e.guid: task.labels[p] for e, p in zip(dev_examples, preds)}
    metrics = results["eval"]["dev"]
    for key, value in compute_metrics(task, preds, dev.labels).items():
        assert metrics[key] == value, key
    assert metrics["loss"] == float(
        torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(dev.labels))
    )
    assert results["train"]["steps"] == STEPS and results["train"]["examples"] == 32


def test_squad_recipe_equals_a_hand_written_loop(tmp_path, shared_data, uncased_vocab):
    dev = json.loads((shared_data / "squad-v1.1-dev" / "dev-v1.1.json").read_text())
    subset = tmp_path / "subset.json"
    subset.write_text(
        json.dumps({"version": "1.1", "data": [dict(a, paragraphs=a["paragraphs"][:2]) for a in dev["data"][:2]]})
    )
    config_file = tmp_path / "bert_config.json"
    BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ).to_json_file(config_file)
    out = tmp_path / "out"
    summary = run_squad.main(
        [
            "--config_file",
            str(config_file),
            "--vocab_file",
            str(uncased_vocab),
            "--do_lower_case",
            "--train_file",
            str(subset),
            "--predict_file",
            str(subset),
            "--do_train",
            "--do_eval",
            "--max_seq_length",
            "96",
            "--doc_stride",
            "32",
            "--max_query_length",
            "24",
            "--max_steps",
            str(STEPS),
            "--train_batch_size",
            str(BATCH),
            "--gradient_accumulation_steps",
            str(ACCUMULATION),
            "--learning_rate",
            str(LR),
            "--seed",
            str(SEED),
            "--predict_batch_size",
            "16",
            "--precision",
            "fp32",
            "--skip_cache",
            "--disable_progress_bar",
            "--output_dir",
            str(out),
        ]
    )

    tokenizer = BertTokenizer(uncased_vocab, do_lower_case=True)
    train = squad.convert_examples_to_features(
        squad.read_squad_examples(subset, True, False), tokenizer, 96, 32, 24, True
    )
    dist_env.set_seed(SEED)  # the random initial weights
    model = BertForQuestionAnswering(BertConfig.from_json_file(config_file))

    def window_batch(features: list[squad.InputFeatures]) -> dict[str, torch.Tensor]:
        n = [sum(f.input_mask) for f in features]
        return {
            "input_ids": padded([f.input_ids[:k] for f, k in zip(features, n)]),
            "token_type_ids": padded([f.segment_ids[:k] for f, k in zip(features, n)]),
            "attention_mask": padded([[1] * k for k in n]),
        }

    order = np.random.default_rng([SEED, 0]).permutation(len(train))  # run_squad.py's shuffle of epoch 0
    micro = BATCH // ACCUMULATION
    micro_batches = []
    for lo in range(0, STEPS * BATCH, micro):
        features = [train[i] for i in order[lo : lo + micro]]
        micro_batches.append(
            {
                **window_batch(features),
                "start_positions": torch.tensor([f.start_position for f in features]),
                "end_positions": torch.tensor([f.end_position for f in features]),
            }
        )
    hand_trained(model, micro_batches)
    assert_same_weights(out / "model.pt", model)

    examples = squad.read_squad_examples(subset, False, False)
    features = squad.convert_examples_to_features(examples, tokenizer, 96, 32, 24, False)
    lengths = np.array([sum(f.input_mask) for f in features])
    results = {}
    model.eval()
    with torch.no_grad():  # the same length-sorted batches of 16 windows, longest first
        order = np.argsort(-lengths, kind="stable")
        for lo in range(0, len(order), 16):
            index = order[lo : lo + 16]
            out_batch = model(**window_batch([features[i] for i in index]))
            for row, i in enumerate(index):
                results[features[i].unique_id] = squad_answers.RawResult(
                    features[i].unique_id,
                    out_batch.start_logits[row, : lengths[i]].numpy(),
                    out_batch.end_logits[row, : lengths[i]].numpy(),
                )
    predictions, nbest, _ = squad_answers.get_predictions(examples, features, results, 20, 30, True, False, 0.0)
    assert json.loads((out / "predictions.json").read_text()) == predictions
    assert json.loads((out / "nbest_predictions.json").read_text()) == json.loads(json.dumps(nbest))
    scores = squad_metrics.score_predictions(squad.read_gold_answers(subset), predictions, False, None)
    assert json.loads((out / "eval_results.json").read_text())["eval"] == scores
    assert (summary["exact_match"], summary["F1"], summary["global_step"]) == (
        scores["exact_match"],
        scores["f1"],
        STEPS,
    )


def test_one_batch_vocabulary():
    """Every task's batch holds the model's own argument names, so one loss serves them all."""
    glue = run_glue.collate(
        [((np.array([101, 7, 102]), np.array([0, 0, 0])), 1), ((np.array([101, 102]), np.array([0, 0])), 0)]
    )
    squad_batch = run_squad.collate([(np.array([101, 7, 102, 9, 102]), np.array([0, 0, 0, 1, 1]), (3, 3))])

    swag = swag_collate(
        [([(np.array([101, 102]), np.array([0, 0])), (np.array([101, 5, 102]), np.array([0, 0, 1]))], 1)]
    )
    for batch in (glue, squad_batch, swag):
        assert set(predict.INPUT_KEYS) <= set(batch)
    assert set(glue) - set(predict.INPUT_KEYS) == {"labels"} == set(swag) - set(predict.INPUT_KEYS)
    assert set(squad_batch) - set(predict.INPUT_KEYS) == {"start_positions", "end_positions"}
    assert glue["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert glue["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert swag["input_ids"].shape == (1, 2, 3) and swag["attention_mask"][0, 0].tolist() == [1, 1, 0]


@pytest.mark.parametrize("do_train", [False, True])
def test_a_fresh_task_head_is_warned_about_only_when_nothing_trains_it(tmp_path, do_train):
    """load_model reads the LoadReport of the checkpoint (not its log lines): a pre-training checkpoint has no
    classifier, so evaluating it without --do_train warns that the head is random; with --do_train it does not."""
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    source = BertForPreTraining(config)
    torch.save({"model": source.state_dict(), "config": config.to_dict()}, tmp_path / "ckpt_1.pt")
    cfg = FinetuneConfig(
        model=FinetuneModel(init_checkpoint=str(tmp_path / "ckpt_1.pt")), run=FinetuneRun(do_train=do_train)
    )

    class Classify(recipe.Task):
        model_class = BertForSequenceClassification

        def model_kwargs(self):
            return {"num_labels": 2}

    lines: list[str] = []
    model = recipe.load_model(Classify(cfg), lines.append)
    assert isinstance(model, BertForSequenceClassification)
    assert any("initialised fresh: classifier.weight, classifier.bias" in line for line in lines), lines
    warned = [line for line in lines if line.startswith("warning:") and "random head" in line]
    assert len(warned) == (0 if do_train else 1), lines
