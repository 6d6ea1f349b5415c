"""Extract BERT's contextual features: the hidden states of chosen layers for every WordPiece token of every line.

    python extract_features.py --input_file input.txt --output_file features.jsonl \
        --init_checkpoint results/SQuAD/hf_model --layers -1,-2,-3,-4 --max_seq_length 128 --batch_size 32
    python extract_features.py ... --output_file features.h5        (HDF5, streamed: for large runs)

Input: one text a line, or two separated by " ||| " (a pair: [CLS] A [SEP] B [SEP], token types 0 and 1, cut
longest-first to --max_seq_length; a single text is cut to --max_seq_length - 2). Every line is an example, a
blank one included ([CLS] [SEP]), numbered from 0 in file order.

--layers counts as Google's extract_features.py: over the outputs of the encoder's layers, -1 the last, -2 the one
before, 0 the first layer's output (not the embeddings); a 12-layer model takes -12..11. --init_checkpoint takes
any checkpoint the loader reads (ckpt_<step>.pt, an NVIDIA .pt, a fine-tuned model.pt, a Hugging Face directory);
heads are left out, only the encoder runs.

Outputs (the format from --format, else from the --output_file suffix: .jsonl/.json, .npz, .h5/.hdf5):
  jsonl  one JSON object a line, Google's layout: {"linex_index": 0, "features": [{"token": "[CLS]",
         "layers": [{"index": -1, "values": [0.1234, ...]}, ...]}, ...]}, values rounded to --decimals
  npz    numpy arrays: features [tokens, layers, hidden] (--dtype), offsets [lines + 1] (line i is rows
         offsets[i]:offsets[i+1]), token_ids, token_type_ids, tokens (strings), layers (the indices of axis 1);
         np.load(path) reads it without pickle
  hdf5   the same datasets in an HDF5 file, written batch by batch (memory stays flat)
Every format is written to a temporary file and renamed when complete.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
import torch

from bert_recipe.io import atomic_io, cli, flags
from bert_recipe.io.checkpoint_io import CheckpointError, from_pretrained
from bert_recipe.io.flags import flag
from bert_recipe.prediction import predict
from bert_recipe.training import precision_policy
from modeling import BertModel
from tokenization import BertTokenizer, vocab_is_uncased

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".npz": "npz", ".h5": "hdf5", ".hdf5": "hdf5"}
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")

# ----------------------------------------------------------------------------------------------------------------
# Arguments


@dataclass(frozen=True)
class Files:
    """What to read and where the features go."""

    input_file: str | None = flag(None, required=True)
    """one text a line; 'A ||| B' for a pair"""
    output_file: str | None = flag(None, required=True)
    """features.jsonl, features.npz or features.h5"""
    format: Literal["auto", "jsonl", "npz", "hdf5"] = "auto"
    """auto: from the --output_file suffix"""
    layers: str = "-1,-2,-3,-4"
    """comma-separated layer indices (Google's: -1 is the last encoder layer, 0 the first)"""
    decimals: int = 6
    """jsonl: round values to N decimals (-1: no rounding)"""
    dtype: Literal["float32", "float16"] = "float32"
    """npz/hdf5: the features' type"""


@dataclass(frozen=True)
class Model:
    """The encoder and its vocabulary."""

    init_checkpoint: str | None = flag(None, required=True)
    """ckpt_<step>.pt, an NVIDIA .pt, a fine-tuned model.pt, or a Hugging Face directory"""
    config_file: str | None = flag(None, "--bert_config_file")
    """bert_config.json; default: the config inside or beside --init_checkpoint"""
    vocab_file: str | None = None
    """vocab.txt; default: vocab.txt in or beside the checkpoint"""
    do_lower_case: bool | None = flag(None, action=argparse.BooleanOptionalAction)
    """lower-case the input; default: yes when the vocabulary has no capital letters"""
    max_seq_length: int = 128
    """tokens per line, [CLS] and [SEP] included"""


@dataclass(frozen=True)
class ExtractRuntime(predict.ReadRuntime):
    """The runtime flags with this command's batch."""

    batch_size: int = 32
    """lines per forward pass"""
    disable_progress_bar: bool = False
    """no tqdm bar"""


@dataclass(frozen=True)
class ExtractConfig(flags.Config):
    """Every flag of extract_features.py."""

    files: Files = field(default_factory=Files)
    """input and output"""
    model: Model = field(default_factory=Model)
    """model"""
    runtime: ExtractRuntime = field(default_factory=ExtractRuntime)
    """runtime"""

    def rules(self) -> list[tuple[bool, str]]:
        """Sizes that must be positive."""
        sizes = {"batch_size": self.runtime.batch_size, "max_seq_length": self.model.max_seq_length}
        return [(value < 1, f"--{name} must be positive, got {value}") for name, value in sizes.items()]


def parse_layers(text: str, num_layers: int) -> list[int]:
    """'-1,-2' -> [-1, -2], each checked against the model's depth (Google's indexing, -L..L-1)."""
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise cli.InputError(f"--layers {text!r}: expected comma-separated integers such as -1,-2,-3,-4") from None
    if not layers:
        raise cli.InputError("--layers is empty: give indices such as -1,-2,-3,-4")
    bad = [i for i in layers if not -num_layers <= i < num_layers]
    if bad:
        raise cli.InputError(
            f"--layers {bad} out of range for a {num_layers}-layer model: use {-num_layers}.."
            f"{num_layers - 1} (-1 is the last layer)"
        )
    return layers


def _attach_layers(argv: list[str]) -> list[str]:
    """`--layers -1,-2` -> `--layers=-1,-2`: argparse takes a value starting with '-' for an option unless it is a
    single negative number, and Google's documented spelling is `--layers -1,-2,-3,-4`."""
    out = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--layers" and out and out[-1] == "--layers":
            out[-1] = f"--layers={arg}"
        else:
            out.append(arg)
    return out


def output_format(files: Files) -> str:
    if files.format != "auto":
        return files.format
    suffix = Path(files.output_file).suffix.lower()
    if suffix not in FORMATS:
        raise cli.InputError(
            f"--output_file {files.output_file}: cannot tell the format from "
            f"{suffix or 'no suffix'!r}; use {', '.join(FORMATS)} or --format"
        )
    return FORMATS[suffix]


# ----------------------------------------------------------------------------------------------------------------
# Input


def read_lines(path: str | Path) -> list[dict]:
    """Every line as {"text_a", "text_b"} (text_b None for a single text), split at " ||| " as Google's."""
    file = Path(path)
    if file.is_dir():
        raise cli.InputError(f"--input_file {path} is a folder: name a text file, one text a line")
    if not file.is_file():
        raise cli.InputError(f"--input_file {path} not found")
    try:
        data = file.read_bytes()
    except OSError as e:
        raise cli.InputError(f"--input_file {path} cannot be read ({e.strerror}): check its permissions") from None
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, data.index(b"\0"), data.index(b"\0") + 1, "NUL byte")
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise cli.InputError(
            f"--input_file {path} is not UTF-8 text (byte {e.start}): give UTF-8 text, one text a line"
        ) from None
    items = []
    for line in io.StringIO(text, newline=None):  # universal newlines, as reading the file in text mode
        line = line.strip()
        match = _PAIR.match(line)
        items.append(
            {"text_a": match.group(1), "text_b": match.group(2)} if match else {"text_a": line, "text_b": None}
        )
    return items


