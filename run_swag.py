"""Fine-tune and evaluate BERT on SWAG, multiple choice: which of four endings follows a context.

    python run_swag.py --data_dir swag/data --init_checkpoint ckpt_8601.pt --config_file bert_config.json \
        --vocab_file vocab.txt --do_lower_case --output_dir results/SWAG --do_train --do_eval --precision auto
    torchrun --nproc_per_node=8 run_swag.py ...        (DistributedDataParallel, one process per GPU)

--data_dir holds SWAG's train.csv and val.csv (and test.csv for `--do_predict --predict_split test`) as released
in github.com/rowanz/swagaf (processors/swag.py reads them). --init_checkpoint takes what run_glue.py takes: a
ckpt_<step>.pt, an NVIDIA checkpoint, a Hugging Face directory (then --config_file and --vocab_file default to
the ones inside it), or the model.pt / hf_model/ this script wrote.

The model is BertForMultipleChoice (modeling.py): each ending is scored from the pooled output of its own
[CLS] sent1 [SEP] sent2 ending [SEP] sequence, and the scores of an example's endings go through a softmax; the
metric is accuracy. Training is the shared fine-tuning loop (training.finetune: BertAdam, linear warm-up and
decay, gradient accumulation, DDP, fp16 loss scaling / bf16 autocast), fed batches of examples padded to [batch,
choices, longest sequence].
--train_batch_size and --eval_batch_size count examples (each is 4 sequences).

Outputs in --output_dir:
    results.json       accuracy and loss on val, training loss/throughput (examples/s), eval latency percentiles
    predictions.json   (--do_predict) example id -> {"label": index of the chosen ending, "probabilities": [...]}
    model.pt           (--do_train) {"model": tensors under Hugging Face names, "config", "task": "swag",
                       "num_choices"}; loads with checkpoint_io.from_pretrained(BertForMultipleChoice, ...)
    hf_model/          (--do_train) the same model as a transformers directory (BertForMultipleChoice)
    dllogger.json      JSON-lines log (--json-summary to move it)
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import training
import precision as precision_policy  # the module; `precision` is the resolved name in these scripts
import utils
from checkpoint_io import export_state_dict, from_pretrained, save_hf_directory
from modeling import BertForMultipleChoice
from processors.swag import EncodedChoices, SwagExample, accuracy, encode_examples, get_examples

# ----------------------------------------------------------------------------------------------------------------
# Arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_swag.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data_dir", required=True, help="SWAG's folder: train.csv, val.csv (test.csv)")
    g.add_argument("--output_dir", required=True, help="where results, predictions and the model go")
    g.add_argument("--max_train_examples", type=int, default=None,
                   help="train on the first N training examples only (quick CPU runs)")
    g.add_argument("--max_eval_examples", type=int, default=None,
                   help="evaluate/predict on the first N examples of val.csv (test.csv) only")
    g.add_argument("--predict_split", choices=("val", "test"), default="val",
                   help="what --do_predict writes to predictions.json: val.csv or the unlabelled test.csv")

    g = p.add_argument_group("model")
    g.add_argument("--init_checkpoint", required=True,
                   help="ckpt_<step>.pt, an NVIDIA .pt, our fine-tuned model.pt, or a Hugging Face directory")
    g.add_argument("--config_file", default=None,
                   help="bert_config.json; default: the config inside or beside --init_checkpoint")
    g.add_argument("--vocab_file", default=None, help="vocab.txt; default: vocab.txt inside a checkpoint directory")
    g.add_argument("--do_lower_case", action="store_true", help="lower-case the input (uncased models)")
    g.add_argument("--max_seq_length", type=int, default=128,
                   help="longest [CLS] sent1 [SEP] sent2 ending [SEP] after WordPiece; longer ones are truncated "
                        "longest-first")
    g.add_argument("--bert_model", default=None, help="accepted for compatibility with the original; unused")

    g = p.add_argument_group("what to run")
    g.add_argument("--do_train", action="store_true", help="fine-tune on train.csv")
    g.add_argument("--do_eval", action="store_true", help="score val.csv")
    g.add_argument("--do_predict", action="store_true", help="write predictions.json (see --predict_split)")
    g.add_argument("--skip_checkpoint", action="store_true", help="do not save the fine-tuned model")

    g, _ = training.add_finetuning_arguments(p, seed=42, log_freq=10)
    g.add_argument("--eval_batch_size", type=int, default=64, help="examples per evaluation batch")
    # SWAG counts examples (4 sequences each); the BERT paper's SWAG settings: batch 16, learning rate 2e-5
    p.set_defaults(train_batch_size=16, learning_rate=2e-5)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not (args.do_train or args.do_eval or args.do_predict):
        raise SystemExit("nothing to do: pass at least one of --do_train, --do_eval, --do_predict")
    if args.eval_batch_size < 1:
        raise SystemExit(f"--eval_batch_size must be positive, got {args.eval_batch_size}")
    if args.max_seq_length < 3:
        raise SystemExit(f"--max_seq_length must be at least 3, got {args.max_seq_length}")
    try:
        training.check_finetuning_arguments(args)
    except utils.InputError as e:
        raise SystemExit(f"run_swag.py: {e}") from None
    return args


# ----------------------------------------------------------------------------------------------------------------
# Batches: [B, C, S], padded to the longest choice of the batch


class SwagDataset(torch.utils.data.Dataset):
    """Example i -> ([(input_ids [L_j], token_type_ids [L_j]) per choice j], label or None, i)."""

    def __init__(self, encoded: EncodedChoices):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int):
        label = None if self.encoded.labels is None else self.encoded.labels[i]
        return self.encoded.example(i), label, i


def collate(items) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids, attention_mask [B, C, S_max] (S_max: the batch's longest choice), labels [B]
    when the examples have labels, index [B] (example numbers)."""
    choices = len(items[0][0])
    longest = max(len(ids) for example, _, _ in items for ids, _ in example)
    input_ids = np.zeros((len(items), choices, longest), dtype=np.int64)  # 0 = [PAD]
    token_types = np.zeros_like(input_ids)
    mask = np.zeros_like(input_ids)
    for row, (example, _, _) in enumerate(items):
        for j, (ids, types) in enumerate(example):
            input_ids[row, j, :len(ids)] = ids
            token_types[row, j, :len(ids)] = types
            mask[row, j, :len(ids)] = 1
    batch = {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_types),
             "attention_mask": torch.from_numpy(mask), "index": torch.tensor([i for _, _, i in items])}
    if items[0][1] is not None:
        batch["labels"] = torch.tensor(np.stack([label for _, label, _ in items]))
    return batch


