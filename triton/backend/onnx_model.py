"""Triton Python-backend model that serves the exported model.onnx through ONNX Runtime.

model_repository.py copies this file to <repository>/<model>/1/model.py for servers whose Triton has no native
ONNX Runtime backend (the `tritonserver` of the nvidia-pytriton wheel on a CPU machine). On an NGC Triton
container the same model.onnx is served by the native backend instead (platform "onnxruntime_onnx").

Inputs (all [B, S], int64 or int32 as exported): input_ids, token_type_ids, attention_mask.
Outputs (float32): start_logits [B, S], end_logits [B, S] (qa) or logits [B, num_labels] (classification).

Every request is checked before it reaches ONNX Runtime (same shapes, 1 <= S <= max_seq_length, ids inside the
vocabulary, mask of 0/1), and a bad request gets its own error while the other requests of the batch are served.
With dynamic batching Triton hands over several requests at once; requests of the same sequence length are
concatenated and run as one batch (exact: no padding is added, so the results do not depend on the batching).
"""

import json
import os
import sys
from pathlib import Path

# This file stays self-contained, and so repeats backend/qa_text_model.py's _extend_sys_path and _error on purpose:
# model_repository.py copies it alone to <repository>/<model>/1/model.py, and Triton's stub interpreter runs it
# before any path of the project or of the virtual environment is known, so the code that finds those paths
# cannot itself be imported from them (the two-line _error comes along rather than a second file to copy).


def _extend_sys_path() -> None:
    """The Python-backend stub runs the system interpreter, which does not see the virtual environment where
    numpy and onnxruntime live (and it does not pass PYTHONPATH through). model_repository.py writes the
    environment's site-packages into sys_path.json beside this file; BERT_TRITON_SYS_PATH (os.pathsep-separated)
    adds more at server start. Paths that do not exist (another machine, an NGC container) are skipped."""
    paths = [p for p in os.environ.get("BERT_TRITON_SYS_PATH", "").split(os.pathsep) if p]
    listed = Path(__file__).with_name("sys_path.json")
    if listed.is_file():
        paths += json.loads(listed.read_text(encoding="utf-8"))
    for path in paths:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)  # after the stub's own paths: its triton_python_backend_utils comes first


_extend_sys_path()

import numpy as np  # noqa: E402  (needs the path set above)
import triton_python_backend_utils as pb_utils  # noqa: E402

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


def _error(message: str):
    """A per-request error; INVALID_ARG (HTTP 400) where this Triton's Python backend has error codes."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def _parameter(config: dict, key: str, default: str) -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


def _flag(config: dict, key: str, default: bool) -> bool:
    return _parameter(config, key, str(default)).strip().lower() in ("true", "1", "yes")


def _malloc_trim():
    """glibc's malloc_trim (hands the free pages of every malloc arena back to the system), or None without glibc."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        self.output_names = [o["name"] for o in config["output"]]
        self.max_seq_length = int(_parameter(config, "max_seq_length", "512"))
        self.vocab_size = int(_parameter(config, "vocab_size", "0"))
        self.type_vocab_size = int(_parameter(config, "type_vocab_size", "2"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(_parameter(config, "intra_op_num_threads", "0"))
        # Memory held after a big batch (measured: triton/README.md, "Serving soak"): ONNX Runtime's CPU arena keeps
        # every buffer it ever grew to for good (+1,087 MiB after one [32, 384] MiniLM batch). Turning the arena off
        # made big batches 1.4 to 2.3 times slower here, and glibc's malloc then kept most of those pages anyway.
        # So the arena stays, but shrinks back after every run ("arena_shrinkage"), and malloc_trim(0) after each
        # execute hands glibc's free pages back ("malloc_trim"): +1 MiB held, arena speed. Each is a config.pbtxt
        # parameter ("cpu_mem_arena", "arena_shrinkage", "malloc_trim": "true"/"false").
        options.enable_cpu_mem_arena = _flag(config, "cpu_mem_arena", True)
        self.run_options = ort.RunOptions()
        if options.enable_cpu_mem_arena and _flag(config, "arena_shrinkage", True):
            self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.malloc_trim = _malloc_trim() if _flag(config, "malloc_trim", True) else None
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = ["CPUExecutionProvider"]
        if args.get("model_instance_kind") == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}))
        onnx_file = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = ort.InferenceSession(str(onnx_file), options, providers=providers)

    def _check(self, arrays: list) -> str | None:
        """A one-line reason why this request cannot be served, or None."""
        shapes = {tuple(a.shape) for a in arrays}
        if len(shapes) != 1 or len(arrays[0].shape) != 2:
            return (
                f"input_ids, token_type_ids and attention_mask must share one [batch, sequence] shape, got "
                f"{[list(a.shape) for a in arrays]}"
            )
        batch, seq_len = arrays[0].shape
        if batch < 1 or seq_len < 1:
            return f"empty input: shape [{batch}, {seq_len}]"
        if seq_len > self.max_seq_length:
            return f"sequence length {seq_len} exceeds max_seq_length {self.max_seq_length}"
        input_ids, token_type_ids, attention_mask = arrays
        if input_ids.min() < 0 or (self.vocab_size and input_ids.max() >= self.vocab_size):
            return f"input_ids must lie in [0, {self.vocab_size})"
        if token_type_ids.min() < 0 or token_type_ids.max() >= self.type_vocab_size:
            return f"token_type_ids must lie in [0, {self.type_vocab_size})"
        if not np.isin(attention_mask, (0, 1)).all():
            return "attention_mask must hold only 0 and 1"
        return None

    def execute(self, requests):
        responses = [None] * len(requests)
        groups: dict[int, list[tuple[int, list]]] = {}  # sequence length -> [(request index, arrays)]
        for i, request in enumerate(requests):
            arrays = [pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in INPUT_NAMES]
            reason = self._check(arrays)
            if reason:
                responses[i] = pb_utils.InferenceResponse(error=_error(reason))
            else:
                groups.setdefault(arrays[0].shape[1], []).append((i, arrays))
        for members in groups.values():
            self._run_group(members, responses)
        if self.malloc_trim is not None:
            self.malloc_trim(0)
        return responses

    def _run_group(self, members: list, responses: list) -> None:
        feeds = {name: np.concatenate([arrays[k] for _, arrays in members]) for k, name in enumerate(INPUT_NAMES)}
        try:
            outputs = self.session.run(self.output_names, feeds, self.run_options)
        except Exception as e:  # an ONNX Runtime failure fails these requests, never the model instance
            for i, _ in members:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {e}"))
            return
        start = 0
        for i, arrays in members:
            stop = start + arrays[0].shape[0]
            tensors = [
                pb_utils.Tensor(name, np.ascontiguousarray(out[start:stop], dtype=np.float32))
                for name, out in zip(self.output_names, outputs)
            ]
            responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
            start = stop

    def finalize(self):
        self.session = None
