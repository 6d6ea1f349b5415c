"""Frozen-encoder linear probe: how much of a GLUE single-sentence task (SST-2, CoLA) a checkpoint's features
already hold, before any fine-tuning.

    python -m bench.linear_probe --checkpoint pretrained=ckpt_33020.pt --checkpoint random=random_init/ckpt_0.pt \
        --vocab_file vocab.txt --task sst-2 --out results/linear_probe.json

Fine-tuning moves every weight, so "the pre-trained model fine-tunes no better than random initialisation" can
mean two things: its features hold nothing the task needs, or the fine-tuning does not use what they hold. The probe
tells them apart. Each checkpoint's encoder runs once over the task's train and dev sentences (fp32, eval mode, no
gradient) and gives two features per sentence: one layer's (--layer, the last by default) vector at [CLS] and the
mean of its vectors over the real tokens. A logistic regression (scikit-learn, on standardised features) is
fitted on the training sentences, its inverse regularisation C chosen from --cs on the last --holdout of them, then
refitted on all of them and scored on dev. The same code, data and classifier for every checkpoint, side by side
with the majority class; JSON out and a Markdown table printed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.study_utils import DATA, REPO
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.checkpoint_io import from_pretrained
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.prediction.predict import length_sorted_batches, pad_sequences
from bert_recipe.tasks.glue import encode_examples, get_dev_examples, get_task, get_train_examples
from modeling import BertModel
from tokenization import BertTokenizer

FOLDER = {"sst-2": "glue-sst2", "cola": "glue-cola"}


def sentence_features(model, encoded, batch_size: int = 128, layer: int = -1) -> dict[str, np.ndarray]:
    """{"cls": [N, H], "mean": [N, H]} float32: one encoder layer's output (`layer` counts as extract_features.py's
    --layers: -1 the last, 0 the first layer's output) at [CLS], and its mean over each sentence's real tokens, from
    a bare BertModel in eval mode over `encoded` (tasks.glue.EncodedExamples). Batches are length-sorted
    (little padding); rows come back in the examples' order."""
    n, hidden = len(encoded), model.config.hidden_size
    out = {"cls": np.zeros((n, hidden), np.float32), "mean": np.zeros((n, hidden), np.float32)}
    model.eval()
    with torch.no_grad():
        for idx in length_sorted_batches(encoded.lengths, batch_size):
            batch = pad_sequences([encoded.example(i) for i in idx], (len(idx),))
            states = model(**batch, output_hidden_states=True).hidden_states  # embeddings, then each layer
            seq = states[1:][layer]  # [B, S, H] (padding positions are masked below)
            mask = batch["attention_mask"].unsqueeze(-1).to(seq.dtype)  # [B, S, 1]
            out["cls"][idx] = seq[:, 0].float().numpy()
            out["mean"][idx] = ((seq * mask).sum(1) / mask.sum(1)).float().numpy()  # [B, H]
    return out


def probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    dev_x: np.ndarray,
    dev_y: np.ndarray,
    cs: list[float],
    holdout: float,
    seed: int = 0,
) -> dict:
    """Logistic regression on standardised features: C picked on the last `holdout` of train, refitted on all of
    train, scored on dev. Returns dev accuracy, the chosen C and each C's held-out accuracy."""
    from sklearn.linear_model import LogisticRegression  # optional and slow to import: only where a probe is fitted
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    def fit(x, y, c):
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=3000, random_state=seed)).fit(x, y)

    # One BLAS thread: L-BFGS on a few thousand rows makes hundreds of tiny matrix-vector products, which BLAS's
    # threads only slow down, and on a busy machine badly (1,500 x 384 features, 5 fits on 2 cores at load 4:
    # 3.7 s with OpenBLAS's 2 threads, 0.2 s with 1, the same accuracies and C).
    with threadpool_limits(limits=1, user_api="blas"):
        cut = int(len(train_x) * (1 - holdout))
        heldout = {c: float(fit(train_x[:cut], train_y[:cut], c).score(train_x[cut:], train_y[cut:])) for c in cs}
        best = max(cs, key=lambda c: (heldout[c], -c))  # ties: the stronger regularisation
        dev_accuracy = float(fit(train_x, train_y, best).score(dev_x, dev_y))
    return {"dev_accuracy": dev_accuracy, "C": best, "heldout_accuracy": {str(c): a for c, a in heldout.items()}}


def main(argv: list[str] | None = None) -> dict:
    """Bad input: one line on stderr ("linear_probe: error: ..."), exit status 1."""
    with script_errors("linear_probe", argv):
        return _main(argv)


