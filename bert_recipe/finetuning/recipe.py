"""The fine-tuning recipe: the one run that run_glue.py, run_swag.py and run_squad.py share. Each script supplies a
small `Task` (its flags, examples, encoding, batches, head and metrics); everything else is here, once.

Read top to bottom (every script's flags and their rules are finetuning/config.py's; the model files, the padding of
a batch and the forward pass of prediction are prediction/predict.py's, which the commands that only read a model
share):
1. the batch vocabulary: every task's batch is a dict under the model's own argument names, `input_ids`,
   `token_type_ids`, `attention_mask` [B, S] (multiple choice: [B, C, S]) and the head's labels (`labels`, or
   `start_positions` and `end_positions`), so one loss serves every task: `model(**batch).loss`;
2. `Task`: what a task supplies;
3. training: `shuffled_epochs` (a task's default batches), `count_optimizer_steps`, `train` (BertAdam, the linear
   warm-up schedule, fit);
4. prediction: `predict` (the one prediction loop, over predict.py's length-sorted batches and forward pass),
   `latency_summary`, `predict_and_score`;
5. `run`: the skeleton, in order: model files, environment, precision, logger, every input read, tokenizer, model,
   fit, save, predict and score, results.json, the FINAL line; `main`, a script's main() around it.

Messages go to stderr (rank 0 only); stdout carries one thing, the run's FINAL record as JSON, so that a caller can
read it. Library code here raises cli.InputError for bad input; the script's main() turns it into one line.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np
import torch

from bert_recipe.finetuning.config import FinetuneConfig
from bert_recipe.io import atomic_io, cli
from bert_recipe.io.checkpoint_io import export_state_dict, load_pretrained, save_hf_directory
from bert_recipe.prediction.predict import check_model_fits, forward_batches, length_sorted_batches, resolve_model_files
from bert_recipe.training import dist_env, parallelize, precision_policy, train_step
from bert_recipe.training.meter import Meter, RunLogger
from modeling import BertConfig
from optimization import BertAdam, param_groups_for_bert
from schedulers import LinearWarmUpScheduler
from tokenization import BertTokenizer, casing_warning

# --------------------------------------------------------------------------------------------------------------
# 1. The batch vocabulary


class EncodedDataset(torch.utils.data.Dataset):
    """A task's encoded examples for the DataLoader: item i is (`encoded.example(i)`, its label or None).
    `encoded` is one of the tasks' encodings (glue.EncodedExamples: an example is its (input_ids, token_type_ids);
    swag.EncodedChoices: a list of them, one per choice), which also gives `lengths` [N] (what each example is
    padded to in a batch) and `labels` [N] or None."""

    def __init__(self, encoded):
        self.encoded, self.lengths, self.labels = encoded, encoded.lengths, encoded.labels

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int):
        return self.encoded.example(i), None if self.labels is None else self.labels[i]


def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every task's training loss: its head's own (cross-entropy over classes or choices, mean squared error for a
    regression, the mean of the start and end cross-entropies for SQuAD), from a batch in the vocabulary above."""
    return model(**batch).loss


# --------------------------------------------------------------------------------------------------------------
# 2. What a task supplies


class EvalSet(NamedTuple):
    """A set to predict (and score), as the task's `read` returns it for its `score`: the examples, and what
    scoring needs beyond them."""

    examples: list
    unlabelled: bool = False  # a test split without labels: predictions only, never scored
    gold: Any = None  # answers kept apart from the examples (SQuAD's, read with --do_eval); None: none


