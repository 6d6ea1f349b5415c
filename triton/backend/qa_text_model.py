"""Triton Python-backend model: raw question/context strings in, answers out, computed in the server.

model_repository.py --text_model copies this file to <repository>/<model>_text/1/model.py, with vocab.txt and
settings.json (tensor model name, input dtype, lower-casing, window and answer lengths) and qa_client.py (a copy of
triton/client.py, for its batching and answer records) beside it.

Per request row: question [1] and context [1] (BYTES, UTF-8). The model tokenizes and cuts windows with
tasks/squad.py's convert_examples_to_features, sends the windows to the tensor model (settings.json
"tensor_model", e.g. bert_qa) through Triton's business-logic scripting (BLS) in batches of at most its
max_batch_size, and turns the logits into answers with squad_answers.get_predictions, exactly as triton/client.py and
inference.py do.
Outputs per row: answer [1] (BYTES), probability [1] (FP32), nbest_json [1] (BYTES: the n-best list as JSON).

Refused with INVALID_ARG (HTTP 400), one line each, before any window reaches the tensor model: a question or
context that is not UTF-8 (naming the input, the row and the byte offset), an empty (or blank) question or context,
a question over max_question_chars or a context over max_context_chars characters, and a request whose rows need
more than max_windows windows together. The limits come from $BERT_TRITON_MAX_CONTEXT_CHARS /
$BERT_TRITON_MAX_QUESTION_CHARS / $BERT_TRITON_MAX_WINDOWS at server start, else from this model's config.pbtxt
parameters (model_repository.py --max_context_chars / --max_question_chars / --max_windows), else the defaults in
prediction/items.py; 0 turns a limit off.
"""

import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path

# This file stays self-contained, and so repeats backend/onnx_model.py's _extend_sys_path and _error on purpose:
# model_repository.py copies it alone to <repository>/<model>/1/model.py, and Triton's stub interpreter runs it
# before any path of the project or of the virtual environment is known, so the code that finds those paths
# cannot itself be imported from them (the two-line _error comes along rather than a second file to copy).


def _extend_sys_path() -> None:
    """The stub's interpreter does not see the virtual environment nor the project (bert_recipe/, tokenization.py):
    add the paths model_repository.py wrote to sys_path.json, and BERT_TRITON_SYS_PATH (os.pathsep-separated)."""
    paths = [p for p in os.environ.get("BERT_TRITON_SYS_PATH", "").split(os.pathsep) if p]
    listed = Path(__file__).with_name("sys_path.json")
    if listed.is_file():
        paths += json.loads(listed.read_text(encoding="utf-8"))
    for path in paths:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)


_extend_sys_path()  # before the imports below: they come from the paths it adds (E402 on each)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from bert_recipe.prediction import items  # noqa: E402
from bert_recipe.prediction.items import check_qa_text, check_windows, decode_utf8  # noqa: E402
from bert_recipe.tasks.squad import convert_examples_to_features, examples_from_qa_pairs  # noqa: E402
from bert_recipe.tasks.squad_answers import answers_from_logits  # noqa: E402
from tokenization import BertTokenizer  # noqa: E402

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


def _error(message: str):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


LIMITS = ("max_context_chars", "max_question_chars", "max_windows")


def _strings(request, name: str) -> list[str]:
    """The rows of a BYTES input as text; ValueError naming the input, the row and the byte that is not UTF-8."""
    array = pb_utils.get_input_tensor_by_name(request, name).as_numpy()  # [B, 1] object (bytes)
    return [
        decode_utf8(v, f"input '{name}' row {row}") if isinstance(v, bytes) else str(v)
        for row, v in enumerate(array.reshape(-1))
    ]


def _limits(config: dict) -> tuple[dict[str, int], dict[str, str]]:
    """({limit: value}, {limit: where it came from}): environment, else config.pbtxt parameters, else default."""
    defaults = dataclasses.asdict(items.SERVER_LIMITS)
    values, sources = {}, {}
    for name in LIMITS:
        env = f"BERT_TRITON_{name.upper()}"
        parameter = config.get("parameters", {}).get(name, {}).get("string_value")
        if os.environ.get(env):
            raw, source = os.environ[env], f"${env}"
        elif parameter:
            raw, source = parameter, "config.pbtxt"
        else:
            raw, source = defaults[name], "default"
        try:
            values[name] = int(raw)
        except ValueError:
            raise ValueError(f"{name} {raw!r} (from {source}) is not an integer") from None
        if values[name] < 0:
            raise ValueError(f"{name} {values[name]} (from {source}) must be >= 0 (0: no limit)")
        sources[name] = source
    return values, sources


