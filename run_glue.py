"""Fine-tune and evaluate BERT on a GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI).

    python run_glue.py --task_name mrpc --data_dir glue_data/MRPC --init_checkpoint ckpt_8601.pt \
        --config_file bert_config.json --vocab_file vocab.txt --do_lower_case --output_dir results/MRPC \
        --do_train --do_eval --do_predict --bf16
    torchrun --nproc_per_node=8 run_glue.py ...        (DistributedDataParallel, one process per GPU)

--init_checkpoint takes a ckpt_<step>.pt of run_pretraining.py, an NVIDIA checkpoint, a Hugging Face directory
(then --config_file and --vocab_file default to the ones inside it), or the model.pt / hf_model/ this script
wrote (evaluate or predict with a fine-tuned model: --do_eval / --do_predict without --do_train).

The run itself (model files, precision, training, saving, the length-sorted prediction loop, results) is the
fine-tuning recipe's (finetuning/recipe.py); this file is the GLUE task: its examples, pair encoding and padding,
the classifier's outputs and GLUE's metrics (its flags are finetuning_config.GlueConfig).

Outputs in --output_dir:
    results.json       metrics per dev set, training loss/throughput, eval latency percentiles (p50/p90/p99 per
                       batch) and sequences/s; the FINAL record of it is also printed on stdout as JSON
    predictions.json   (--do_predict) example id -> label name (STS-B: the predicted score); `--predict_split
                       test` predicts GLUE's unlabeled test files instead of the dev set(s)
    model.pt           (--do_train) {"model": tensors under Hugging Face names, "config", "num_labels", "task",
                       "labels"}; loads with checkpoint_io.from_pretrained, or torch.load with
                       weights_only=True)
    hf_model/          (--do_train) the same model as a transformers directory (config.json with the label
                       names, model.safetensors, vocab.txt)
    dllogger.json      JSON-lines log (--json-summary to move it)

Differences from NVIDIA's run_glue.py, on purpose:
- dynamic padding: each batch is padded to its longest sequence, not to --max_seq_length (GLUE sentences are
  short: MRPC pairs average 53 tokens, SST-2 dev sentences 25); evaluation batches are built from length-sorted
  examples and the predictions put back in file order. On a (shared) 2-core CPU in bf16 this evaluated MRPC dev
  2.1x and SST-2 dev 3.2x faster than padding to 128 (bench/glue_acceptance.py --padding);
- the number of optimizer steps is ceil(epochs * ceil(batches / accumulation)) instead of
  int(examples / batch / accumulation) * epochs (which dropped the tail and ignored fractional epochs), a last
  partial accumulation group is averaged over its own size, and --max_steps stops after exactly max_steps steps
  (the original ran max_steps + 1);
- the learning-rate schedule is stepped after the optimizer and only for steps the fp16 GradScaler did not skip;
- MNLI is evaluated on both the matched and the mismatched dev sets; STS-B is trained as regression;
- no pickled feature cache (tokenising with the Rust fast path takes seconds) and checkpoints load with
  weights_only=True.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from bert_recipe.finetuning import recipe
from bert_recipe.finetuning.config import GlueConfig
from bert_recipe.io import cli, flags
from bert_recipe.prediction import predict
from bert_recipe.tasks.glue import (
    compute_metrics,
    encode_examples,
    get_dev_examples,
    get_task,
    get_test_examples,
    get_train_examples,
)
from bert_recipe.training import dist_env
from modeling import BertForSequenceClassification

# ----------------------------------------------------------------------------------------------------------------
# Arguments (finetuning_config.GlueConfig)


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(GlueConfig, "run_glue.py", __doc__)


def parse_args(argv: list[str] | None = None) -> GlueConfig:
    """The configuration (a GlueConfig), its rules checked."""
    return flags.parse(GlueConfig, "run_glue.py", __doc__, argv)


# ----------------------------------------------------------------------------------------------------------------
# Batches: dynamic padding


def collate(items) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids, attention_mask [B, S_max] (padded to the longest sequence of the batch), and
    labels [B] (int64 classes or float32 scores) when the examples have labels; items: recipe.EncodedDataset's
    ((input_ids [L], token_type_ids [L]), label or None)."""
    batch = predict.pad_sequences([sequence for sequence, _ in items], (len(items),))
    if items[0][1] is not None:
        batch["labels"] = torch.from_numpy(np.stack([label for _, label in items]))
    return batch


# ----------------------------------------------------------------------------------------------------------------
# The task