class Task:
    """One fine-tuning task for `run`: the script's configuration (`cfg`, frozen: finetuning/config.py) and its
    parts. A task's encoded set (`encode`) is a torch Dataset with `lengths` [N] (what each example is padded to in
    a batch, for length-sorted prediction batches); `collate` makes a batch of its items in the batch vocabulary.
    The defaults below serve a task whose examples are classified whole (GLUE, SWAG); run_squad.py overrides what
    differs. A hook leaves nothing on the task for a later one: it returns it (read's EvalSets carry what score
    needs, score's prediction files reach final_record, the encoded training set reaches saved_fields)."""

    prog: str  # the script, as messages name it: "run_glue.py"
    name: str  # results.json's "task"
    model_class: type[torch.nn.Module]
    head = "classifier."  # the head's parameter prefix: a fresh one is warned about when nothing trains it
    head_description = "classifier for this task"
    unit = "sequences"  # what --train_batch_size and the throughput numbers count
    eval_batch_flag = "eval_batch_size"  # the flag of the prediction batch size (in cfg.training)

    def __init__(self, cfg: FinetuneConfig):
        self.cfg = cfg

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of model_class beyond its config (e.g. num_labels)."""
        return {}

    def read(self) -> tuple[list, dict[str, EvalSet]]:
        """Every input of the run, read and checked before any work: (training examples, or [] without
        --do_train; {set name: its EvalSet} to evaluate or predict)."""
        raise NotImplementedError

    def encode(
        self, examples: list, tokenizer, env: dist_env.DistEnv, log: Callable[[str], None], training: bool
    ) -> torch.utils.data.Dataset:
        raise NotImplementedError

    def collate(self, items: list) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def epoch_batches(
        self, dataset, micro_batch: int, env: dist_env.DistEnv
    ) -> tuple[Callable[[int], Iterable[dict]], int]:
        """(epoch -> this process's training micro-batches of that epoch, micro-batches per epoch)."""
        return shuffled_epochs(
            dataset, micro_batch, self.collate, self.cfg.training.seed, env, self.cfg.runtime.num_workers
        )

    def head_outputs(self, output) -> torch.Tensor:
        """What prediction keeps of the model's output, [B, ...]: the logits."""
        return output.logits

    def score(
        self, name: str, eval_set: EvalSet, dataset, outputs: list[np.ndarray], log: Callable[[str], None]
    ) -> tuple[dict | None, dict[str, dict]]:
        """(metrics of the set `name`, or None; {prediction file name: {id: prediction}}) from `outputs`, the
        head's output for each example of `dataset` (`eval_set`'s examples encoded), in order."""
        raise NotImplementedError

    def saved_fields(self, steps: int, dataset) -> dict[str, Any]:
        """What model.pt records beside the model and its config, after `steps` optimizer steps on `dataset` (the
        encoded training set)."""
        return {"task": self.name}

    def hf_config_fields(self) -> dict[str, Any]:
        """Entries added to hf_model/config.json (e.g. the label names)."""
        return {}

    def after_predictions(self, output_dir: Path, results: dict, logger: RunLogger) -> None:
        """Runs once the prediction files are written (SQuAD: its external evaluation script reads them)."""

    def final_record(self, results: dict, predictions: dict[str, dict]) -> dict:
        """The FINAL log line (also printed on stdout): metrics as <set>:<metric>, plus the throughput numbers;
        `predictions`: {prediction file name: {id: prediction}} of every set (what `score` returned)."""
        flat = {f"{name}:{k}": v for name, metrics in results.get("eval", {}).items() for k, v in metrics.items()}
        if "train" in results:
            flat[f"training_{self.unit}_per_second"] = results["train"][f"{self.unit}_per_second"]
            flat["e2e_train_time"] = results["train"]["seconds"]
        if "inference" in results:
            flat[f"inference_{self.unit}_per_second"] = results["inference"][f"{self.unit}_per_second"]
            flat["latency_ms_p99"] = results["inference"]["latency_ms_p99"]
        return flat


# --------------------------------------------------------------------------------------------------------------
# 3. Training


def shuffled_epochs(
    dataset: torch.utils.data.Dataset,
    micro_batch: int,
    collate_fn,
    seed: int,
    env: dist_env.DistEnv,
    num_workers: int = 0,
) -> tuple[Callable[[int], Iterable[dict]], int]:
    """A fine-tuning dataset as epochs of shuffled micro-batches (each process its own share, as DistributedSampler
    cuts it): returns (epoch -> that epoch's batches, micro-batches per epoch)."""
    sampler = (
        torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=seed)
        if env.distributed
        else torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=micro_batch,
        sampler=sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=env.device.type == "cuda",
    )

    def epoch_batches(epoch: int) -> Iterable[dict]:
        if env.distributed:
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every process
        return loader

    return epoch_batches, len(loader)


