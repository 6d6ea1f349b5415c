"""Answer questions through a Triton server: tokenize here, send batches of windows over HTTP or gRPC, turn the
logits into answers exactly as inference.py does (the same tasks/squad.py and tasks/squad_answers.py functions), print
JSON.

    PYTHONPATH=. .venv/bin/python triton/client.py --url 127.0.0.1:8000 --protocol http --export_dir DIR \
        --question "Where do the Normans live?" --context "The Normans ... in Normandy, a region in France."
    PYTHONPATH=. .venv/bin/python triton/client.py --url 127.0.0.1:8001 --protocol grpc --export_dir DIR \
        --input_file questions.json --batch_size 8 --output answers.json

--input_file: a JSON list or JSON lines of {"id"?, "question", "context"}, or a SQuAD file. --export_dir
(export_model.py's output) supplies the vocabulary, lower-casing and max_seq_length; --vocab_file and
--do_lower_case override it. --text_model sends the raw strings to the server-side `<model>_text` model instead
(model_repository.py --text_model), which does the same work in the server with its repository's settings.

Output: a JSON list with one {"id", "question", "answer", "probability", "nbest"} per question (inference.py's
format), to stdout and to --output when given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal, Sequence

import numpy as np

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_write_json
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prediction.items import read_items

# answers_from_logits stays importable from here: backend/qa_text_model.py calls it through its copy of this file.
from bert_recipe.tasks.squad import examples_from_qa_pairs
from bert_recipe.tasks.squad_answers import QASettings

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
NP_DTYPES = {"INT64": np.int64, "INT32": np.int32}


# ----------------------------------------------------------------------------------------------------------------
# Connecting: shared with perf.py (which loads this file with utils.load_triton_script).


@dataclass(frozen=True)
class Server:
    """Which server and model: a section of client.py's and perf.py's configurations."""

    url: str | None = flag(None, required=True)
    """host:port of the server's HTTP (--protocol http) or gRPC endpoint"""
    protocol: Literal["http", "grpc"] = "http"
    """how to talk to the server"""
    model_name: str = "bert_qa"
    """the tensor model to send the windows to"""
    timeout: float = 120.0
    """seconds one request may take"""


def client_module(protocol: str):
    """tritonclient.http or tritonclient.grpc (imported here: the rest of this file needs neither)."""
    if protocol == "http":
        import tritonclient.http as module
    else:
        import tritonclient.grpc as module
    return module


def input_datatypes(client, model_name: str, protocol: str) -> dict[str, str]:
    """{input name: Triton datatype (INT64, INT32, BYTES)} from the server's metadata of the model."""
    meta = (
        client.get_model_metadata(model_name)
        if protocol == "http"
        else client.get_model_metadata(model_name, as_json=True)
    )
    return {i["name"]: i["datatype"] for i in meta["inputs"]}


# ----------------------------------------------------------------------------------------------------------------
# The client


@dataclass(frozen=True)
class Inputs:
    """The questions and what tokenizes them."""

    export_dir: str | None = None
    """export_model.py output: vocab.txt and export.json"""
    vocab_file: str | None = None
    """vocab.txt; default: the one in --export_dir"""
    do_lower_case: bool | None = flag(None, action=argparse.BooleanOptionalAction)
    """lower-case the input; default: --export_dir's export.json says"""
    question: str | None = None
    """the question"""
    context: str | None = None
    """the text that holds the answer (any length)"""
    input_file: str | None = None
    """JSON list / JSON lines of {id?, question, context}, or a SQuAD file"""
    batch_size: int = 8
    """windows per request (<= the model's max_batch_size)"""


@dataclass(frozen=True)
class Windows(QASettings):
    """QASettings, with the export's max_seq_length by default."""

    max_seq_length: int | None = None
    """default: export.json's, else 384"""


@dataclass(frozen=True)
class Output:
    """Which model answers, and where the answers go besides stdout."""

    text_model: bool = False
    """send raw strings to <model_name>_text"""
    output: str | None = None
    """also write the answers here (JSON)"""