def choice_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy over each example's choices."""
    return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["labels"]).loss


# ----------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.inference_mode()
def predict_logits(model, dataset: SwagDataset, args, env: utils.DistEnv, desc: str):
    """Logits [N, C] in the examples' order, from length-sorted batches; and each batch's wall time in ms."""
    from tqdm import tqdm

    model.eval()
    batches = training.length_sorted_batches(dataset.encoded.lengths, args.eval_batch_size)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches, collate_fn=collate,
                                         num_workers=args.num_workers)
    logits = np.zeros((len(dataset), dataset.encoded.num_choices), dtype=np.float32)
    batch_ms = []
    start = time.perf_counter()
    for batch in tqdm(loader, desc=desc, unit="batch", disable=args.disable_progress_bar or not env.is_main):
        index = batch["index"].numpy()
        batch = training.to_device(batch, env.device)
        tic = time.perf_counter()
        with precision_policy.autocast(args.precision, env.device):
            (out,) = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        logits[index] = out.float().cpu().numpy()  # the copy to the host synchronises the device
        batch_ms.append((time.perf_counter() - tic) * 1000)
    return logits, batch_ms, time.perf_counter() - start


def evaluate_and_predict(args, model, tokenizer, eval_sets: dict[str, list[SwagExample]], env, logger, log) -> dict:
    """Accuracy and loss on the labelled set, predictions.json for --predict_split; {"eval", "inference"}."""
    out: dict = {}
    predictions: dict = {}
    all_ms, all_examples, all_seconds = [], 0, 0.0
    for name, examples in eval_sets.items():
        encoded = encode_examples(examples, tokenizer, args.max_seq_length)
        logits, batch_ms, seconds = predict_logits(model, SwagDataset(encoded), args, env, desc=name)
        all_ms += batch_ms
        all_examples += len(examples)
        all_seconds += seconds
        preds = logits.argmax(-1)
        if args.do_predict and name == args.predict_split:
            probs = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
            predictions.update({e.guid: {"label": int(p), "probabilities": [round(float(x), 6) for x in prob]}
                                for e, p, prob in zip(examples, preds, probs)})
        if args.do_eval and encoded.labels is not None:
            loss = float(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(encoded.labels)))
            metrics = {"acc": accuracy(preds, encoded.labels), "loss": loss, "examples": len(examples)}
            out.setdefault("eval", {})[name] = metrics
            logger.log(("eval", name), metrics)
            log(f"SWAG {name}: accuracy {metrics['acc']:.4f}, loss {loss:.4f} ({len(examples)} examples, "
                f"chance {1 / encoded.num_choices:.4f})")
    out["inference"] = training.latency_summary(all_ms, all_examples, all_seconds, args.eval_batch_size)
    out["inference"]["examples_per_second"] = out["inference"].pop("sequences_per_second")
    out["inference"]["examples"] = out["inference"].pop("sequences")
    log(f"inference: p50 {out['inference']['latency_ms_p50']:.1f} ms/batch, "
        f"{out['inference']['examples_per_second']:.1f} examples/s")
    if args.do_predict:
        utils.atomic_write_json(Path(args.output_dir) / "predictions.json", predictions)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Saving