# ----------------------------------------------------------------------------------------------------------------
# Writers: one interface (add a batch of lines, close), three formats


class JsonlWriter:
    def __init__(self, f, layers: list[int], decimals: int):
        self.f, self.layers, self.decimals = f, layers, decimals

    def add(self, index: int, tokens: list[str], ids: np.ndarray, types: np.ndarray, features: np.ndarray) -> None:
        values = features.astype(np.float64)  # [T, layers, H]; float64 so that rounding prints short numbers
        if self.decimals >= 0:
            values = values.round(self.decimals) + 0.0  # + 0.0 turns the -0.0 of rounding into 0.0
        values = values.tolist()
        record = {
            "linex_index": index,
            "features": [
                {"token": token, "layers": [{"index": layer, "values": row[k]} for k, layer in enumerate(self.layers)]}
                for token, row in zip(tokens, values)
            ],
        }
        self.f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        pass


class ArrayWriter:
    """npz: the arrays collected in memory and written at the end."""

    def __init__(self, f, layers: list[int], dtype: str):
        self.f, self.layers, self.dtype = f, layers, dtype
        self.features, self.ids, self.types, self.tokens, self.lengths = [], [], [], [], []

    def add(self, index, tokens, ids, types, features) -> None:
        self.features.append(features.astype(self.dtype))
        self.ids.append(ids.astype(np.int32))
        self.types.append(types.astype(np.int8))
        self.tokens.extend(tokens)
        self.lengths.append(len(tokens))

    def close(self) -> None:
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(self.lengths)
        np.savez(
            self.f,
            features=np.concatenate(self.features),
            offsets=offsets,
            token_ids=np.concatenate(self.ids),
            token_type_ids=np.concatenate(self.types),
            tokens=np.array(self.tokens, dtype=str),
            layers=np.array(self.layers, dtype=np.int64),
        )


