"""Fine-tune BERT on SQuAD v1.1 / v2.0, predict answers, and score them with the official algorithm.

    python run_squad.py --init_checkpoint ckpt_8601.pt --config_file bert_config.json --vocab_file vocab.txt \
        --do_lower_case --train_file train-v1.1.json --predict_file dev-v1.1.json --do_train --do_predict \
        --do_eval --output_dir results/SQuAD --bf16
    torchrun --nproc_per_node=8 run_squad.py ...       (DistributedDataParallel, one process per GPU)

--init_checkpoint takes a ckpt_<step>.pt of run_pretraining.py, an NVIDIA checkpoint, our model.pt, or a Hugging
Face directory (then --config_file and --vocab_file default to the ones inside it).

The run itself (model files, precision, training, saving, the length-sorted prediction loop, results) is the
fine-tuning recipe's (finetuning/recipe.py); this file is the SQuAD task: questions cut into windows (features cached),
their batches, the answer head's outputs turned into answers, and the official scores (its flags are
finetuning_config.SquadConfig).

Outputs in --output_dir:
    predictions.json        (--do_predict) question id -> answer text ("" = no answer, v2.0)
    nbest_predictions.json  (--do_predict) question id -> [{text, probability, start_logit, end_logit}, ...]
    null_odds.json          (--do_predict, v2.0) question id -> null score - best span score (the official
                            evaluate-v2.0.py reads it with --na-prob-file)
    eval_results.json       (--do_eval) exact match / F1 (v2.0: with the HasAns/NoAns breakdown and best
                            thresholds), and the --eval_script's own output when one is given
    model.pt                (--do_train) {"model": tensors under Hugging Face names, "config", "global_step"};
                            loads with torch.load(..., weights_only=True) and checkpoint_io.from_pretrained
    hf_model/               (--do_train) the same model as a transformers directory (config.json,
                            model.safetensors, vocab.txt)
    results.json            the run's record (training, scores, prediction latency), as the other fine-tuning scripts
    dllogger.json           JSON-lines log (--json-summary to move it)
Its summary (NVIDIA's keys: e2e_train_time, training_sequences_per_second, final_loss, e2e_inference_time,
inference_sequences_per_second, exact_match, F1) is the FINAL log line, printed on stdout as JSON, and main's value.

Features are cached in --cache_dir (default: beside the input file when that folder is writable, else
<output_dir>/cache) as .npz files keyed by the input file's hash, the vocabulary's hash and every length.

Differences from NVIDIA's run_squad.py, on purpose:
- v2.0: the null answer is decided per example, from the smallest [CLS] score over that example's own windows (the
  original appended the null logits of the last example it processed, `null_vals[ex.qas_id]` after its loop, to
  every question, so each question's null score came from another example);
- start/end candidates are ranked among valid document positions only, so invalid top-k positions (question,
  padding) no longer crowd out valid spans;
- dynamic padding: every batch is cut to its longest sequence; prediction runs over length-sorted windows;
  --group_by_length does the same for training batches (shuffled within groups of 50 batches);
- the number of optimizer steps is ceil(epochs * ceil(batches / accumulation)); a last partial accumulation group
  is averaged over its own size; --max_steps stops after exactly max_steps steps; the learning-rate schedule is
  stepped after the optimizer and only for steps the fp16 GradScaler did not skip;
- no pickled cache, checkpoints load with weights_only=True, evaluation runs in-process (no subprocess needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from bert_recipe.finetuning import recipe
from bert_recipe.finetuning.config import SquadConfig
from bert_recipe.io import atomic_io, cli, flags
from bert_recipe.prediction import predict
from bert_recipe.tasks import squad, squad_answers, squad_cache, squad_metrics
from bert_recipe.training import dist_env, meter
from modeling import BertForQuestionAnswering

# ----------------------------------------------------------------------------------------------------------------
# Arguments (finetuning_config.SquadConfig)


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(SquadConfig, "run_squad.py", __doc__)


def parse_args(argv: list[str] | None = None) -> SquadConfig:
    """The configuration (a SquadConfig); --do_eval scores the predictions, so it implies --do_predict: a new
    configuration, the parsed one unchanged."""
    cfg = flags.parse(SquadConfig, "run_squad.py", __doc__, argv)
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, do_predict=cfg.run.do_predict or cfg.run.do_eval))


# ----------------------------------------------------------------------------------------------------------------
# Windows: each question is cut into windows of its document ([CLS] question [SEP] part of the document [SEP])


def cache_dir_for(cfg, input_file: str) -> Path | None:
    if cfg.data.skip_cache:
        return None
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir)
    beside = Path(input_file).resolve().parent
    return beside if os.access(beside, os.W_OK) else Path(cfg.data.output_dir) / "cache"


def build_features(
    cfg, input_file: str, examples, tokenizer, is_training: bool, env: dist_env.DistEnv, log, collective: bool
) -> list[squad.InputFeatures]:
    """Features (windows) from the cache or built. `collective`: every process calls this; then process 0 builds
    and caches the features first and the others read the cache (one tokenization instead of one per process)."""
    cache_dir = cache_dir_for(cfg, input_file)
    sync = collective and env.distributed and cache_dir is not None
    progress = None
    if env.is_main and not cfg.runtime.disable_progress_bar:
        from tqdm import tqdm

        progress = lambda it: tqdm(it, total=len(examples), desc="features", unit="question", mininterval=2)  # noqa: E731
    if sync and not env.is_main:
        dist_env.barrier(env)  # wait for process 0 to write the cache, then read it
    settings = squad_answers.QASettings.from_flags(cfg.flags())
    features, how = squad_cache.load_or_build_features(
        input_file, examples, tokenizer, settings, is_training, cache_dir, write_cache=env.is_main, progress=progress
    )
    if sync and env.is_main:
        dist_env.barrier(env)
    log(f"{input_file}: {len(examples)} questions -> {len(features)} windows ({how})")
    return features


class Windows(torch.utils.data.Dataset):
    """Window i -> (input_ids [n], token_type_ids [n], answer (start, end) or None), unpadded (n: its real
    tokens, `lengths` [N]); `features` keeps what turns the window's logits back into answers."""

    def __init__(self, features: list[squad.InputFeatures], with_answers: bool):
        self.features = features
        self.lengths = np.array([sum(f.input_mask) for f in features], dtype=np.int64)
        self.with_answers = with_answers

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int):
        f, n = self.features[i], self.lengths[i]
        answer = (f.start_position, f.end_position) if self.with_answers else None
        return np.asarray(f.input_ids[:n]), np.asarray(f.segment_ids[:n]), answer