def count_optimizer_steps(batches_per_epoch: int, accumulation: int, epochs: float, max_steps: float) -> int:
    """Optimizer steps of a fine-tuning run: max_steps when positive, else ceil(epochs * steps per epoch); an
    epoch's last partial accumulation group is a step of its own."""
    if max_steps > 0:
        return int(max_steps)
    return max(1, math.ceil(epochs * math.ceil(batches_per_epoch / accumulation)))


def train(
    model: torch.nn.Module, task: Task, dataset, env: dist_env.DistEnv, logger: RunLogger, precision_name: str
) -> FitResult:
    """Fine-tune `model` (bare: parallelism and precision `precision_name`, resolved, are applied here) on
    `dataset` with the shared flags: the task's micro-batches, BertAdam (AdamW without bias correction, as BERT)
    over the no-decay groups, the linear warm-up schedule, fit."""
    t = task.cfg.training
    micro_batch = t.train_batch_size // t.gradient_accumulation_steps
    epoch_batches, per_epoch = task.epoch_batches(dataset, micro_batch, env)
    total_steps = count_optimizer_steps(per_epoch, t.gradient_accumulation_steps, t.num_train_epochs, t.max_steps)
    ddp_model, precision = parallelize.apply_parallelism_and_precision(
        model, env, precision_name, loss_scale=t.loss_scale
    )
    optimizer = BertAdam(
        param_groups_for_bert(model, t.weight_decay),
        lr=t.learning_rate,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm if t.max_grad_norm > 0 else None,
    )
    scheduler = LinearWarmUpScheduler(optimizer, warmup=t.warmup_proportion, total_steps=total_steps)
    logger.log(
        "PARAMETER",
        {
            "train_examples": len(dataset),
            "optimizer_steps": total_steps,
            "micro_batch": micro_batch,
            "world_size": env.world_size,
            "precision": precision.name,
        },
    )
    rule = train_step.StepRule(ddp_model, loss, optimizer, scheduler, precision, fine_tuning_watch(env.device))
    return fit(
        rule,
        epoch_batches,
        env,
        logger,
        total_steps=total_steps,
        accumulation=t.gradient_accumulation_steps,
        log_freq=task.cfg.runtime.log_freq,
    )


@dataclass
class FitResult:
    steps: int  # optimizer steps taken (an fp16 overflow's skipped step is not one)
    loss: float  # mean training loss over the last log window
    seconds: float
    sequences: int  # sequences trained, all processes


def fine_tuning_watch(device: torch.device) -> train_step.DivergenceWatch:
    """Fine-tuning with a non-finite loss ends with this line, before its NaN weights are evaluated or saved as a
    result."""
    return train_step.DivergenceWatch(
        device, "fine-tuning step", "lower --learning_rate, or try --precision fp32", "nothing was evaluated or saved"
    )


