"""The Triton deployment end to end, against a real `tritonserver` on 127.0.0.1.

One server for the module: all-MiniLM-L6-v2 (real weights) with a seeded QA head, exported to ONNX (int32 inputs,
max_seq_length 128), a repository with the Python-backend tensor model and the server-side text model, started
by triton/scripts/launch_server.sh. The tests check that answers over HTTP and gRPC (client and text model) equal
inference.py's on the same questions, that malformed requests get errors while the server keeps serving, that the
performance command measures, and that stop_server.sh leaves no process behind.

The module skips only when no tritonserver binary can be found (nvidia-pytriton is in requirements-test.txt).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import documented_commands as docs
import numpy as np
import pytest
import torch

from bert_recipe.io.checkpoint_io import from_pretrained, save_hf_directory
from bert_recipe.io.triton_scripts import load_triton_script as load_script
from bert_recipe.prediction import items
from bert_recipe.prediction.predict import Runtime, answer_questions
from bert_recipe.tasks.squad_answers import QASettings
from modeling import BertForQuestionAnswering
from tokenization import BertTokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "triton" / "scripts"
MAX_SEQ = 128
MAX_BATCH = 8
# The text model's limits in this repository (small, so that refusals are cheap to provoke): qa_items' SQuAD
# contexts have 742 characters and 2 windows of 128 tokens at stride 64.
MAX_CONTEXT_CHARS = 2000
MAX_QUESTION_CHARS = 300
MAX_WINDOWS = 12
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


def script_env() -> dict:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
def qa_items(shared_data) -> list[dict]:
    """Real SQuAD questions; contexts longer than one 128-token window, so answers merge several windows."""
    records = json.loads((shared_data / "hf-test-fixtures" / "SQUAD" / "sample.json").read_text())["data"]
    items = [{"id": r["id"], "question": r["question"], "context": r["context"]} for r in records[:5]]
    items.append({"id": "tiny", "question": "Who?", "context": "Rollo."})
    return items


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, minilm_dir):
    """(model, export dir, repository) for MiniLM with a seeded QA head."""
    tmp = tmp_path_factory.mktemp("triton")
    torch.manual_seed(0)
    model = from_pretrained(BertForQuestionAnswering, minilm_dir, log=None).eval()
    with torch.no_grad():  # a head with a clear signal, so answers are not decided by near-ties
        model.qa_outputs.weight.normal_(0, 0.2)
    save_hf_directory(model, tmp / "hf", vocab_file=minilm_dir / "vocab.txt")
    export = load_script("export_model")
    assert (
        export.main(
            [
                "--checkpoint",
                str(tmp / "hf"),
                "--output_dir",
                str(tmp / "export"),
                "--format",
                "onnx",
                "--input_dtype",
                "int32",
                "--max_seq_length",
                str(MAX_SEQ),
                "--no_verify",
            ]
        )
        == 0
    )
    repository = load_script("model_repository")
    assert (
        repository.main(
            [
                "--export_dir",
                str(tmp / "export"),
                "--repository",
                str(tmp / "repo"),
                "--backend",
                "python",
                "--max_batch_size",
                str(MAX_BATCH),
                "--intra_op_num_threads",
                "2",
                "--text_model",
                "--doc_stride",
                "64",
                "--max_context_chars",
                str(MAX_CONTEXT_CHARS),
                "--max_question_chars",
                str(MAX_QUESTION_CHARS),
                "--max_windows",
                str(MAX_WINDOWS),
            ]
        )
        == 0
    )
    return model, tmp / "export", tmp / "repo"


@pytest.fixture(scope="module")
def server(deployment, tmp_path_factory):
    """A real tritonserver serving the repository; stopped (group-killed as a last resort) after the module."""
    server_script = load_script("server")
    try:
        server_script.find_installation()
    except server_script.ServerError as e:
        pytest.skip(f"no Triton server binary: {e}")
    state = tmp_path_factory.mktemp("server_state")
    # README.md's command, from the checkout in a fresh login shell (tests/README.md, "Every documented command").
    proc = docs.run(
        docs.only_command_for("server"),
        timeout=240,
        replace={"results/triton_repo_cpu": str(deployment[2]), "results/triton_server": str(state)},
    )
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    info["state_dir"] = str(state)
    yield info
    if (state / "server.json").exists():  # test_stop_leaves_no_process did not run or failed
        subprocess.run(["bash", str(SCRIPTS / "stop_server.sh"), str(state), "10"], timeout=60, env=script_env())
    if group_members(info["pid"]):
        os.killpg(info["pid"], 9)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def clients(server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return [
        ("http", httpclient, httpclient.InferenceServerClient(server["http_url"])),
        ("grpc", grpcclient, grpcclient.InferenceServerClient(server["grpc_url"])),
    ]


def make_inputs(module, arrays, dtypes=("INT32",) * 3, names=INPUT_NAMES):
    inputs = []
    for name, array, dtype in zip(names, arrays, dtypes):
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def good_batch() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    input_ids = rng.integers(1000, 30000, (2, 24)).astype(np.int32)
    token_type_ids = np.zeros_like(input_ids)
    token_type_ids[:, 12:] = 1
    attention_mask = np.ones_like(input_ids)
    attention_mask[1, 18:] = 0
    return input_ids, token_type_ids, attention_mask


def assert_answers_equal(got: list[dict], expected: list[dict]) -> None:
    assert [r["id"] for r in got] == [r["id"] for r in expected]
    for g, e in zip(got, expected):
        assert g["answer"] == e["answer"], g["id"]
        assert g["probability"] == pytest.approx(e["probability"], abs=1e-4)
        assert [x["text"] for x in g["nbest"]] == [x["text"] for x in e["nbest"]]
        np.testing.assert_allclose(
            [x["start_logit"] for x in g["nbest"]], [x["start_logit"] for x in e["nbest"]], atol=1e-4
        )


@pytest.fixture(scope="module")
def reference_answers(deployment, qa_items, minilm_dir):
    """inference.py's answers with the PyTorch model: the independent reference."""
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    return answer_questions(
        deployment[0],
        tokenizer,
        qa_items,
        QASettings(max_seq_length=MAX_SEQ, doc_stride=64),
        Runtime(batch_size=4, device="cpu"),
    )