@dataclass(frozen=True)
class ClientConfig(flags.Config):
    """Every flag of client.py."""

    server: Server = field(default_factory=Server)
    inputs: Inputs = field(default_factory=Inputs)
    windows: Windows = field(default_factory=Windows)
    output: Output = field(default_factory=Output)

    ungrouped: ClassVar[tuple[str, ...]] = ("server", "inputs", "windows", "output")
    has_debug: ClassVar[bool] = False

    def rules(self) -> list[tuple[bool, str]]:
        return [(self.inputs.batch_size < 1, f"--batch_size {self.inputs.batch_size} must be >= 1")]


def items_from_args(inputs: Inputs) -> list[dict]:
    """The questions as [{"id"?, "question", "context"}]: --input_file read as inference.py reads it."""
    if inputs.input_file:
        try:
            return read_items(inputs.input_file)
        except (OSError, ValueError) as e:
            raise InputError(f"--input_file: {e}") from None
    if inputs.question is None or inputs.context is None:
        raise InputError("give --question and --context, or --input_file")
    return [{"id": "0", "question": inputs.question, "context": inputs.context}]


def tokenizer_settings(cfg: ClientConfig) -> tuple[str, bool, int]:
    """(vocab file, do_lower_case, max_seq_length) from the flags, else from --export_dir's export.json."""
    info = {}
    if cfg.inputs.export_dir:
        path = Path(cfg.inputs.export_dir) / "export.json"
        if not path.is_file():
            raise InputError(f"--export_dir {cfg.inputs.export_dir} has no export.json: run triton/export_model.py")
        info = json.loads(path.read_text(encoding="utf-8"))
    vocab = cfg.inputs.vocab_file or (
        str(Path(cfg.inputs.export_dir) / info["vocab_file"]) if info.get("vocab_file") else None
    )
    if vocab is None:
        raise InputError("no vocabulary: pass --vocab_file, or --export_dir of an export with a vocab.txt")
    lower = cfg.inputs.do_lower_case if cfg.inputs.do_lower_case is not None else info.get("do_lower_case", True)
    return vocab, lower, cfg.windows.max_seq_length or info.get("max_seq_length", 384)