class GlueTask(recipe.Task):
    """A GLUE task for the fine-tuning recipe: the classifier (regression for STS-B) over [CLS] A [SEP] B [SEP]."""

    prog = "run_glue.py"
    model_class = BertForSequenceClassification

    def __init__(self, cfg):
        super().__init__(cfg)
        self.task = get_task(cfg.data.task_name)
        self.name = self.task.name

    def model_kwargs(self) -> dict:
        return {"num_labels": self.task.num_labels}

    def read(self) -> tuple[list, dict[str, recipe.EvalSet]]:
        data, run, task = self.cfg.data, self.cfg.run, self.task
        train = get_train_examples(data.data_dir, task)[: data.max_train_examples] if run.do_train else []
        needs_dev = run.do_eval or (run.do_predict and data.predict_split == "dev")
        dev_sets = get_dev_examples(data.data_dir, task) if needs_dev else {}
        sets = {name: recipe.EvalSet(examples[: data.max_eval_examples]) for name, examples in dev_sets.items()}
        if run.do_predict and data.predict_split == "test":
            test_sets = get_test_examples(data.data_dir, task)
            sets.update(
                {
                    name: recipe.EvalSet(examples[: data.max_eval_examples], unlabelled=True)
                    for name, examples in test_sets.items()
                }
            )
        for name, examples in {
            **({"train": train} if run.do_train else {}),
            **{name: s.examples for name, s in sets.items()},
        }.items():
            if not examples:
                raise cli.InputError(
                    f"{task.display_name} {name} set in {data.data_dir} has no examples (a header "
                    "row only?): check --data_dir"
                )
        return train, sets

    def encode(self, examples, tokenizer, env, log, training: bool) -> recipe.EncodedDataset:
        max_seq_length = self.cfg.model.max_seq_length
        encoded = encode_examples(examples, tokenizer, max_seq_length, self.task)
        if training:
            log(
                f"{self.task.display_name} train: {len(encoded)} examples, mean length {encoded.lengths.mean():.1f} "
                f"tokens, {encoded.truncated} truncated to {max_seq_length}"
            )
        return recipe.EncodedDataset(encoded)

    collate = staticmethod(collate)

    def score(self, name, eval_set, dataset, outputs, log) -> tuple[dict | None, dict[str, dict]]:
        """Class indices (argmax) or regression scores; GLUE's metrics and the loss on a dev set (--do_eval);
        predictions.json (--do_predict): example id -> label name (STS-B: the score) for --predict_split's sets."""
        run, task, examples = self.cfg.run, self.task, eval_set.examples
        logits = np.stack(outputs)  # [N, num_labels]
        preds = logits[:, 0] if task.is_regression else logits.argmax(-1)
        predictions = {}
        if run.do_predict and eval_set.unlabelled == (self.cfg.data.predict_split == "test"):
            names = [float(p) for p in preds] if task.is_regression else [task.labels[int(p)] for p in preds]
            predictions["predictions.json"] = dict(zip((e.guid for e in examples), names))
        if not (run.do_eval and not eval_set.unlabelled):
            return None, predictions
        labels = dataset.labels
        metrics = compute_metrics(task, preds, labels)
        metrics.update(loss=eval_loss(task.is_regression, logits, labels), examples=len(examples))
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        log(f"{task.display_name} {name}: {shown} ({len(examples)} examples)")
        return metrics, predictions

    def saved_fields(self, steps: int, dataset) -> dict:
        return {"num_labels": self.task.num_labels, "task": self.name, "labels": self.label_names()}

    def hf_config_fields(self) -> dict:
        labels = self.label_names()
        fields = {
            "id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)},
            "finetuning_task": self.name,
        }
        if self.task.is_regression:
            fields["problem_type"] = "regression"
        return fields

    def label_names(self) -> list[str]:
        return list(self.task.labels) if self.task.labels else ["score"]


def eval_loss(regression: bool, logits: np.ndarray, labels: np.ndarray) -> float:
    """The training loss on a dev set: mean squared error of the score, else cross-entropy over the classes."""
    logits_t, labels_t = torch.from_numpy(logits), torch.from_numpy(labels)
    if regression:
        return float(F.mse_loss(logits_t[:, 0], labels_t))
    return float(F.cross_entropy(logits_t, labels_t))


# ----------------------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> dict:
    """The results, also in results.json; bad input is one line on stderr (recipe.main)."""
    return recipe.main(GlueTask, parse_args, argv)


if __name__ == "__main__":
    dist_env.exit_script(main)  # a multi-process run's end: see exit_script