def _main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a checkpoint to probe, named (repeatable): ckpt_<step>.pt, model.pt or a HF directory",
    )
    p.add_argument("--vocab_file", type=Path, default=None, help="default: vocab.txt beside each checkpoint")
    p.add_argument("--config_file", type=Path, default=None, help="default: inside or beside each checkpoint")
    p.add_argument("--task", default="sst-2", choices=sorted(FOLDER))
    p.add_argument("--data_dir", type=Path, default=None, help="the task's GLUE folder (default: ../shared/data)")
    p.add_argument("--max_train_examples", type=int, default=None)
    p.add_argument("--max_eval_examples", type=int, default=None)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--layer", type=int, default=-1, help="the encoder layer probed: -1 the last, 0 the first")
    p.add_argument("--cs", default="0.001,0.01,0.1,1", help="inverse regularisation strengths to choose from")
    p.add_argument("--holdout", type=float, default=0.1, help="share of train that chooses C")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: the default)")
    p.add_argument("--out", type=Path, default=REPO / "results" / "linear_probe.json")
    args = p.parse_args(argv)
    models = {}
    for item in args.checkpoint:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).exists():
            raise InputError(f"--checkpoint {item!r}: give NAME=PATH with an existing checkpoint")
        models[name] = Path(path)
    try:
        cs = [float(c) for c in args.cs.split(",")]
    except ValueError:
        raise InputError(f"--cs {args.cs!r}: give comma-separated numbers") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task(args.task)
    data_dir = args.data_dir or DATA / FOLDER[args.task]
    train = get_train_examples(data_dir, task)[: args.max_train_examples]
    dev = get_dev_examples(data_dir, task)["dev"][: args.max_eval_examples]
    results, started = {}, time.time()
    for name, path in models.items():
        vocab = args.vocab_file or (path if path.is_dir() else path.parent) / "vocab.txt"
        if not vocab.is_file():
            raise InputError(f"no vocabulary for {name}: {vocab} not found; give --vocab_file")
        tokenizer = BertTokenizer(str(vocab), do_lower_case=True)
        model = from_pretrained(BertModel, path, config=args.config_file, log=None)
        t0 = time.time()
        layers = model.config.num_hidden_layers
        if not -layers <= args.layer < layers:
            raise InputError(f"--layer {args.layer}: {name} has {layers} layers ({-layers}..{layers - 1})")
        feats = {
            split: (sentence_features(model, enc, layer=args.layer), enc.labels)
            for split, enc in (
                ("train", encode_examples(train, tokenizer, args.max_seq_length, task)),
                ("dev", encode_examples(dev, tokenizer, args.max_seq_length, task)),
            )
        }
        results[name] = {"checkpoint": str(path), "features_seconds": round(time.time() - t0, 1)}
        for kind in ("cls", "mean"):
            results[name][kind] = probe(
                feats["train"][0][kind], feats["train"][1], feats["dev"][0][kind], feats["dev"][1], cs, args.holdout
            )
    dev_labels = np.array([task.labels.index(e.label) for e in dev])
    majority = float(max(np.mean(dev_labels == k) for k in range(len(task.labels))))
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": [sys.executable, "-m", "bench.linear_probe", *(argv if argv is not None else sys.argv[1:])],
        "task": args.task,
        "layer": args.layer,
        "train_examples": len(train),
        "dev_examples": len(dev),
        "majority": majority,
        "results": results,
        "wall_seconds": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    print(markdown(report))
    return report


def markdown(report: dict) -> str:
    """The probe's table: dev accuracy of each checkpoint's [CLS] and mean-of-tokens features, beside the majority
    class, with the layer, the data sizes and the command under it."""
    lines = ["| checkpoint | dev acc., [CLS] | dev acc., mean of tokens | C ([CLS], mean) |", "|---|---|---|---|"]
    lines += [
        f"| {n} | {r['cls']['dev_accuracy']:.4f} | {r['mean']['dev_accuracy']:.4f} | {r['cls']['C']:g}, "
        f"{r['mean']['C']:g} |"
        for n, r in report["results"].items()
    ]
    lines.append(f"| majority class | {report['majority']:.4f} | {report['majority']:.4f} | |")
    lines += [
        "",
        f"{report['task'].upper()}, layer {report['layer']}, {report['train_examples']} training and "
        f"{report['dev_examples']} dev sentences, {report['date']}, {report['wall_seconds']} s. Command: "
        f"`python -m bench.linear_probe {shlex.join(report['command'][3:])}`.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