def fit(
    rule: train_step.StepRule,
    epoch_batches: Callable[[int], Iterable[dict[str, torch.Tensor]]],
    env: dist_env.DistEnv,
    logger: RunLogger,
    *,
    total_steps: int,
    accumulation: int,
    log_freq: int,
) -> FitResult:
    """Train `rule.model` (the DDP-wrapped one when distributed) until `total_steps` optimizer steps are taken.

    epoch_batches(epoch) yields this process's micro-batches of one epoch (CPU tensors); groups of `accumulation`
    of them make one optimizer step (train_step.StepRule: gradients all-reduced on the group's last micro-batch
    only; an fp16 overflow skips the step and the schedule and is not counted). The loss stays on the device until
    a log step: one host sync every `log_freq` steps. A non-finite loss (fp32/bf16) raises DivergedError naming its
    step (fine_tuning_watch): on a CPU before that step's optimizer update, on a GPU at the next log step.
    """
    meter, watch = Meter(env), rule.watch
    bar = logger.progress(total_steps, desc="train")
    epoch, last_loss = 0, float("nan")
    rule.model.train()
    while rule.taken < total_steps:
        for group in train_step.accumulation_groups(epoch_batches(epoch), accumulation):
            taken, losses = rule((train_step.to_device(b, env.device) for b in group), len(group), rule.taken + 1)
            meter.add_attempt(losses[:1])
            if not taken:
                continue  # fp16 overflow: the loss scale halved, nothing else moved
            meter.step_taken(sum(len(b["input_ids"]) for b in group) * env.world_size)
            step = rule.taken
            bar.update(1)
            if step % log_freq == 0 or step == total_steps:
                watch.check()  # on a GPU, read at log steps only: no host sync per step
                last_loss = meter.mean_losses()[0]
                logger.log(
                    step,
                    {
                        "loss": last_loss,
                        "learning_rate": rule.lr,
                        "epoch": epoch,
                        "loss_scale": rule.precision.loss_scale,
                        "sequences_per_second": meter.run_sequences / max(meter.elapsed(), 1e-9),
                    },
                )
                bar.set_postfix(loss=f"{last_loss:.4f}")
            if step >= total_steps:
                break
        epoch += 1
    bar.close()
    return FitResult(steps=rule.taken, loss=last_loss, seconds=meter.elapsed(), sequences=meter.run_sequences)


# --------------------------------------------------------------------------------------------------------------
# 4. Prediction


@dataclass
class Predictions:
    outputs: list[np.ndarray]  # the head's output for each example, in the dataset's order
    batch_ms: list[float]  # wall time of each batch (forward only, device synchronised by the copy to the host)
    seconds: float  # the whole pass


@torch.inference_mode()
def predict(
    model: torch.nn.Module, task: Task, dataset, batch_size: int, precision: str, env: dist_env.DistEnv, desc: str
) -> Predictions:
    """The one prediction loop: the task head's output for every example of `dataset`, from batches of similar
    lengths, each padded to its longest, put back in the dataset's order."""
    from tqdm import tqdm

    batches = length_sorted_batches(dataset.lengths, batch_size)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=batches, collate_fn=task.collate, num_workers=task.cfg.runtime.num_workers
    )
    outputs: list = [None] * len(dataset)
    batch_ms = []
    start = time.perf_counter()
    bar = tqdm(
        loader, desc=desc, unit="batch", mininterval=1, disable=task.cfg.runtime.disable_progress_bar or not env.is_main
    )
    for index, (out, ms) in zip(batches, forward_batches(model, bar, task.head_outputs, precision, env.device)):
        batch_ms.append(ms)
        for row, i in enumerate(index):
            outputs[i] = out[row]
    return Predictions(outputs, batch_ms, time.perf_counter() - start)


def latency_summary(
    batch_ms: list[float], count: int, seconds: float, batch_size: int, unit: str = "sequences"
) -> dict[str, float]:
    """Per-batch latency percentiles and throughput of a prediction pass (forward time only); `count` examples
    of `unit`."""
    ms = np.asarray(batch_ms)
    return {
        "batch_size": batch_size,
        "batches": len(ms),
        unit: count,
        "latency_ms_p50": float(np.percentile(ms, 50)),
        "latency_ms_p90": float(np.percentile(ms, 90)),
        "latency_ms_p99": float(np.percentile(ms, 99)),
        "latency_ms_mean": float(ms.mean()),
        f"{unit}_per_second": count / (ms.sum() / 1000),
        "wall_seconds": seconds,
    }