def test_the_readmes_export_and_repository_commands(deployment, tmp_path):
    """README.md's export of a fine-tuned QA model (ONNX and TorchScript, checked against PyTorch) and its model
    repository for the CPU server (the Python backend, the text model beside the tensor model)."""
    hf = deployment[1].parent / "hf"
    docs.run(
        docs.commands_for("test_the_readmes_export_and_repository_commands"),
        timeout=300,
        replace={
            "results/SQuAD/hf_model": str(hf),
            "results/triton_export": str(tmp_path / "export"),
            "results/triton_repo_cpu": str(tmp_path / "repo"),
        },
    )
    assert (tmp_path / "export" / "model.onnx").is_file()
    for model in ("bert_qa", "bert_qa_text"):
        assert (tmp_path / "repo" / model / "config.pbtxt").is_file(), model
    assert 'backend: "python"' in (tmp_path / "repo" / "bert_qa" / "config.pbtxt").read_text()


def test_repository_configs_parse_for_both_backends(deployment, tmp_path):
    """config.pbtxt parses as Triton's ModelConfig for the python backend (served below) and for the native
    onnxruntime backend an NGC container runs (GPU instances, dynamic batching, TensorRT FP16 accelerator)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    repository = load_script("model_repository")
    assert (
        repository.main(
            [
                "--export_dir",
                str(deployment[1]),
                "--repository",
                str(tmp_path / "gpu"),
                "--max_batch_size",
                "64",
                "--tensorrt_fp16",
                "--link",
            ]
        )
        == 0
    )
    gpu = text_format.Parse((tmp_path / "gpu" / "bert_qa" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert gpu.platform == "onnxruntime_onnx" and gpu.max_batch_size == 64
    assert gpu.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert list(gpu.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32, 64]
    assert gpu.optimization.execution_accelerators.gpu_execution_accelerator[0].name == "tensorrt"
    assert [i.name for i in gpu.input] == list(INPUT_NAMES) and all(list(i.dims) == [-1] for i in gpu.input)
    assert all(i.data_type == model_config_pb2.TYPE_INT32 for i in gpu.input)
    assert [o.name for o in gpu.output] == ["start_logits", "end_logits"]
    assert not (tmp_path / "gpu" / "bert_qa" / "1" / "model.py").exists()
    assert (tmp_path / "gpu" / "bert_qa" / "1" / "model.onnx").resolve() == (deployment[1] / "model.onnx").resolve()

    cpu = text_format.Parse((deployment[2] / "bert_qa" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert cpu.backend == "python" and cpu.max_batch_size == MAX_BATCH
    assert cpu.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert cpu.parameters["max_seq_length"].string_value == str(MAX_SEQ)
    assert {k: cpu.parameters[k].string_value for k in ("cpu_mem_arena", "arena_shrinkage", "malloc_trim")} == {
        "cpu_mem_arena": "true",
        "arena_shrinkage": "true",
        "malloc_trim": "true",
    }
    assert not cpu.HasField("dynamic_batching")  # python backend: no batcher by default (its thread spins on CPU)
    assert (
        repository.main(
            [
                "--export_dir",
                str(deployment[1]),
                "--repository",
                str(tmp_path / "cpu_batched"),
                "--backend",
                "python",
                "--dynamic_batching",
                "--max_batch_size",
                "8",
                "--link",
            ]
        )
        == 0
    )
    batched = text_format.Parse(
        (tmp_path / "cpu_batched" / "bert_qa" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert list(batched.dynamic_batching.preferred_batch_size) == [4, 8]
    text = text_format.Parse(
        (deployment[2] / "bert_qa_text" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert {k: v.string_value for k, v in text.parameters.items()} == {
        "max_context_chars": str(MAX_CONTEXT_CHARS),
        "max_question_chars": str(MAX_QUESTION_CHARS),
        "max_windows": str(MAX_WINDOWS),
    }
    paths = json.loads((deployment[2] / "bert_qa" / "1" / "sys_path.json").read_text())
    assert str(REPO_ROOT) in paths and any(Path(p, "onnxruntime").is_dir() for p in paths)


def test_answers_over_http_and_grpc_equal_inference(server, deployment, qa_items, reference_answers, capsys, tmp_path):
    """client.py (CLI over HTTP, function over gRPC) returns inference.py's answers for the same questions."""
    client = load_script("client")
    (tmp_path / "items.json").write_text(json.dumps(qa_items))
    assert (
        client.main(
            [
                "--url",
                server["http_url"],
                "--protocol",
                "http",
                "--export_dir",
                str(deployment[1]),
                "--input_file",
                str(tmp_path / "items.json"),
                "--batch_size",
                "3",
                "--doc_stride",
                "64",
                "--output",
                str(tmp_path / "answers.json"),
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "answers.json").read_text())
    assert_answers_equal(printed, reference_answers)
    assert any(len(r["nbest"]) > 1 for r in printed)

    connection = client.TritonQA(server["grpc_url"], "grpc", "bert_qa")
    try:
        tokenizer = BertTokenizer(deployment[1] / "vocab.txt", do_lower_case=True)
        got = client.answer_with_triton(
            connection, tokenizer, qa_items, QASettings(max_seq_length=MAX_SEQ, doc_stride=64), batch_size=MAX_BATCH
        )
    finally:
        connection.close()
    assert_answers_equal(got, reference_answers)


def test_server_side_text_model_equals_inference(server, qa_items, reference_answers, capsys, tmp_path):
    """Raw strings to bert_qa_text (tokenization, BLS calls to bert_qa, post-processing in the server)."""
    client = load_script("client")
    (tmp_path / "q.json").write_text(json.dumps(qa_items))
    done = docs.run(
        docs.only_command_for("test_server_side_text_model_equals_inference"),
        replace={"127.0.0.1:39813": server["grpc_url"], "q.json": str(tmp_path / "q.json")},
    )
    assert_answers_equal(json.loads(done.stdout), reference_answers)

    connection = client.TritonQA(server["http_url"], "http", "bert_qa_text", expected_inputs=("question", "context"))
    try:
        got = client.answer_with_text_model(connection, qa_items[:2], batch_size=2)
    finally:
        connection.close()
    assert_answers_equal(got, reference_answers[:2])


def test_malformed_requests_fail_and_the_server_keeps_serving(server, deployment):
    from tritonclient.utils import InferenceServerException

    model = deployment[0]
    good = good_batch()
    with torch.no_grad():
        expected = [t.numpy() for t in model(*(torch.from_numpy(a).long() for a in good))]
    ids, types, mask = good
    long_row = np.ones((1, MAX_SEQ + 1), np.int32)
    bad_requests = {
        "wrong dtype (int64 for int32)": (tuple(a.astype(np.int64) for a in good), ("INT64",) * 3, INPUT_NAMES),
        "float ids": ((ids.astype(np.float32), types, mask), ("FP32", "INT32", "INT32"), INPUT_NAMES),
        "shapes differ": ((ids, types[:, :10], mask), ("INT32",) * 3, INPUT_NAMES),
        "3-D inputs": (tuple(a[None] for a in good), ("INT32",) * 3, INPUT_NAMES),
        "over-long sequence": ((long_row, 0 * long_row, long_row), ("INT32",) * 3, INPUT_NAMES),
        "empty batch": (tuple(a[:0] for a in good), ("INT32",) * 3, INPUT_NAMES),
        "empty sequence": (tuple(a[:, :0] for a in good), ("INT32",) * 3, INPUT_NAMES),
        "batch over max_batch_size": (
            tuple(np.repeat(a[:1], MAX_BATCH + 1, 0) for a in good),
            ("INT32",) * 3,
            INPUT_NAMES,
        ),
        "ids outside the vocabulary": ((ids + 40000, types, mask), ("INT32",) * 3, INPUT_NAMES),
        "token type 2": ((ids, types + 1, mask), ("INT32",) * 3, INPUT_NAMES),
        "missing input": ((ids, types), ("INT32",) * 2, INPUT_NAMES[:2]),
    }
    for protocol, module, connection in clients(server):
        for what, (arrays, dtypes, names) in bad_requests.items():
            with pytest.raises(InferenceServerException):
                connection.infer("bert_qa", make_inputs(module, arrays, dtypes, names))
            # ... and a good request right after it is still answered, correctly
            result = connection.infer("bert_qa", make_inputs(module, good))
            got = [result.as_numpy("start_logits"), result.as_numpy("end_logits")]
            assert max(float(np.abs(g - e).max()) for g, e in zip(got, expected)) <= 1e-4, (protocol, what)
        with pytest.raises(InferenceServerException):
            connection.infer("no_such_model", make_inputs(module, good))
        with pytest.raises(InferenceServerException):  # the text model wants strings
            connection.infer("bert_qa_text", make_inputs(module, (ids, ids), ("INT32",) * 2, ("question", "context")))
        assert connection.is_server_live() and connection.is_model_ready("bert_qa")
        assert connection.is_model_ready("bert_qa_text")
        connection.close()


# ----------------------------------------------------------------------------------------------------------------
# Limits, memory and a soak: what a crowd of clients, some of them careless or hostile, does to the server


def stub_pids(server) -> dict[str, int]:
    """{model name: pid} of the Python-backend stub processes (their command line names the model's model.py)."""
    pids = {}
    for pid in group_members(server["pid"]):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            parts = arg.decode(errors="replace").split("/")
            if len(parts) > 3 and parts[-1] == "model.py" and "triton_python_backend_stub" in argv[0].decode():
                pids[parts[-3]] = pid
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> dict[str, float]:
    """{"rss": VmRSS, "peak": VmHWM} of a process in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss": int(fields["VmRSS"].split()[0]) / 1024, "peak": int(fields["VmHWM"].split()[0]) / 1024}


def error_status(exc) -> str:
    """'400' over HTTP, 'StatusCode.INVALID_ARGUMENT' over gRPC, as tritonclient reports them."""
    return str(exc.status())


BAD_REQUEST = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def text_inputs(module, questions, contexts, dtype="BYTES"):
    arrays = [np.array([[q] for q in questions], dtype=np.object_), np.array([[c] for c in contexts], dtype=np.object_)]
    arrays = [a if dtype == "BYTES" else np.ones(a.shape, np.int32) for a in arrays]
    return make_inputs(module, arrays, (dtype, dtype), ("question", "context"))


def malformed_text_requests(qa_items) -> dict[str, tuple[list, list, str]]:
    """what -> (questions, contexts, what the error must say) for the text model, all refused with a 400."""
    q, c = qa_items[0]["question"].encode(), qa_items[0]["context"].encode()
    two_windows = qa_items[0]
    too_long = (" ".join([qa_items[0]["context"]] * 3))[: MAX_CONTEXT_CHARS + 1].encode()
    return {
        "empty question": ([b""], [c], "row 0: the question is empty"),
        "blank context": ([q, q], [c, b" \n\t "], "row 1: the context is empty"),
        "context over max_context_chars": (
            [q],
            [too_long],
            f"row 0: the context has {MAX_CONTEXT_CHARS + 1:,} "
            f"characters, over the limit max_context_chars={MAX_CONTEXT_CHARS:,}; "
            "send less per request, or have the server's operator raise "
            "max_context_chars (parameter max_context_chars in "
            "bert_qa_text/config.pbtxt, model_repository.py --max_context_chars, "
            "or $BERT_TRITON_MAX_CONTEXT_CHARS at server start; 0 = no limit)",
        ),
        "question over max_question_chars": (
            [b"why " * 100],
            [c],
            f"row 0: the question has 400 characters, over the limit max_question_chars={MAX_QUESTION_CHARS}",
        ),
        "more windows than max_windows": (
            [two_windows["question"].encode()] * 7,
            [two_windows["context"].encode()] * 7,
            f"this request (7 rows, max_seq_length {MAX_SEQ}, doc_stride 64) needs 14 "
            f"windows, over the limit max_windows={MAX_WINDOWS}; send less",
        ),
        "context not UTF-8": (
            [q, q],
            [c, "Renée".encode("latin-1")],
            "input 'context' row 1 is not UTF-8 (byte 0xe9 at offset 3: invalid continuation byte)",
        ),
        "question not UTF-8": ([b"\xff\xfe who?"], [c], "input 'question' row 0 is not UTF-8 (byte 0xff at offset 0"),
    }


def test_text_model_refuses_empty_over_limit_and_non_utf8_requests(server, qa_items, reference_answers):
    """Each refusal is a 400 (gRPC INVALID_ARGUMENT) whose one-line message names the row, the input, the limit
    and how to change it; a good request right after each is answered correctly."""
    from tritonclient.utils import InferenceServerException

    log = Path(server["log"]).read_text(errors="replace")
    assert (
        f"bert_qa_text limits: max_context_chars={MAX_CONTEXT_CHARS} (config.pbtxt), max_question_chars="
        f"{MAX_QUESTION_CHARS} (config.pbtxt), max_windows={MAX_WINDOWS} (config.pbtxt)"
    ) in log
    good = qa_items[-1]  # "tiny": one short window
    for protocol, module, connection in clients(server):
        for what, (questions, contexts, message) in malformed_text_requests(qa_items).items():
            with pytest.raises(InferenceServerException) as e:
                connection.infer("bert_qa_text", text_inputs(module, questions, contexts))
            assert error_status(e.value) == BAD_REQUEST[protocol], (protocol, what, e.value)
            assert message in e.value.message() and "\n" not in e.value.message(), (protocol, what, e.value)
            result = connection.infer(
                "bert_qa_text", text_inputs(module, [good["question"].encode()], [good["context"].encode()])
            )
            assert result.as_numpy("answer")[0][0].decode() == reference_answers[-1]["answer"], (protocol, what)
        connection.close()


def send_max_size_batch(server, model, repeats: int = 3) -> None:
    """[MAX_BATCH, MAX_SEQ] windows (the largest request the repository accepts), answered correctly."""
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(1)
    ids = rng.integers(1000, 30000, (MAX_BATCH, MAX_SEQ)).astype(np.int32)
    types = np.zeros_like(ids)
    types[:, MAX_SEQ // 2 :] = 1
    mask = np.ones_like(ids)
    with torch.no_grad():
        expected = model(*(torch.from_numpy(a).long() for a in (ids, types, mask)))[0].numpy()
    client = grpcclient.InferenceServerClient(server["grpc_url"])
    try:
        for _ in range(repeats):
            result = client.infer("bert_qa", make_inputs(grpcclient, (ids, types, mask)))
            np.testing.assert_allclose(result.as_numpy("start_logits"), expected, atol=1e-4)
    finally:
        client.close()


# The tensor model's stub may grow by at most this much while serving max-size batches: ONNX Runtime's CPU arena
# kept the largest batch's buffers for good (+1,087 MiB after one [32, 384] MiniLM batch; +42 MiB after two
# [8, 128] batches, +97 MiB with the arena off and no malloc_trim), before it shrank back after each run.
TENSOR_STUB_GROWTH_MIB = 48


def test_tensor_model_memory_stays_bounded_after_a_max_size_batch(server, deployment):
    """The bert_qa stub's RSS after three [MAX_BATCH, MAX_SEQ] batches exceeds its RSS after a small one by less
    than TENSOR_STUB_GROWTH_MIB (ONNX Runtime's arena shrinks back after each run, then malloc_trim)."""
    assert "arena_shrinkage" in (deployment[2] / "bert_qa" / "config.pbtxt").read_text()
    pid = stub_pids(server)["bert_qa"]
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server["grpc_url"])
    client.infer("bert_qa", make_inputs(grpcclient, tuple(a[:1, :16] for a in good_batch())))  # session warmed up
    client.close()
    before = memory_mib(pid)
    send_max_size_batch(server, deployment[0])
    after = memory_mib(pid)
    growth = after["rss"] - before["rss"]
    print(
        f"bert_qa stub RSS: {before['rss']:.0f} MiB before, {after['rss']:.0f} MiB after 3 x "
        f"[{MAX_BATCH}, {MAX_SEQ}] (growth {growth:.0f} MiB, peak {after['peak']:.0f} MiB)"
    )
    assert growth < TENSOR_STUB_GROWTH_MIB, (before, after)


SOAK_THREADS, SOAK_REQUESTS = 4, 25
SOAK_GROWTH_MIB = 64  # per stub, from before the soak to after it
# (batch, sequence length) of the tensor requests: every shape the soak sends, from 1 x 16 to MAX_BATCH x MAX_SEQ
SOAK_SHAPES = [(1, 16), (2, 128), (4, 48), (8, 32), (MAX_BATCH, MAX_SEQ), (1, MAX_SEQ), (2, 64), (4, 96)]


@pytest.fixture(scope="module")
def soak_items(qa_items, deployment, minilm_dir) -> tuple[list[dict], list[dict]]:
    """(items, inference.py's answers) for the soak's text requests: qa_items with their contexts cut after the
    first sentence that ends past 150 characters (one window each, so the soak stays short), plus "tiny"."""
    items = []
    for item in qa_items:
        end = item["context"].find(". ", 150)
        items.append({**item, "context": item["context"][: end + 1] if end > 0 else item["context"]})
    tokenizer = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    answers = answer_questions(
        deployment[0],
        tokenizer,
        items,
        QASettings(max_seq_length=MAX_SEQ, doc_stride=64),
        Runtime(batch_size=8, device="cpu"),
    )
    return items, answers


def soak_plan(n_items: int, seed: int) -> list[tuple[str, object]]:
    """SOAK_REQUESTS requests for one client: tensor batches of mixed shapes (an index into SOAK_SHAPES), text
    requests of 1-3 rows (indices of soak_items), and a malformed request (of a kind chosen in turn) every fourth
    one."""
    rng = np.random.default_rng(seed)
    tensor_bad = [
        "wrong dtype",
        "shapes differ",
        "over-long sequence",
        "batch over max_batch_size",
        "ids outside the vocabulary",
        "empty sequence",
    ]
    text_bad = [
        "empty question",
        "blank context",
        "context over max_context_chars",
        "question over max_question_chars",
        "more windows than max_windows",
        "context not UTF-8",
        "question not UTF-8",
        "text as INT32",
    ]
    bad = [("tensor_bad", k) for k in tensor_bad] + [("text_bad", k) for k in text_bad]
    plan = []
    for i in range(SOAK_REQUESTS):
        if i % 4 == 3:
            plan.append(bad[(seed * 7 + i // 4) % len(bad)])
        elif rng.random() < 0.5:
            plan.append(("tensor", int(rng.integers(len(SOAK_SHAPES)))))
        else:
            rows = rng.choice(n_items, int(rng.integers(1, 4)), replace=False)
            plan.append(("text", [int(r) for r in rows]))
    return plan


def tensor_request(shape: int) -> tuple[np.ndarray, ...]:
    """Random windows of SOAK_SHAPES[shape], each row padded after a random length, two segments."""
    batch, seq = SOAK_SHAPES[shape]
    rng = np.random.default_rng(shape)
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int32)
    lengths = rng.integers(seq // 2, seq + 1, batch)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    types = ((np.arange(seq)[None] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int32)
    ids[mask == 0] = 0
    return ids, types, mask


def malformed_tensor_request(what: str) -> tuple[tuple, tuple]:
    ids, types, mask = good_batch()
    long_row = np.ones((1, MAX_SEQ + 1), np.int32)
    return {
        "wrong dtype": (tuple(a.astype(np.int64) for a in (ids, types, mask)), ("INT64",) * 3),
        "shapes differ": ((ids, types[:, :10], mask), ("INT32",) * 3),
        "over-long sequence": ((long_row, 0 * long_row, long_row), ("INT32",) * 3),
        "batch over max_batch_size": (
            tuple(np.repeat(a[:1], MAX_BATCH + 1, 0) for a in (ids, types, mask)),
            ("INT32",) * 3,
        ),
        "ids outside the vocabulary": ((ids + 40000, types, mask), ("INT32",) * 3),
        "empty sequence": (tuple(a[:, :0] for a in (ids, types, mask)), ("INT32",) * 3),
    }[what]


def test_soak_mixed_clients_with_malformed_requests(server, deployment, qa_items, soak_items, tmp_path):
    """SOAK_THREADS clients (HTTP and gRPC) x SOAK_REQUESTS requests each, at once: tensor batches of mixed shapes
    and text requests of 1-3 rows, every fourth request malformed. Every good request is answered correctly (the
    logits of the PyTorch model, inference.py's answers), every malformed one is refused with a 400
    (INVALID_ARGUMENT), the server serves on afterwards and each stub's memory grows by less than
    SOAK_GROWTH_MIB. The figures are printed and written to <tmp>/soak.json."""
    import threading
    import time

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    model = deployment[0]
    items, reference_answers = soak_items
    plans = [soak_plan(len(items), seed) for seed in range(SOAK_THREADS)]
    expected = {}  # the PyTorch model's start/end logits for every tensor request, computed before the soak
    with torch.no_grad():
        for shape in range(len(SOAK_SHAPES)):
            start, end = model(*(torch.from_numpy(a).long() for a in tensor_request(shape)))
            expected[shape] = (start.numpy(), end.numpy())
    pids = {"server": server["pid"], **stub_pids(server)}
    assert set(pids) == {"server", "bert_qa", "bert_qa_text"}, pids
    memory_before = {name: memory_mib(pid) for name, pid in pids.items()}
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    records, failures = [], []  # (kind, latency s); (thread, index, kind, what went wrong)

    def client_thread(index: int) -> None:
        protocol = "http" if index % 2 == 0 else "grpc"
        module = httpclient if protocol == "http" else grpcclient
        url = server["http_url"] if protocol == "http" else server["grpc_url"]
        connection = module.InferenceServerClient(url)
        for n, (kind, spec) in enumerate(plans[index]):
            started = time.perf_counter()
            try:
                if kind == "tensor":
                    result = connection.infer("bert_qa", make_inputs(module, tensor_request(spec)))
                    got = (result.as_numpy("start_logits"), result.as_numpy("end_logits"))
                    if max(float(np.abs(g - e).max()) for g, e in zip(got, expected[spec])) > 1e-4:
                        failures.append((index, n, kind, f"logits differ for {SOAK_SHAPES[spec]}"))
                elif kind == "text":
                    rows = [items[r] for r in spec]
                    result = connection.infer(
                        "bert_qa_text",
                        text_inputs(
                            module, [r["question"].encode() for r in rows], [r["context"].encode() for r in rows]
                        ),
                    )
                    answers = [a[0].decode() for a in result.as_numpy("answer")]
                    probabilities = result.as_numpy("probability")[:, 0]
                    want = [reference_answers[r] for r in spec]
                    if answers != [w["answer"] for w in want] or not np.allclose(
                        probabilities, [w["probability"] for w in want], atol=1e-4
                    ):
                        failures.append((index, n, kind, f"answers {answers} != {[w['answer'] for w in want]}"))
                elif kind == "tensor_bad":
                    arrays, dtypes = malformed_tensor_request(spec)
                    connection.infer("bert_qa", make_inputs(module, arrays, dtypes))
                    failures.append((index, n, spec, "accepted"))
                else:
                    if spec == "text as INT32":
                        inputs = text_inputs(module, [b"Who?"], [b"Bob."], dtype="INT32")
                    else:
                        questions, contexts, _ = malformed_text_requests(qa_items)[spec]
                        inputs = text_inputs(module, questions, contexts)
                    connection.infer("bert_qa_text", inputs)
                    failures.append((index, n, spec, "accepted"))
            except InferenceServerException as e:
                if kind in ("tensor", "text"):
                    failures.append((index, n, kind, f"failed: {e}"))
                elif error_status(e) != BAD_REQUEST[protocol]:
                    failures.append(
                        (index, n, spec, f"refused with {error_status(e)}, not {BAD_REQUEST[protocol]}: {e}")
                    )
            except Exception as e:  # any: a client-side surprise is a failure of the soak too
                failures.append((index, n, kind, f"{type(e).__name__}: {e}"))
            records.append((kind, time.perf_counter() - started))
        connection.close()

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(SOAK_THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    wall = time.perf_counter() - started
    assert not any(t.is_alive() for t in threads), "a soak client hung"
    cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 1) for name, pid in pids.items()}

    # The server serves on, correctly, and no stub grew past the bound.
    send_max_size_batch(server, model, repeats=1)
    import tritonclient.http as http_again

    check = http_again.InferenceServerClient(server["http_url"])
    assert check.is_server_live() and check.is_model_ready("bert_qa") and check.is_model_ready("bert_qa_text")
    check.close()
    memory_after = {name: memory_mib(pid) for name, pid in pids.items()}
    good = [s for kind, s in records if kind in ("tensor", "text")]
    report = {
        "clients": SOAK_THREADS,
        "requests_per_client": SOAK_REQUESTS,
        "requests": len(records),
        "well_formed": len(good),
        "malformed": len(records) - len(good),
        "failures": len(failures),
        "wall_s": round(wall, 1),
        "server_cpu_s": cpu,
        "latency_ms": {
            kind: {
                "p50": round(float(np.percentile(lat, 50)) * 1e3, 1),
                "p99": round(float(np.percentile(lat, 99)) * 1e3, 1),
                "n": len(lat),
            }
            for kind in ("tensor", "text", "tensor_bad", "text_bad")
            for lat in [[s for k, s in records if k == kind]]
            if lat
        },
        "latency_ms_well_formed": {
            "p50": round(float(np.percentile(good, 50)) * 1e3, 1),
            "p99": round(float(np.percentile(good, 99)) * 1e3, 1),
        },
        "memory_mib": {
            name: {
                "rss_before": round(memory_before[name]["rss"]),
                "rss_after": round(memory_after[name]["rss"]),
                "peak": round(memory_after[name]["peak"]),
            }
            for name in pids
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    (tmp_path / "soak.json").write_text(json.dumps(report, indent=2))
    print("soak:", json.dumps(report))
    assert len(records) == SOAK_THREADS * SOAK_REQUESTS and report["malformed"] == SOAK_THREADS * (SOAK_REQUESTS // 4)
    assert failures == [], failures[:10]
    for name in ("bert_qa", "bert_qa_text"):
        growth = memory_after[name]["rss"] - memory_before[name]["rss"]
        assert growth < SOAK_GROWTH_MIB, (name, memory_before[name], memory_after[name])


def test_perf_measures_latency_and_throughput(server, tmp_path):
    perf = load_script("perf")
    out = tmp_path / "perf.json"
    assert (
        perf.main(
            [
                "--url",
                server["grpc_url"],
                "--protocol",
                "grpc",
                "--model_name",
                "bert_qa",
                "--batch_sizes",
                "1",
                "4",
                "--concurrency",
                "1",
                "2",
                "--seq_length",
                "32",
                "--seconds",
                "1",
                "--warmup",
                "1",
                "--min_requests",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["input_dtype"] == "INT32"
    rows = report["results"]
    assert [(r["batch_size"], r["concurrency"]) for r in rows] == [(1, 1), (1, 2), (4, 1), (4, 2)]
    for r in rows:
        assert r["errors"] == 0 and r["requests"] >= 2
        assert 0 < r["latency_p50_ms"] <= r["latency_p90_ms"] <= r["latency_p99_ms"]
        assert r["throughput_seq_per_s"] == pytest.approx(r["requests"] * r["batch_size"] / r["wall_s"], rel=1e-2)
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stop_leaves_no_process(server):
    """stop_server.sh ends the server and its Python-backend stubs within the bounded wait."""
    import tritonclient.http as httpclient

    assert group_members(server["pid"]), "the server should be running before the stop"
    stubs = [p for p in group_members(server["pid"]) if p != server["pid"]]
    assert stubs, "the Python-backend stubs run in the server's process group"
    proc = docs.run(
        docs.only_command_for("test_stop_leaves_no_process"),
        timeout=60,
        replace={"results/triton_server": server["state_dir"]},
    )
    assert json.loads(proc.stdout)["stopped"] == server["pid"]
    assert group_members(server["pid"]) == []
    assert not Path(server["state_dir"], "server.json").exists()
    with pytest.raises(ConnectionError):  # refused: nothing listens there any more
        httpclient.InferenceServerClient(server["http_url"], connection_timeout=2).is_server_live()


def test_text_model_limits_come_from_env_then_config_then_defaults(monkeypatch):
    """qa_text_model._limits without a server (a stand-in for triton_python_backend_utils): $BERT_TRITON_MAX_*
    wins over the config.pbtxt parameter, which wins over prediction/items.py's defaults; bad values are refused."""
    import importlib.util
    import types

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location(
        "qa_text_model_under_test", REPO_ROOT / "triton" / "backend" / "qa_text_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in module.LIMITS:
        monkeypatch.delenv(f"BERT_TRITON_{name.upper()}", raising=False)
    defaults = {"max_context_chars": 20_000, "max_question_chars": 2_000, "max_windows": 64}  # tests/README.md's
    assert module._limits({}) == (defaults, dict.fromkeys(module.LIMITS, "default"))
    config = {"parameters": {"max_context_chars": {"string_value": "500"}, "max_windows": {"string_value": "0"}}}
    monkeypatch.setenv("BERT_TRITON_MAX_WINDOWS", "7")
    values, sources = module._limits(config)
    assert values == {
        "max_context_chars": 500,
        "max_question_chars": items.SERVER_LIMITS.max_question_chars,
        "max_windows": 7,
    }
    assert sources == {
        "max_context_chars": "config.pbtxt",
        "max_question_chars": "default",
        "max_windows": "$BERT_TRITON_MAX_WINDOWS",
    }
    for bad, message in (
        ("lots", "max_windows 'lots' (from $BERT_TRITON_MAX_WINDOWS) is not an integer"),
        ("-1", "max_windows -1 (from $BERT_TRITON_MAX_WINDOWS) must be >= 0"),
    ):
        monkeypatch.setenv("BERT_TRITON_MAX_WINDOWS", bad)
        with pytest.raises(ValueError, match=re.escape(message)):
            module._limits(config)


def test_launcher_refuses_bad_requests(tmp_path):
    """Clear one-line errors and a non-zero exit: a missing repository, a model it does not hold, no server."""
    env = script_env()
    missing = subprocess.run(
        ["bash", str(SCRIPTS / "launch_server.sh"), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert missing.returncode != 0 and "is not a folder" in missing.stderr
    (tmp_path / "repo").mkdir()
    no_model = subprocess.run(
        ["bash", str(SCRIPTS / "launch_server.sh"), str(tmp_path / "repo"), "bert_qa"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert no_model.returncode != 0 and "no config.pbtxt" in no_model.stderr
    stop = subprocess.run(
        ["bash", str(SCRIPTS / "stop_server.sh"), str(tmp_path)], capture_output=True, text=True, timeout=60, env=env
    )
    assert stop.returncode != 0 and "no server.json" in stop.stderr