def collate(items) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids, attention_mask [B, S_max] (cut to the batch's longest window: padding beyond
    it is masked out of attention anyway and costs compute), and start_positions, end_positions [B] for
    training."""
    batch = predict.pad_sequences([(ids, types) for ids, types, _ in items], (len(items),))
    if items[0][2] is not None:
        batch["start_positions"] = torch.tensor([answer[0] for _, _, answer in items], dtype=torch.long)
        batch["end_positions"] = torch.tensor([answer[1] for _, _, answer in items], dtype=torch.long)
    return batch


def shard(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Every world_size-th index from `rank` on, after wrapping `order` around to a multiple of world_size, so
    every process gets the same number of windows (as DistributedSampler does)."""
    per_rank = math.ceil(len(order) / world_size)
    return np.resize(order, per_rank * world_size)[rank::world_size]


def length_grouped_batches(
    lengths: np.ndarray, batch_size: int, seed: int, epoch: int, rank: int, world_size: int
) -> list[list[int]]:
    """This process's training batches for one epoch: a seeded shuffle, cut into groups of 50 batches, each group
    sorted by length and split into batches, then the batches shuffled. Every process gets the same number of
    batches (see `shard`)."""
    rng = np.random.default_rng([seed, epoch])
    order = shard(rng.permutation(len(lengths)), rank, world_size)
    group = batch_size * 50
    batches = []
    for lo in range(0, len(order), group):
        chunk = order[lo : lo + group]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


# ----------------------------------------------------------------------------------------------------------------
# The task