def save_model(model: BertForMultipleChoice, num_choices: int, output_dir: Path, vocab_file: str) -> None:
    """model.pt (our format, weights_only-loadable) and hf_model/ (transformers' BertForMultipleChoice)."""
    utils.atomic_torch_save({"model": export_state_dict(model), "config": model.config.to_dict(), "task": "swag",
                             "num_choices": num_choices}, output_dir / "model.pt")
    save_hf_directory(model, output_dir / "hf_model", vocab_file)


# ----------------------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> dict:
    """The results (also in results.json); bad input, a checkpoint that does not fit or cannot be read safely, a
    malformed data file or a full disk end the run with one line on stderr and exit status 1 (--debug: the
    traceback)."""
    with utils.script_errors("run_swag.py", argv):
        return run(parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    training.resolve_model_files(args)
    env = utils.init_distributed(no_cuda=args.no_cuda)
    choice = precision_policy.setup(args.precision, env.device, "run_swag.py", precision_policy.purpose_of(args),
                                    show=env.is_main)
    args.precision, args.precision_reason = choice.name, choice.reason
    output_dir = Path(args.output_dir)
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
    logger = training.RunLogger(args.json_summary or output_dir / "dllogger.json", None, enabled=env.is_main,
                                progress=not args.disable_progress_bar)
    log = print if env.is_main else (lambda *_: None)
    logger.log("PARAMETER", dict(vars(args)))

    # Read every file first: a missing val.csv should fail before minutes of training, not after.
    train_examples = get_examples(args.data_dir, "train")[:args.max_train_examples] if args.do_train else []
    eval_sets = {}
    if args.do_eval or (args.do_predict and args.predict_split == "val"):
        eval_sets["val"] = get_examples(args.data_dir, "val")[:args.max_eval_examples]
    if args.do_predict and args.predict_split == "test":
        eval_sets["test"] = get_examples(args.data_dir, "test")[:args.max_eval_examples]
    for name, examples in {"train": train_examples, **eval_sets}.items():
        if (name != "train" or args.do_train) and not examples:
            raise SystemExit(f"SWAG {name} set in {args.data_dir} has no examples")

    from tokenization import BertTokenizer, casing_warning

    tokenizer = BertTokenizer(args.vocab_file, do_lower_case=args.do_lower_case)
    warning = casing_warning(tokenizer.vocab, args.vocab_file, args.do_lower_case)
    if warning:
        log(f"warning: {warning}")
    utils.set_seed(args.seed)  # the same fresh classifier on every process
    load_report: list[str] = []
    model = from_pretrained(BertForMultipleChoice, args.init_checkpoint, config=args.config_file,
                            log=load_report.append)
    for line in load_report:
        log(line)
    training.check_model_fits(model.config, len(tokenizer), args.vocab_file, args.max_seq_length)
    if not args.do_train and any("initialised fresh" in line and "classifier." in line for line in load_report):
        log(f"warning: {args.init_checkpoint} has no multiple-choice classifier, so evaluation and predictions come "
            "from a random head; pass a fine-tuned model.pt or hf_model/ (or add --do_train)")
    model.to(env.device)
    results: dict = {"task": "swag", "init_checkpoint": args.init_checkpoint, "precision": args.precision,
                     "precision_reason": args.precision_reason,
                     "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": str(env.device),
                     "world_size": env.world_size, "max_seq_length": args.max_seq_length}

    if args.do_train:
        encoded = encode_examples(train_examples, tokenizer, args.max_seq_length)
        log(f"SWAG train: {len(encoded)} examples x {encoded.num_choices} choices, longest choice "
            f"{encoded.lengths.mean():.1f} tokens on average, {encoded.truncated} choices truncated to "
            f"{args.max_seq_length}")
        utils.set_seed(args.seed + env.rank)  # different dropout masks on each process
        result = training.finetune(model, SwagDataset(encoded), collate, choice_loss, args, env, logger)
        results["train"] = {"examples": len(encoded), "steps": result.steps, "final_loss": result.loss,
                            "seconds": result.seconds, "examples_per_second": result.sequences / result.seconds,
                            "train_batch_size": args.train_batch_size * env.world_size,
                            "epochs": args.num_train_epochs if args.max_steps <= 0 else None}
        log(f"trained {result.steps} steps in {result.seconds:.1f} s "
            f"({result.sequences / result.seconds:.1f} examples/s), final loss {result.loss:.4f}")
        if env.is_main and not args.skip_checkpoint:
            save_model(model, encoded.num_choices, output_dir, args.vocab_file)

    utils.barrier(env)
    if env.is_main and eval_sets:
        results.update(evaluate_and_predict(args, model, tokenizer, eval_sets, env, logger, log))
    if env.is_main:
        utils.atomic_write_json(output_dir / "results.json", results)
        final = {f"{name}:{k}": v for name, m in results.get("eval", {}).items() for k, v in m.items()}
        if "train" in results:
            final.update(training_examples_per_second=results["train"]["examples_per_second"],
                         e2e_train_time=results["train"]["seconds"])
        logger.log("FINAL", final)
    logger.close()
    utils.end_process_group()
    return results


if __name__ == "__main__":
    main()
