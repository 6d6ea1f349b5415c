"""Fine-tune BERT on SQuAD v1.1 / v2.0, predict answers, and score them with the official algorithm.

    python run_squad.py --init_checkpoint ckpt_8601.pt --config_file bert_config.json --vocab_file vocab.txt \
        --do_lower_case --train_file train-v1.1.json --predict_file dev-v1.1.json --do_train --do_predict \
        --do_eval --output_dir results/SQuAD --bf16
    torchrun --nproc_per_node=8 run_squad.py ...       (DistributedDataParallel, one process per GPU)

--init_checkpoint takes a ckpt_<step>.pt of run_pretraining.py, an NVIDIA checkpoint, our model.pt, or a Hugging
Face directory (then --config_file and --vocab_file default to the ones inside it).

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
    dllogger.json           JSON-lines log (--json-summary to move it)

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
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

import precision as precision_policy  # the module; `precision` is the resolved name in these scripts
import utils
from checkpoint_io import export_state_dict, from_pretrained, save_hf_directory
from modeling import BertConfig, BertForQuestionAnswering
from processors import squad
import training
from tokenization import BertTokenizer, casing_warning

# ----------------------------------------------------------------------------------------------------------------
# Arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_squad.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--train_file", default=None, help="SQuAD json for training, e.g. train-v1.1.json")
    g.add_argument("--predict_file", default=None, help="SQuAD json to predict (and evaluate), e.g. dev-v1.1.json")
    g.add_argument("--output_dir", required=True, help="where predictions, results and the model go")
    g.add_argument("--version_2_with_negative", action="store_true",
                   help="SQuAD 2.0: questions may have no answer (predicted as \"\")")
    g.add_argument("--cache_dir", default=None,
                   help="feature cache folder (default: beside the input file if writable, else <output_dir>/cache)")
    g.add_argument("--skip_cache", action="store_true", help="neither read nor write cached features")

    g = p.add_argument_group("model")
    g.add_argument("--init_checkpoint", default=None,
                   help="ckpt_<step>.pt, an NVIDIA .pt, our model.pt, or a Hugging Face directory; without it the "
                        "model starts from random weights (--config_file needed)")
    g.add_argument("--config_file", default=None,
                   help="bert_config.json; default: the config inside or beside --init_checkpoint")
    g.add_argument("--vocab_file", default=None, help="vocab.txt; default: vocab.txt in or beside --init_checkpoint")
    g.add_argument("--do_lower_case", action="store_true", help="lower-case the input (uncased models)")
    g.add_argument("--bert_model", default=None, help="accepted for compatibility with the original; unused")

    g = p.add_argument_group("what to run")
    g.add_argument("--do_train", action="store_true", help="fine-tune on --train_file")
    g.add_argument("--do_predict", action="store_true", help="write predictions for --predict_file")
    g.add_argument("--do_eval", action="store_true",
                   help="score the predictions against --predict_file's answers (implies --do_predict)")
    g.add_argument("--eval_script", default=None,
                   help="also run this external script (e.g. the official evaluate-v1.1.py) on the predictions "
                        "and log its output")
    g.add_argument("--skip_checkpoint", action="store_true", help="do not save the fine-tuned model")

    g = p.add_argument_group("features and answers")
    g.add_argument("--max_seq_length", type=int, default=384, help="tokens per window: [CLS] question [SEP] doc [SEP]")
    g.add_argument("--doc_stride", type=int, default=128, help="tokens between the starts of consecutive windows")
    g.add_argument("--max_query_length", type=int, default=64, help="questions are cut to this many tokens")
    g.add_argument("--n_best_size", type=int, default=20, help="answers kept per question in nbest_predictions.json")
    g.add_argument("--max_answer_length", type=int, default=30, help="longest answer, in WordPiece tokens")
    g.add_argument("--null_score_diff_threshold", type=float, default=0.0,
                   help="v2.0: predict no answer when null score - best span score exceeds this")
    g.add_argument("--verbose_logging", action="store_true", help="accepted for compatibility; unused")

    g, r = training.add_finetuning_arguments(
        p, seed=42, log_freq=50, workers_help="DataLoader worker processes cutting training batches (the features "
                                              "are in-memory tensors, so 0 is usually fastest)")
    g.add_argument("--predict_batch_size", type=int, default=64, help="windows per prediction batch")
    g.add_argument("--group_by_length", action="store_true",
                   help="training batches of similar lengths (less padding; batches still in random order)")
    r.add_argument("--use_env", action="store_true",
                   help="accepted for compatibility (the rank always comes from the environment)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    args.do_predict = args.do_predict or args.do_eval
    if not (args.do_train or args.do_predict):
        raise SystemExit("run_squad.py: nothing to do: pass --do_train and/or --do_predict (--do_eval)")
    if args.do_train and not args.train_file:
        raise SystemExit("run_squad.py: --do_train needs --train_file (a SQuAD json such as train-v1.1.json)")
    if args.do_predict and not args.predict_file:
        raise SystemExit("run_squad.py: --do_predict/--do_eval need --predict_file (a SQuAD json such as "
                         "dev-v1.1.json)")
    for name in ("train_file", "predict_file", "eval_script", "config_file", "vocab_file"):
        value = getattr(args, name)
        if value is not None and not Path(value).is_file():
            raise SystemExit(f"run_squad.py: --{name} {value} not found")
    if args.init_checkpoint is not None and not Path(args.init_checkpoint).exists():
        raise SystemExit(f"run_squad.py: --init_checkpoint {args.init_checkpoint} not found: give a "
                         "ckpt_<step>.pt, a model.pt or a Hugging Face directory")
    if args.init_checkpoint is None and args.config_file is None:
        raise SystemExit("run_squad.py: give --init_checkpoint, or --config_file to start from random weights")
    try:
        training.check_finetuning_arguments(args)
    except utils.InputError as e:
        raise SystemExit(f"run_squad.py: {e}") from None
    for name in ("predict_batch_size", "doc_stride", "n_best_size", "max_answer_length"):
        if getattr(args, name) < 1:
            raise SystemExit(f"run_squad.py: --{name} must be positive, got {getattr(args, name)}")
    if args.max_seq_length < args.max_query_length + 4:
        raise SystemExit(f"run_squad.py: --max_seq_length {args.max_seq_length} must be at least --max_query_length "
                         f"{args.max_query_length} + 4 ([CLS], two [SEP] and one document token)")
    return args


def resolve_vocab(args: argparse.Namespace) -> None:
    """--vocab_file defaults to vocab.txt inside a checkpoint directory or beside a checkpoint file."""
    if args.vocab_file is not None:
        return
    ckpt = Path(args.init_checkpoint) if args.init_checkpoint else None
    candidates = [] if ckpt is None else [ckpt / "vocab.txt"] if ckpt.is_dir() else [ckpt.parent / "vocab.txt"]
    found = [p for p in candidates if p.is_file()]
    if not found:
        raise SystemExit("run_squad.py: no vocab.txt in or beside --init_checkpoint: pass --vocab_file")
    args.vocab_file = str(found[0])


# ----------------------------------------------------------------------------------------------------------------
# Data


FEATURE_KEYS = ("input_ids", "segment_ids", "input_mask")


def feature_tensors(features: list[squad.InputFeatures], with_positions: bool) -> dict[str, torch.Tensor]:
    """[F, S] input_ids / segment_ids / input_mask (and [F] start/end positions for training), int64."""
    out = {
        "input_ids": torch.tensor([f.input_ids for f in features], dtype=torch.long),
        "segment_ids": torch.tensor([f.segment_ids for f in features], dtype=torch.long),
        "input_mask": torch.tensor([f.input_mask for f in features], dtype=torch.long),
    }
    if with_positions:
        out["start_positions"] = torch.tensor([f.start_position for f in features], dtype=torch.long)
        out["end_positions"] = torch.tensor([f.end_position for f in features], dtype=torch.long)
    return out


def trim_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Cut [B, S] tensors to the longest real sequence of the batch: padding beyond it changes nothing (it is
    masked out of attention) and costs compute."""
    longest = int(batch["input_mask"].sum(1).max())
    return {k: v[:, :longest] if v.dim() == 2 else v for k, v in batch.items()}