class SquadTask(recipe.Task):
    """SQuAD v1.1 / v2.0 for the fine-tuning recipe: start and end logits over each window, answers chosen over an
    example's windows, scored by the official algorithm."""

    prog = "run_squad.py"
    name = "squad"
    model_class = BertForQuestionAnswering
    head = "qa_outputs."
    head_description = "question-answering head"
    eval_batch_flag = "predict_batch_size"

    def read(self) -> tuple[list, dict[str, recipe.EvalSet]]:
        """The training questions (--do_train), the questions to answer (--predict_file) and, with --do_eval,
        their gold answers (for `score`); a malformed --predict_file fails here, before minutes of training."""
        data, run = self.cfg.data, self.cfg.run
        train = squad.read_squad_examples(data.train_file, True, data.version_2_with_negative) if run.do_train else []
        sets = {}
        if run.do_predict:
            examples = squad.read_squad_examples(data.predict_file, False, data.version_2_with_negative)
            gold = squad.read_gold_answers(data.predict_file) if run.do_eval else None
            sets[Path(data.predict_file).stem] = recipe.EvalSet(examples, gold=gold)
        return train, sets

    def encode(self, examples, tokenizer, env, log, training: bool) -> Windows:
        cfg = self.cfg
        features = build_features(
            cfg,
            cfg.data.train_file if training else cfg.data.predict_file,
            examples,
            tokenizer,
            training,
            env,
            log,
            collective=training,
        )
        return Windows(features, with_answers=training)

    collate = staticmethod(collate)

    def epoch_batches(self, dataset: Windows, micro_batch: int, env: dist_env.DistEnv):
        """A seeded shuffle of the windows each epoch, every env.world_size-th window this process's, in batches
        (--group_by_length: batches of similar lengths, in random order)."""
        training, workers = self.cfg.training, self.cfg.runtime.num_workers

        def batches(epoch: int) -> torch.utils.data.DataLoader:
            if training.group_by_length:
                index = length_grouped_batches(
                    dataset.lengths, micro_batch, training.seed, epoch, env.rank, env.world_size
                )
            else:
                order = shard(
                    np.random.default_rng([training.seed, epoch]).permutation(len(dataset)), env.rank, env.world_size
                )
                index = [order[i : i + micro_batch].tolist() for i in range(0, len(order), micro_batch)]
            return torch.utils.data.DataLoader(
                dataset,
                batch_sampler=index,
                collate_fn=collate,
                num_workers=workers,
                pin_memory=env.device.type == "cuda",
            )

        return batches, math.ceil(math.ceil(len(dataset) / env.world_size) / micro_batch)

    def head_outputs(self, output) -> torch.Tensor:
        """[B, 2, S]: the start and the end logits of every position."""
        return torch.stack([output.start_logits, output.end_logits], dim=1)

    def score(self, name, eval_set, dataset: Windows, outputs, log) -> tuple[dict | None, dict[str, dict]]:
        """The best answer of each question over its windows (predictions.json), the n best (nbest_predictions.json)
        and for v2.0 the null odds (null_odds.json); with --do_eval, exact match and F1 against the gold answers."""
        cfg, version_2 = self.cfg, self.cfg.data.version_2_with_negative
        results = {}
        for f, n, out in zip(dataset.features, dataset.lengths.tolist(), outputs):
            results[f.unique_id] = squad_answers.RawResult(f.unique_id, out[0, :n], out[1, :n])
        predictions, nbest, null_odds = squad_answers.get_predictions(
            eval_set.examples,
            dataset.features,
            results,
            cfg.windows.n_best_size,
            cfg.windows.max_answer_length,
            cfg.model.do_lower_case,
            version_2,
            cfg.windows.null_score_diff_threshold,
        )
        files = {"predictions.json": predictions, "nbest_predictions.json": nbest}
        if version_2:
            files["null_odds.json"] = null_odds
        if not cfg.run.do_eval:
            return None, files
        return squad_metrics.score_predictions(
            eval_set.gold, predictions, version_2, null_odds if version_2 else None
        ), files

    def after_predictions(self, output_dir: Path, results: dict, logger: meter.RunLogger) -> None:
        """eval_results.json (--do_eval): the scores, and the --eval_script's own output on the written files."""
        cfg = self.cfg
        if not cfg.run.do_eval:
            return
        (metrics,) = results["eval"].values()
        record = {"eval": metrics}
        if cfg.run.eval_script:
            record["eval_script"] = run_eval_script(
                cfg.run.eval_script, cfg.data.predict_file, output_dir, cfg.data.version_2_with_negative
            )
            logger.log("EVAL_SCRIPT", record["eval_script"])
        atomic_io.atomic_write_json(output_dir / "eval_results.json", record)

    def saved_fields(self, steps: int, dataset) -> dict:
        return {"global_step": steps, "task": self.name}

    def final_record(self, results: dict, predictions: dict[str, dict]) -> dict:
        """NVIDIA's summary keys (predicted_questions: the entries of predictions.json)."""
        summary: dict = {}
        if "train" in results:
            train = results["train"]
            summary.update(
                e2e_train_time=train["seconds"],
                global_step=train["steps"],
                final_loss=train["final_loss"],
                training_sequences_per_second=train["sequences_per_second"],
            )
        if "inference" in results:
            seconds = results["inference"]["wall_seconds"]
            summary.update(
                e2e_inference_time=seconds,
                inference_sequences_per_second=results["inference"]["sequences"] / max(seconds, 1e-9),
                predicted_questions=len(predictions.get("predictions.json", {})),
            )
        if "eval" in results:
            (metrics,) = results["eval"].values()
            exact = metrics["exact"] if self.cfg.data.version_2_with_negative else metrics["exact_match"]
            summary.update(exact_match=exact, F1=metrics["f1"])
        return summary


def run_eval_script(script: str, predict_file: str, output_dir: Path, version_2: bool) -> dict:
    """The external evaluation script's JSON output (the official scripts print one JSON object)."""
    command = [sys.executable, script, predict_file, str(output_dir / "predictions.json")]
    if version_2:
        command += ["--na-prob-file", str(output_dir / "null_odds.json")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise cli.InputError(
            f"--eval_script {script} failed (exit {done.returncode}): "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no message'}"
        )
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise cli.InputError(f"--eval_script {script} printed no JSON: {done.stdout[:200]!r}") from None


# ----------------------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> dict:
    """The summary (also printed as JSON); bad input, a checkpoint that does not fit, a malformed SQuAD file or a
    full disk end the run with one line on stderr and exit status 1 (--debug: the traceback)."""
    with cli.script_errors("run_squad.py", argv):
        _, summary = recipe.run(SquadTask(parse_args(argv)))
        return summary


if __name__ == "__main__":
    dist_env.exit_script(main)  # a multi-process run's end: see exit_script