class Hdf5Writer:
    """HDF5: resizable datasets, appended batch by batch."""

    def __init__(self, f, layers: list[int], dtype: str, hidden_size: int):
        import h5py

        self.h5 = h5py.File(f, "w")
        self.h5.create_dataset("layers", data=np.array(layers, dtype=np.int64))
        self.features = self.h5.create_dataset(
            "features",
            (0, len(layers), hidden_size),
            dtype=dtype,
            maxshape=(None, len(layers), hidden_size),
            chunks=(64, len(layers), hidden_size),
        )
        self.ids = self.h5.create_dataset("token_ids", (0,), dtype=np.int32, maxshape=(None,), chunks=(4096,))
        self.types = self.h5.create_dataset("token_type_ids", (0,), dtype=np.int8, maxshape=(None,), chunks=(4096,))
        self.tokens = self.h5.create_dataset(
            "tokens", (0,), dtype=h5py.string_dtype(), maxshape=(None,), chunks=(4096,)
        )
        self.offsets = [0]

    def add(self, index, tokens, ids, types, features) -> None:
        n, start = len(tokens), self.offsets[-1]
        for dataset, values in (
            (self.features, features),
            (self.ids, ids),
            (self.types, types),
            (self.tokens, np.array(tokens, dtype=object)),
        ):
            dataset.resize(start + n, axis=0)
            dataset[start : start + n] = values
        self.offsets.append(start + n)

    def close(self) -> None:
        self.h5.create_dataset("offsets", data=np.array(self.offsets, dtype=np.int64))
        self.h5.close()


@contextlib.contextmanager
def open_writer(path: str | Path, fmt: str, layers: list[int], files: Files, hidden_size: int) -> Iterator:
    """A writer on a temporary file beside `path`, renamed onto it when the block ends without an error."""
    if fmt == "hdf5":
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise cli.InputError("--format hdf5 needs h5py (pip install h5py); or write .npz / .jsonl") from None
    mode = "w" if fmt == "jsonl" else "w+b"
    with atomic_io.atomic_open(path, mode, **({"encoding": "utf-8"} if fmt == "jsonl" else {})) as f:
        if fmt == "jsonl":
            writer = JsonlWriter(f, layers, files.decimals)
        elif fmt == "npz":
            writer = ArrayWriter(f, layers, files.dtype)
        else:
            writer = Hdf5Writer(f, layers, files.dtype, hidden_size)
        yield writer
        writer.close()


# ----------------------------------------------------------------------------------------------------------------
# Extraction