def predict_and_score(
    task: Task,
    model: torch.nn.Module,
    tokenizer,
    eval_sets: dict[str, EvalSet],
    env: dist_env.DistEnv,
    logger: RunLogger,
    log: Callable[[str], None],
    precision: str,
) -> tuple[dict, dict[str, dict]]:
    """Predict every set in `precision` (resolved), score it, write the prediction files (--do_predict); returns
    ({"eval", "inference"}, {prediction file name: {id: prediction}})."""
    cfg = task.cfg
    batch_size = getattr(cfg.training, task.eval_batch_flag)
    out: dict = {}
    files: dict[str, dict] = {}
    all_ms, count, seconds = [], 0, 0.0
    for name, eval_set in eval_sets.items():
        dataset = task.encode(eval_set.examples, tokenizer, env, log, training=False)
        result = predict(model, task, dataset, batch_size, precision, env, desc=name)
        all_ms += result.batch_ms
        count += len(dataset)
        seconds += result.seconds
        metrics, predictions = task.score(name, eval_set, dataset, result.outputs, log)
        for file, entries in predictions.items():
            files.setdefault(file, {}).update(entries)
        if metrics is not None:
            out.setdefault("eval", {})[name] = metrics
            logger.log(("eval", name), metrics)
    out["inference"] = latency_summary(all_ms, count, seconds, batch_size, task.unit)
    log(
        f"inference: p50 {out['inference']['latency_ms_p50']:.1f} ms/batch, "
        f"{out['inference'][f'{task.unit}_per_second']:.1f} {task.unit}/s"
    )
    if cfg.run.do_predict:
        for file, entries in files.items():
            atomic_io.atomic_write_json(Path(cfg.data.output_dir) / file, entries)
    return out, files


# --------------------------------------------------------------------------------------------------------------
# 5. The run


def load_model(task: Task, log: Callable[[str], None]) -> torch.nn.Module:
    """The task's model from --init_checkpoint (a head the checkpoint lacks starts fresh, and says so), or from
    random weights and --config_file where the script allows it."""
    m = task.cfg.model
    if m.init_checkpoint is None:
        log("no --init_checkpoint: starting from random weights")
        return task.model_class(BertConfig.from_json_file(m.config_file), **task.model_kwargs())
    model, report = load_pretrained(task.model_class, m.init_checkpoint, config=m.config_file, **task.model_kwargs())
    for line in report.lines():
        log(f"from_pretrained({task.model_class.__name__}, {m.init_checkpoint}): {line}")
    if not task.cfg.run.do_train and report.fresh_head(task.head):
        log(
            f"warning: {m.init_checkpoint} has no {task.head_description}, so evaluation and predictions come "
            "from a random head; pass a fine-tuned model.pt or hf_model/ (or add --do_train)"
        )
    return model


def save_model(model: torch.nn.Module, task: Task, output_dir: Path, fields: dict[str, Any], vocab_file: str) -> None:
    """model.pt ({"model": tensors under Hugging Face names, "config", and the task's `fields`}; loads with
    torch.load(weights_only=True) and checkpoint_io.from_pretrained) and hf_model/, the same model as a
    transformers directory (config.json, model.safetensors, `vocab_file` as vocab.txt)."""
    atomic_io.atomic_torch_save(
        {"model": export_state_dict(model), "config": model.config.to_dict(), **fields}, output_dir / "model.pt"
    )
    hf_dir = output_dir / "hf_model"
    save_hf_directory(model, hf_dir, vocab_file)
    extra = task.hf_config_fields()
    if extra:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
        atomic_io.atomic_write_json(hf_dir / "config.json", {**config, **extra})


def main(
    task_class: type[Task],
    parse_args: Callable[[Sequence[str] | None], FinetuneConfig],
    argv: Sequence[str] | None = None,
) -> dict:
    """A fine-tuning script's main(argv): its flags parsed, its task run; returns the results (also results.json).
    Bad input, a checkpoint that does not fit or cannot be read safely, a malformed data file or a full disk end
    the run with one line on stderr and exit status 1 (--debug: the traceback)."""
    with cli.script_errors(task_class.prog, argv):
        results, _ = run(task_class(parse_args(argv)))
        return results