class TritonPythonModel:
    def initialize(self, args):

        folder = Path(__file__).parent
        self.settings = json.loads((folder / "settings.json").read_text(encoding="utf-8"))
        self.limits, sources = _limits(json.loads(args["model_config"]))
        name = json.loads(args["model_config"]).get("name", "this model")
        self.how_to_raise = (
            f"send less per request, or have the server's operator raise {{name}} (parameter "
            f"{{name}} in {name}/config.pbtxt, model_repository.py --{{name}}, or "
            f"$BERT_TRITON_{{NAME}} at server start; 0 = no limit)"
        )
        if hasattr(pb_utils, "Logger"):  # the server log says which limits hold and where they came from
            pb_utils.Logger.log_info(
                f"{name} limits: " + ", ".join(f"{k}={v} ({sources[k]})" for k, v in self.limits.items())
            )
        self.tokenizer = BertTokenizer(folder / "vocab.txt", do_lower_case=self.settings["do_lower_case"])
        self.np_dtype = np.int32 if self.settings["input_dtype"] == "int32" else np.int64
        # triton/client.py, copied beside this file: the batching and answer records of the client and of
        # inference.py, so the three give the same answers.
        spec = importlib.util.spec_from_file_location("bert_qa_client", folder / "qa_client.py")
        self.client = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = self.client
        spec.loader.exec_module(self.client)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except ValueError as e:  # a request the pipeline refuses (e.g. an empty question); others go on
                responses.append(pb_utils.InferenceResponse(error=_error(str(e))))
            except RuntimeError as e:  # the tensor model failed
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses

    def _answer(self, request):

        s = self.settings
        questions, contexts = _strings(request, "question"), _strings(request, "context")
        if len(questions) != len(contexts) or not questions:
            raise ValueError(
                f"question and context need the same number of rows (>= 1), got {len(questions)} and {len(contexts)}"
            )
        for row, (question, context) in enumerate(zip(questions, contexts)):
            check_qa_text(
                question,
                context,
                f"row {row}",
                self.limits["max_question_chars"],
                self.limits["max_context_chars"],
                self.how_to_raise,
            )
        items = [{"id": str(i), "question": q, "context": c} for i, (q, c) in enumerate(zip(questions, contexts))]
        examples = examples_from_qa_pairs(items)
        features = convert_examples_to_features(
            examples, self.tokenizer, s["max_seq_length"], s["doc_stride"], s["max_query_length"], is_training=False
        )
        check_windows(
            len(features),
            self.limits["max_windows"],
            f"this request ({len(items)} row{'s' if len(items) > 1 else ''}, max_seq_length "
            f"{s['max_seq_length']}, doc_stride {s['doc_stride']})",
            self.how_to_raise,
        )
        results = {}
        for chunk, arrays in self.client.feature_batches(features, s["batch_size"], self.np_dtype):
            start_logits, end_logits = self._logits(arrays)
            results.update((f.unique_id, (start_logits[i], end_logits[i])) for i, f in enumerate(chunk))
        records = answers_from_logits(
            examples,
            features,
            results,
            s["n_best_size"],
            s["max_answer_length"],
            self.tokenizer.do_lower_case,
            s["version_2_with_negative"],
            s["null_score_diff_threshold"],
        )
        answers = np.array([[r["answer"].encode("utf-8")] for r in records], dtype=np.object_)
        probabilities = np.array([[r["probability"]] for r in records], dtype=np.float32)
        nbest_json = np.array(
            [[json.dumps(r["nbest"], ensure_ascii=False).encode("utf-8")] for r in records], dtype=np.object_
        )
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("answer", answers),
                pb_utils.Tensor("probability", probabilities),
                pb_utils.Tensor("nbest_json", nbest_json),
            ]
        )

    def _logits(self, arrays: list) -> tuple[np.ndarray, np.ndarray]:
        """One BLS request to the tensor model: input_ids, token_type_ids, attention_mask [b, L] -> logits."""
        request = pb_utils.InferenceRequest(
            model_name=self.settings["tensor_model"],
            requested_output_names=["start_logits", "end_logits"],
            inputs=[pb_utils.Tensor(name, array) for name, array in zip(INPUT_NAMES, arrays)],
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{self.settings['tensor_model']}: {response.error().message()}")
        return (
            pb_utils.get_output_tensor_by_name(response, "start_logits").as_numpy(),
            pb_utils.get_output_tensor_by_name(response, "end_logits").as_numpy(),
        )