def shard(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Every world_size-th index from `rank` on, after wrapping `order` around to a multiple of world_size, so
    every process gets the same number of windows (as DistributedSampler does)."""
    per_rank = math.ceil(len(order) / world_size)
    return np.resize(order, per_rank * world_size)[rank::world_size]


def length_grouped_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, rank: int,
                           world_size: int) -> list[list[int]]:
    """This process's training batches for one epoch: a seeded shuffle, cut into groups of 50 batches, each group
    sorted by length and split into batches, then the batches shuffled. Every process gets the same number of
    batches (see `shard`)."""
    rng = np.random.default_rng([seed, epoch])
    order = shard(rng.permutation(len(lengths)), rank, world_size)
    group = batch_size * 50
    batches = []
    for lo in range(0, len(order), group):
        chunk = order[lo:lo + group]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size].tolist() for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


class BatchedTensors(torch.utils.data.Dataset):
    """dataset[list of indices] -> that batch of every tensor, trimmed to its longest sequence (so a DataLoader with
    batch_size=None and a sampler of index lists hands out whole batches, in worker processes if asked)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors["input_ids"])

    def __getitem__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices)
        return trim_batch({k: v[index] for k, v in self.tensors.items()})


def training_batches(tensors: dict[str, torch.Tensor], batch_size: int, args, env: utils.DistEnv,
                     epoch: int) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of this process's micro-batches, trimmed to their longest sequence."""
    lengths = tensors["input_mask"].sum(1).numpy()
    if args.group_by_length:
        batches = length_grouped_batches(lengths, batch_size, args.seed, epoch, env.rank, env.world_size)
    else:
        order = shard(np.random.default_rng([args.seed, epoch]).permutation(len(lengths)), env.rank, env.world_size)
        batches = [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    yield from torch.utils.data.DataLoader(BatchedTensors(tensors), sampler=batches, batch_size=None,
                                           num_workers=args.num_workers, pin_memory=env.device.type == "cuda")


def cache_dir_for(args: argparse.Namespace, input_file: str) -> Path | None:
    if args.skip_cache:
        return None
    if args.cache_dir:
        return Path(args.cache_dir)
    beside = Path(input_file).resolve().parent
    return beside if os.access(beside, os.W_OK) else Path(args.output_dir) / "cache"


def build_features(args, input_file: str, examples, tokenizer, is_training: bool, env: utils.DistEnv, log,
                   collective: bool):
    """Features from the cache or built. `collective`: every process calls this; then process 0 builds and caches
    the features first and the others read the cache (one tokenization instead of one per process)."""
    cache_dir = cache_dir_for(args, input_file)
    sync = collective and env.distributed and cache_dir is not None
    progress = None
    if env.is_main and not args.disable_progress_bar:
        from tqdm import tqdm

        progress = lambda it: tqdm(it, total=len(examples), desc="features", unit="question", mininterval=2)  # noqa: E731
    if sync and not env.is_main:
        utils.barrier(env)  # wait for process 0 to write the cache, then read it
    features, how = squad.load_or_build_features(
        input_file, examples, tokenizer, args.max_seq_length, args.doc_stride, args.max_query_length, is_training,
        args.version_2_with_negative, cache_dir, write_cache=env.is_main, progress=progress)
    if sync and env.is_main:
        utils.barrier(env)
    log(f"{input_file}: {len(examples)} questions -> {len(features)} windows ({how})")
    return features


# ----------------------------------------------------------------------------------------------------------------
# Training


def qa_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The mean of the start- and end-position cross-entropies (the answer head's loss)."""
    return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"], batch["start_positions"],
                 batch["end_positions"]).loss


def train(args, model, tensors: dict[str, torch.Tensor], env: utils.DistEnv,
          logger: training.RunLogger) -> training.FitResult:
    """Fine-tune `model` (bare; DDP and precision are applied here) on the training windows."""
    micro_batch = args.train_batch_size // args.gradient_accumulation_steps
    num_windows = len(tensors["input_ids"])
    batches_per_epoch = math.ceil(math.ceil(num_windows / env.world_size) / micro_batch)
    total_steps = training.count_optimizer_steps(batches_per_epoch, args.gradient_accumulation_steps,
                                                 args.num_train_epochs, args.max_steps)
    ddp_model, precision, optimizer, scheduler = training.finetuning_setup(model, args, env, total_steps)
    logger.log("PARAMETER", {"train_windows": num_windows, "total_steps": total_steps, "micro_batch": micro_batch,
                             "world_size": env.world_size, "precision": precision.name})
    return training.fit(ddp_model, lambda epoch: training_batches(tensors, micro_batch, args, env, epoch), qa_loss,
                        optimizer, scheduler, precision, env, logger, total_steps=total_steps,
                        accumulation=args.gradient_accumulation_steps, log_freq=args.log_freq)


# ----------------------------------------------------------------------------------------------------------------
# Prediction


@torch.inference_mode()
def predict_logits(model, features: list[squad.InputFeatures], batch_size: int, precision: str,
                   device: torch.device, progress: bool = False) -> tuple[dict[int, squad.RawResult], float]:
    """Start/end logits of every window: unique_id -> RawResult([n] start, [n] end), n = the window's length.
    Windows run in length order, so each batch carries little padding. Returns (results, seconds)."""
    model.eval()
    tensors = feature_tensors(features, with_positions=False)
    lengths = tensors["input_mask"].sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)
    chunks = order.split(batch_size)
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="predicting", unit="batch", mininterval=2)
    results: dict[int, squad.RawResult] = {}
    start_time = time.time()
    for index in chunks:
        batch = trim_batch({k: v[index] for k, v in tensors.items()})
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with precision_policy.autocast(precision, device):
            out = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
            start, end = out.start_logits, out.end_logits
        start, end = start.float().cpu().numpy(), end.float().cpu().numpy()
        for row, i in enumerate(index.tolist()):
            n = int(lengths[i])
            uid = features[i].unique_id
            results[uid] = squad.RawResult(uid, start[row, :n], end[row, :n])
    return results, time.time() - start_time