def run(task: Task) -> tuple[dict, dict]:
    """Fine-tune, save, predict and score as the task's flags say; returns (the results, also results.json on
    rank 0; the FINAL record, logged and printed on stdout by rank 0). Bad input raises cli.InputError (or a
    checkpoint's, a data file's own error) before any training or prediction. The flags are read, never changed:
    what is resolved from them (the vocabulary file, the precision) is resolved once, here."""
    cfg = task.cfg
    m, r, t, rt = cfg.model, cfg.run, cfg.training, cfg.runtime
    # 1. The model files first: a missing checkpoint or vocabulary is a one-line error, not a traceback later.
    vocab_file = resolve_model_files(m)
    # 2. Where the run computes (torchrun's or Slurm's environment, else one process) and in what precision:
    #    auto decides from that device, and from whether the run trains or only reads the model.
    env = dist_env.init_distributed(no_cuda=rt.no_cuda)
    choice = precision_policy.setup(
        t.precision, env.device, task.prog, precision_policy.purpose_of(r), show=env.is_main
    )
    output_dir = Path(cfg.data.output_dir)
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
    logger = RunLogger(
        rt.json_summary or output_dir / "dllogger.json", None, enabled=env.is_main, progress=not rt.disable_progress_bar
    )
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if env.is_main else (lambda msg: None)
    logger.log(
        "PARAMETER",
        {**cfg.flags(), "vocab_file": vocab_file, "precision": choice.name, "precision_reason": choice.reason},
    )

    # 3. Read every input first: a missing or malformed dev file must fail before minutes of training, not after.
    train_examples, eval_sets = task.read()
    tokenizer = BertTokenizer(vocab_file, do_lower_case=m.do_lower_case)
    warning = casing_warning(tokenizer.vocab, vocab_file, m.do_lower_case)
    if warning:
        log(f"warning: {warning}")

    # 4. The model: the seed makes a fresh head (or random weights) the same on every process.
    dist_env.set_seed(t.seed)
    model = load_model(task, log)
    check_model_fits(model.config, len(tokenizer), vocab_file, m.max_seq_length)
    if model.config.vocab_size != len(tokenizer):
        log(
            f"warning: the model's vocab_size {model.config.vocab_size} differs from {vocab_file} "
            f"({len(tokenizer)} tokens)"
        )
    model.to(env.device)
    dist_env.set_seed(t.seed + env.rank)  # dropout differs per process; the weights above are the same everywhere
    results: dict = {
        "task": task.name,
        "init_checkpoint": m.init_checkpoint,
        "precision": choice.name,
        "precision_reason": choice.reason,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": str(env.device),
        "world_size": env.world_size,
        "max_seq_length": m.max_seq_length,
    }

    # 5. Fit, and save on rank 0 (every process holds the same weights after the last all-reduce).
    if r.do_train:
        dataset = task.encode(train_examples, tokenizer, env, log, training=True)
        fit = train(model, task, dataset, env, logger, choice.name)
        rate = fit.sequences / max(fit.seconds, 1e-9)
        results["train"] = {
            "examples": len(dataset),
            "steps": fit.steps,
            "final_loss": fit.loss,
            "seconds": fit.seconds,
            f"{task.unit}_per_second": rate,
            "train_batch_size": t.train_batch_size * env.world_size,
            "epochs": t.num_train_epochs if t.max_steps <= 0 else None,
        }
        log(f"trained {fit.steps} steps in {fit.seconds:.1f} s ({rate:.1f} {task.unit}/s), final loss {fit.loss:.4f}")
        if env.is_main and not r.skip_checkpoint:
            save_model(model, task, output_dir, task.saved_fields(fit.steps, dataset), vocab_file)
            log(f"saved {output_dir / 'model.pt'} and {output_dir / 'hf_model'}")

    # 6. Predict and score on rank 0 alone; the other processes wait at the barrier.
    dist_env.barrier(env)
    predictions: dict[str, dict] = {}
    if env.is_main and eval_sets:
        evaluated, predictions = predict_and_score(task, model, tokenizer, eval_sets, env, logger, log, choice.name)
        results.update(evaluated)
        task.after_predictions(output_dir, results, logger)

    # 7. The record: results.json, the FINAL log line, and the same record on stdout.
    final = task.final_record(results, predictions)
    if env.is_main:
        atomic_io.atomic_write_json(output_dir / "results.json", results)
        logger.log("FINAL", final)
        print(json.dumps(final, indent=2), flush=True)
    logger.close()
    dist_env.end_process_group()
    return results, final