class TritonQA:
    """A connection to the tensor model: `logits(features)` sends the windows in batches and returns
    {unique_id: (start_logits [S], end_logits [S])}."""

    def __init__(
        self,
        url: str,
        protocol: str,
        model_name: str,
        timeout: float = 120.0,
        expected_inputs: Sequence[str] = INPUT_NAMES,
    ):
        module = client_module(protocol)
        kwargs = {"network_timeout": timeout, "connection_timeout": timeout} if protocol == "http" else {}
        self.client = module.InferenceServerClient(url, **kwargs)
        self.module, self.protocol, self.model_name, self.timeout = module, protocol, model_name, timeout
        dtypes = input_datatypes(self.client, model_name, protocol)
        if set(dtypes) != set(expected_inputs):
            raise InputError(
                f"model {model_name} takes {sorted(dtypes)}, not {list(expected_inputs)}: is "
                "--model_name (or --text_model) right?"
            )
        self.dtype = dtypes[expected_inputs[0]]

    def infer(
        self,
        arrays: Sequence[np.ndarray],
        names: Sequence[str] = INPUT_NAMES,
        dtypes=None,
        outputs: Sequence[str] = ("start_logits", "end_logits"),
    ) -> list[np.ndarray]:
        """One request; raises tritonclient's InferenceServerException on a server-side error."""
        inputs = []
        for k, (name, array) in enumerate(zip(names, arrays)):
            tensor = self.module.InferInput(name, list(array.shape), dtypes[k] if dtypes else self.dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        requested = [self.module.InferRequestedOutput(name) for name in outputs]
        kwargs = {"client_timeout": self.timeout} if self.protocol == "grpc" else {}
        result = self.client.infer(self.model_name, inputs, outputs=requested, **kwargs)
        return [result.as_numpy(name) for name in outputs]

    def logits(self, features: Sequence, batch_size: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{unique_id: (start_logits [L], end_logits [L])} for the windows, sent batch_size at a time."""
        results = {}
        for chunk, arrays in feature_batches(features, batch_size, NP_DTYPES[self.dtype]):
            start_logits, end_logits = self.infer(arrays)
            results.update((f.unique_id, (start_logits[i], end_logits[i])) for i, f in enumerate(chunk))
        return results

    def close(self) -> None:
        self.client.close()


def feature_batches(features: Sequence, batch_size: int, dtype) -> Iterator[tuple[Sequence, list[np.ndarray]]]:
    """(windows, [input_ids, token_type_ids, attention_mask] each [b, L]) per batch, cut after the longest window
    of the batch (L), as predict.answer_questions batches them: no padding beyond it is computed or sent."""
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        longest = max(sum(f.input_mask) for f in chunk)
        yield (
            chunk,
            [
                np.array([getattr(f, k)[:longest] for f in chunk], dtype=dtype)
                for k in ("input_ids", "segment_ids", "input_mask")
            ],
        )


def answer_with_triton(
    connection: TritonQA, tokenizer, items: Sequence[dict], settings: QASettings = QASettings(), batch_size: int = 8
) -> list[dict[str, Any]]:
    """predict.answer_questions with the model on the server: the same windows, batches and post-processing
    (`settings`: the windows and answers, as inference.py's), `batch_size` windows per request."""
    examples = examples_from_qa_pairs(items)
    features = settings.features(examples, tokenizer)
    return settings.answers(examples, features, connection.logits(features, batch_size), tokenizer.do_lower_case)


def answer_with_text_model(connection: TritonQA, items: Sequence[dict], batch_size: int) -> list[dict[str, Any]]:
    """Send raw strings to the server-side `<model>_text` model; the server tokenizes and post-processes."""
    out = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        questions = np.array([[item["question"].encode("utf-8")] for item in chunk], dtype=object)
        contexts = np.array([[item["context"].encode("utf-8")] for item in chunk], dtype=object)
        answers, probabilities, nbest = connection.infer(
            [questions, contexts], ("question", "context"), ("BYTES", "BYTES"), ("answer", "probability", "nbest_json")
        )
        for i, item in enumerate(chunk):
            out.append(
                {
                    "id": str(item.get("id", start + i)),
                    "question": item["question"],
                    "answer": answers[i][0].decode("utf-8"),
                    "probability": float(probabilities[i][0]),
                    "nbest": json.loads(nbest[i][0].decode("utf-8")),
                }
            )
    return out


def main(argv=None) -> int:
    """0 with the answers on stdout (JSON); bad input or a server error: one line on stderr, exit status 1."""
    with script_errors("client.py", argv):
        return _main(argv)


def _main(argv) -> int:
    cfg = flags.parse(ClientConfig, "client.py", __doc__, argv)
    items = items_from_args(cfg.inputs)
    from tritonclient.utils import InferenceServerException

    connection = None
    try:
        if cfg.output.text_model:
            connection = TritonQA(
                cfg.server.url,
                cfg.server.protocol,
                f"{cfg.server.model_name}_text",
                cfg.server.timeout,
                expected_inputs=("question", "context"),
            )
            answers = answer_with_text_model(connection, items, cfg.inputs.batch_size)
        else:
            from tokenization import BertTokenizer

            vocab, lower, max_seq_length = tokenizer_settings(cfg)
            connection = TritonQA(cfg.server.url, cfg.server.protocol, cfg.server.model_name, cfg.server.timeout)
            answers = answer_with_triton(
                connection,
                BertTokenizer(vocab, do_lower_case=lower),
                items,
                dataclasses.replace(cfg.windows, max_seq_length=max_seq_length),
                cfg.inputs.batch_size,
            )
    except InferenceServerException as e:
        raise InputError(
            f"--url {cfg.server.url} ({cfg.server.protocol}): server error: {str(e).splitlines()[0]}"
        ) from None
    except ValueError as e:  # a bad item in --input_file
        raise InputError(f"bad input: {e}") from None
    finally:
        if connection is not None:
            connection.close()
    if cfg.output.output:
        atomic_write_json(cfg.output.output, answers)
    json.dump(answers, sys.stdout, indent=2, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