def write_predictions(output_dir: Path, predictions, nbest, null_odds, version_2: bool) -> None:
    utils.atomic_write_json(output_dir / "predictions.json", predictions)
    utils.atomic_write_json(output_dir / "nbest_predictions.json", nbest)
    if version_2:
        utils.atomic_write_json(output_dir / "null_odds.json", null_odds)


def run_eval_script(script: str, predict_file: str, output_dir: Path, version_2: bool) -> dict:
    """The external evaluation script's JSON output (the official scripts print one JSON object)."""
    command = [sys.executable, script, predict_file, str(output_dir / "predictions.json")]
    if version_2:
        command += ["--na-prob-file", str(output_dir / "null_odds.json")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run_squad.py: --eval_script {script} failed (exit {done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no message'}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"run_squad.py: --eval_script {script} printed no JSON: {done.stdout[:200]!r}") from None


# ----------------------------------------------------------------------------------------------------------------
# Model


def load_model(args, log) -> BertForQuestionAnswering:
    if args.init_checkpoint is None:
        log("no --init_checkpoint: starting from random weights")
        return BertForQuestionAnswering(BertConfig.from_json_file(args.config_file))
    return from_pretrained(BertForQuestionAnswering, args.init_checkpoint, config=args.config_file, log=log)


def save_model(model: BertForQuestionAnswering, output_dir: Path, vocab_file: str, global_step: int) -> None:
    """model.pt (our format, weights_only-loadable) and hf_model/ (transformers' BertForQuestionAnswering)."""
    utils.atomic_torch_save({"model": export_state_dict(model), "config": model.config.to_dict(),
                             "global_step": global_step, "task": "squad"}, output_dir / "model.pt")
    save_hf_directory(model, output_dir / "hf_model", vocab_file)


# ----------------------------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> dict:
    """The summary (also printed as JSON); bad input, a checkpoint that does not fit, a malformed SQuAD file or a
    full disk end the run with one line on stderr and exit status 1 (--debug: the traceback)."""
    with utils.script_errors("run_squad.py", argv):
        return run(parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    resolve_vocab(args)
    env = utils.init_distributed(no_cuda=args.no_cuda)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    logger = training.RunLogger(args.json_summary or output_dir / "dllogger.json", None, enabled=env.is_main,
                                progress=not args.disable_progress_bar)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if env.is_main else (lambda msg: None)
    choice = precision_policy.setup(args.precision, env.device, "run_squad.py", precision_policy.purpose_of(args),
                                    show=env.is_main)
    args.precision, args.precision_reason = choice.name, choice.reason
    utils.set_seed(args.seed)
    logger.log("PARAMETER", {k: v for k, v in vars(args).items()})

    # Read every input first: a malformed --predict_file must fail before minutes of training, not after them.
    train_examples = squad.read_squad_examples(args.train_file, True, args.version_2_with_negative) \
        if args.do_train else []
    predict_examples = squad.read_squad_examples(args.predict_file, False, args.version_2_with_negative) \
        if args.do_predict else []
    gold = squad.read_gold_answers(args.predict_file) if args.do_eval else None
    tokenizer = BertTokenizer(args.vocab_file, do_lower_case=args.do_lower_case)
    warning = casing_warning(tokenizer.vocab, args.vocab_file, args.do_lower_case)
    if warning:
        log(f"warning: {warning}")
    model = load_model(args, log)
    training.check_model_fits(model.config, len(tokenizer.vocab), args.vocab_file, args.max_seq_length)
    model.to(env.device)
    utils.set_seed(args.seed + env.rank)  # dropout differs per process; the weights above are the same everywhere
    summary: dict = {}

    if args.do_train:
        features = build_features(args, args.train_file, train_examples, tokenizer, True, env, log, collective=True)
        tensors = feature_tensors(features, with_positions=True)
        result = train(args, model, tensors, env, logger)
        summary.update(e2e_train_time=result.seconds, global_step=result.steps, final_loss=result.loss,
                       training_sequences_per_second=result.sequences / max(result.seconds, 1e-9))
        if env.is_main and not args.skip_checkpoint:
            save_model(model, output_dir, args.vocab_file, result.steps)
            log(f"saved {output_dir / 'model.pt'} and {output_dir / 'hf_model'}")

    if args.do_predict and env.is_main:  # process 0 predicts alone: the others wait at the barrier below
        summary.update(predict(args, model, tokenizer, env, logger, log, output_dir, predict_examples, gold))

    utils.barrier(env)
    if env.is_main:
        logger.log("FINAL", summary)
        print(json.dumps(summary, indent=2), flush=True)
    logger.close()
    utils.end_process_group()
    return summary


def predict(args, model, tokenizer, env, logger, log, output_dir: Path, examples, gold) -> dict:
    """Predictions for `examples` (those of --predict_file) and, with --do_eval, their scores against `gold`."""
    features = build_features(args, args.predict_file, examples, tokenizer, False, env, log, collective=False)
    results, seconds = predict_logits(model, features, args.predict_batch_size, args.precision, env.device,
                                      progress=not args.disable_progress_bar)
    predictions, nbest, null_odds = squad.get_predictions(
        examples, features, results, args.n_best_size, args.max_answer_length, args.do_lower_case,
        args.version_2_with_negative, args.null_score_diff_threshold)
    write_predictions(output_dir, predictions, nbest, null_odds, args.version_2_with_negative)
    out = {"e2e_inference_time": seconds, "inference_sequences_per_second": len(features) / max(seconds, 1e-9),
           "predicted_questions": len(predictions)}
    if not args.do_eval:
        return out
    metrics = squad.evaluate(gold, predictions, args.version_2_with_negative,
                             null_odds if args.version_2_with_negative else None)
    results_json = {"eval": metrics}
    if args.eval_script:
        results_json["eval_script"] = run_eval_script(args.eval_script, args.predict_file, output_dir,
                                                      args.version_2_with_negative)
    utils.atomic_write_json(output_dir / "eval_results.json", results_json)
    logger.log("EVAL", metrics)
    if "eval_script" in results_json:
        logger.log("EVAL_SCRIPT", results_json["eval_script"])
    if args.version_2_with_negative:
        out.update(exact_match=metrics["exact"], F1=metrics["f1"])
    else:
        out.update(exact_match=metrics["exact_match"], F1=metrics["f1"])
    return out


if __name__ == "__main__":
    main()
