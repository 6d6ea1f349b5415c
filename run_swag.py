"""Fine-tune and evaluate BERT on SWAG, multiple choice: which of four endings follows a context.

    python run_swag.py --data_dir swag/data --init_checkpoint ckpt_8601.pt --config_file bert_config.json \
        --vocab_file vocab.txt --do_lower_case --output_dir results/SWAG --do_train --do_eval --precision auto
    torchrun --nproc_per_node=8 run_swag.py ...        (DistributedDataParallel, one process per GPU)

--data_dir holds SWAG's train.csv and val.csv (and test.csv for `--do_predict --predict_split test`) as released
in github.com/rowanz/swagaf (tasks/swag.py reads them). --init_checkpoint takes what run_glue.py takes: a
ckpt_<step>.pt, an NVIDIA checkpoint, a Hugging Face directory (then --config_file and --vocab_file default to
the ones inside it), or the model.pt / hf_model/ this script wrote.

The model is BertForMultipleChoice (modeling.py): each ending is scored from the pooled output of its own
[CLS] sent1 [SEP] sent2 ending [SEP] sequence, and the scores of an example's endings go through a softmax; the
metric is accuracy. The run is the fine-tuning recipe's (finetuning/recipe.py: BertAdam, linear warm-up and decay,
gradient accumulation, DDP, fp16 loss scaling / bf16 autocast, the length-sorted prediction loop), fed batches of
examples padded to [batch, choices, longest sequence]; this file is the SWAG task alone (its flags are
finetuning_config.SwagConfig).
--train_batch_size and --eval_batch_size count examples (each is 4 sequences).

Outputs in --output_dir:
    results.json       accuracy and loss on val, training loss/throughput (examples/s), eval latency percentiles
                       (the FINAL record of it is also printed on stdout as JSON)
    predictions.json   (--do_predict) example id -> {"label": index of the chosen ending, "probabilities": [...]}
    model.pt           (--do_train) {"model": tensors under Hugging Face names, "config", "task": "swag",
                       "num_choices"}; loads with checkpoint_io.from_pretrained(BertForMultipleChoice, ...)
    hf_model/          (--do_train) the same model as a transformers directory (BertForMultipleChoice)
    dllogger.json      JSON-lines log (--json-summary to move it)
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from bert_recipe.finetuning import recipe
from bert_recipe.finetuning.config import SwagConfig
from bert_recipe.io import cli, flags
from bert_recipe.prediction import predict
from bert_recipe.tasks.swag import accuracy, encode_examples, get_examples
from bert_recipe.training import dist_env
from modeling import BertForMultipleChoice

# ----------------------------------------------------------------------------------------------------------------
# Arguments (finetuning_config.SwagConfig)


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(SwagConfig, "run_swag.py", __doc__)


def parse_args(argv: list[str] | None = None) -> SwagConfig:
    """The configuration (a SwagConfig), its rules checked."""
    return flags.parse(SwagConfig, "run_swag.py", __doc__, argv)


# ----------------------------------------------------------------------------------------------------------------
# Batches: [B, C, S], padded to the longest choice of the batch


def collate(items) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids, attention_mask [B, C, S_max] (S_max: the batch's longest choice), and labels [B]
    when the examples have labels; items: recipe.EncodedDataset's ([(input_ids [L_j], token_type_ids [L_j]) per
    choice j], label or None)."""
    choices = len(items[0][0])
    batch = predict.pad_sequences([choice for example, _ in items for choice in example], (len(items), choices))
    if items[0][1] is not None:
        batch["labels"] = torch.tensor(np.stack([label for _, label in items]))
    return batch


# ----------------------------------------------------------------------------------------------------------------
# The task


class SwagTask(recipe.Task):
    """SWAG for the fine-tuning recipe: each example's endings scored by BertForMultipleChoice; accuracy."""

    prog = "run_swag.py"
    name = "swag"
    model_class = BertForMultipleChoice
    head_description = "multiple-choice classifier"
    unit = "examples"

    def read(self) -> tuple[list, dict[str, recipe.EvalSet]]:
        data, run = self.cfg.data, self.cfg.run
        train = get_examples(data.data_dir, "train")[: data.max_train_examples] if run.do_train else []
        sets = {}
        if run.do_eval or (run.do_predict and data.predict_split == "val"):
            sets["val"] = recipe.EvalSet(get_examples(data.data_dir, "val")[: data.max_eval_examples])
        if run.do_predict and data.predict_split == "test":
            sets["test"] = recipe.EvalSet(
                get_examples(data.data_dir, "test")[: data.max_eval_examples], unlabelled=True
            )
        for name, examples in {"train": train, **{name: s.examples for name, s in sets.items()}}.items():
            if (name != "train" or run.do_train) and not examples:
                raise cli.InputError(f"SWAG {name} set in {data.data_dir} has no examples")
        return train, sets

    def encode(self, examples, tokenizer, env, log, training: bool) -> recipe.EncodedDataset:
        max_seq_length = self.cfg.model.max_seq_length
        encoded = encode_examples(examples, tokenizer, max_seq_length)
        if training:
            log(
                f"SWAG train: {len(encoded)} examples x {encoded.num_choices} choices, longest choice "
                f"{encoded.lengths.mean():.1f} tokens on average, {encoded.truncated} choices truncated to "
                f"{max_seq_length}"
            )
        return recipe.EncodedDataset(encoded)

    collate = staticmethod(collate)

    def score(self, name, eval_set, dataset, outputs, log) -> tuple[dict | None, dict[str, dict]]:
        """Accuracy and loss on a labelled set (--do_eval); predictions.json (--do_predict, --predict_split's set):
        example id -> {"label": the chosen ending, "probabilities": the softmax over the endings}."""
        run, labels, examples = self.cfg.run, dataset.labels, eval_set.examples
        logits = np.stack(outputs)  # [N, C]
        preds = logits.argmax(-1)
        predictions = {}
        if run.do_predict and name == self.cfg.data.predict_split:
            probs = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
            predictions["predictions.json"] = {
                e.guid: {"label": int(p), "probabilities": [round(float(x), 6) for x in prob]}
                for e, p, prob in zip(examples, preds, probs)
            }
        if not (run.do_eval and labels is not None):
            return None, predictions
        loss = float(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels)))
        metrics = {"acc": accuracy(preds, labels), "loss": loss, "examples": len(examples)}
        log(
            f"SWAG {name}: accuracy {metrics['acc']:.4f}, loss {loss:.4f} ({len(examples)} examples, "
            f"chance {1 / dataset.encoded.num_choices:.4f})"
        )
        return metrics, predictions

    def saved_fields(self, steps: int, dataset) -> dict:
        return {"task": self.name, "num_choices": dataset.encoded.num_choices}  # the training set's


# ----------------------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> dict:
    """The results, also in results.json; bad input is one line on stderr (recipe.main)."""
    return recipe.main(SwagTask, parse_args, argv)


if __name__ == "__main__":
    dist_env.exit_script(main)  # a multi-process run's end: see exit_script