@torch.inference_mode()
def extract(
    model, tokenizer, items: list[dict], layers: list[int], writer, *, max_seq_length: int, runtime: predict.Runtime
) -> int:
    """Run the encoder over `items` in batches of `runtime.batch_size` (each padded to its longest line), on
    `runtime.device` under `runtime.precision`, and hand every line's tokens and features [tokens, len(layers), H]
    to `writer.add`, in input order. Returns the number of tokens written."""
    from tqdm import tqdm

    model.eval()
    written, batch_size, precision = 0, runtime.batch_size, runtime.precision
    device = next(model.parameters()).device if runtime.device is None else torch.device(runtime.device)
    for lo in tqdm(range(0, len(items), batch_size), desc="extract", unit="batch", disable=not runtime.progress):
        encoded = predict.encode_pairs(tokenizer, items[lo : lo + batch_size], max_seq_length)
        longest = max(len(ids) for ids, _ in encoded)
        ids = np.zeros((len(encoded), longest), dtype=np.int64)
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        for row, (x, t) in enumerate(encoded):
            ids[row, : len(x)], types[row, : len(t)], mask[row, : len(x)] = x, t, 1
        batch = [torch.from_numpy(a).to(device) for a in (ids, types, mask)]
        with precision_policy.autocast(precision, device):
            _, _, hidden_states = model(*batch, output_hidden_states=True)
        encoder_layers = hidden_states[1:]  # Google's indexing: the layers' outputs, not the embeddings
        chosen = torch.stack([encoder_layers[i] for i in layers], dim=2).float().cpu().numpy()  # [B, S, layers, H]
        for row, (x, t) in enumerate(encoded):
            n = len(x)
            writer.add(lo + row, tokenizer.convert_ids_to_tokens(x), np.asarray(x), np.asarray(t), chosen[row, :n])
            written += n
    return written


def main(argv: list[str] | None = None) -> dict:
    """The summary; bad input, a checkpoint that cannot be read safely or a full disk end the run with one line
    on stderr and exit status 1 (--debug: the traceback)."""
    with cli.script_errors("extract_features.py", argv):
        return _main(argv)


def _main(argv: list[str] | None) -> dict:
    argv = _attach_layers(sys.argv[1:] if argv is None else list(argv))
    cfg = flags.parse(ExtractConfig, "extract_features.py", __doc__, argv)
    fmt = output_format(cfg.files)
    vocab_file = predict.resolve_model_files(cfg.model)
    cli.check_output_path(cfg.files.output_file, "--output_file")  # before the work, not at the final rename
    items = read_lines(cfg.files.input_file)
    if not items:
        raise cli.InputError(f"--input_file {cfg.files.input_file} is empty: give one text a line")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    device = torch.device("cuda" if torch.cuda.is_available() and not cfg.runtime.no_cuda else "cpu")
    precision = precision_policy.setup(cfg.runtime.precision, device, "extract_features.py", precision_policy.READ).name
    tokenizer = BertTokenizer(vocab_file, do_lower_case=True)
    do_lower_case = vocab_is_uncased(tokenizer.vocab) if cfg.model.do_lower_case is None else cfg.model.do_lower_case
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case)
    try:
        model = from_pretrained(
            BertModel, cfg.model.init_checkpoint, config=cfg.model.config_file, log=log, add_pooling_layer=False
        )
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        raise cli.InputError(f"--init_checkpoint {cfg.model.init_checkpoint}: {cli.describe_error(e)}") from e
    config = model.config
    predict.check_model_fits(config, len(tokenizer.vocab), vocab_file, cfg.model.max_seq_length)
    if cfg.model.max_seq_length < 3:
        raise cli.InputError(f"--max_seq_length must be at least 3 ([CLS] A [SEP]), got {cfg.model.max_seq_length}")
    layers = parse_layers(cfg.files.layers, config.num_hidden_layers)
    model.to(device)
    with open_writer(cfg.files.output_file, fmt, layers, cfg.files, config.hidden_size) as writer:
        runtime = predict.Runtime(
            cfg.runtime.batch_size, device, precision, progress=not cfg.runtime.disable_progress_bar
        )
        tokens = extract(
            model, tokenizer, items, layers, writer, max_seq_length=cfg.model.max_seq_length, runtime=runtime
        )
    summary = {
        "lines": len(items),
        "tokens": tokens,
        "layers": layers,
        "hidden_size": config.hidden_size,
        "format": fmt,
        "output_file": cfg.files.output_file,
        "precision": precision,
    }
    log(
        f"extract_features.py: {len(items)} lines, {tokens} tokens x {len(layers)} layers x {config.hidden_size} "
        f"-> {cfg.files.output_file} ({fmt})"
    )
    return summary


if __name__ == "__main__":
    main()
