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
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from checkpoint_io import from_pretrained, save_hf_directory
from modeling import BertForQuestionAnswering
from tokenization import BertTokenizer
from utils import load_triton_script as load_script

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "triton" / "scripts"
MAX_SEQ = 128
MAX_BATCH = 8
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
    assert export.main(["--checkpoint", str(tmp / "hf"), "--output_dir", str(tmp / "export"), "--format", "onnx",
                        "--input_dtype", "int32", "--max_seq_length", str(MAX_SEQ), "--no_verify"]) == 0
    repository = load_script("model_repository")
    assert repository.main(["--export_dir", str(tmp / "export"), "--repository", str(tmp / "repo"),
                            "--backend", "python", "--max_batch_size", str(MAX_BATCH), "--intra_op_num_threads", "2",
                            "--text_model", "--doc_stride", "64"]) == 0
    return model, tmp / "export", tmp / "repo"


@pytest.fixture(scope="module")
def server(deployment, tmp_path_factory):
    """A real tritonserver serving the repository; stopped (group-killed as a last resort) after the module."""
    try:
        load_script("server").find_installation()
    except SystemExit as e:
        pytest.skip(f"no Triton server binary: {e}")
    state = tmp_path_factory.mktemp("server_state")
    proc = subprocess.run(["bash", str(SCRIPTS / "launch_server.sh"), str(deployment[2]), "bert_qa,bert_qa_text",
                           str(state), "180"], capture_output=True, text=True, timeout=240, env=script_env())
    assert proc.returncode == 0, f"launch_server.sh failed:\n{proc.stdout}\n{proc.stderr}"
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

    return [("http", httpclient, httpclient.InferenceServerClient(server["http_url"])),
            ("grpc", grpcclient, grpcclient.InferenceServerClient(server["grpc_url"]))]


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
        np.testing.assert_allclose([x["start_logit"] for x in g["nbest"]], [x["start_logit"] for x in e["nbest"]],
                                   atol=1e-4)


@pytest.fixture(scope="module")
def reference_answers(deployment, qa_items, minilm_dir):
    """inference.py's answers with the PyTorch model: the independent reference."""
    from inference import answer_questions

    tokenizer = BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=True)
    return answer_questions(deployment[0], tokenizer, qa_items, max_seq_length=MAX_SEQ, doc_stride=64,
                            batch_size=4, device="cpu")


def test_repository_configs_parse_for_both_backends(deployment, tmp_path):
    """config.pbtxt parses as Triton's ModelConfig for the python backend (served below) and for the native
    onnxruntime backend an NGC container runs (GPU instances, dynamic batching, TensorRT FP16 accelerator)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    repository = load_script("model_repository")
    assert repository.main(["--export_dir", str(deployment[1]), "--repository", str(tmp_path / "gpu"),
                            "--max_batch_size", "64", "--tensorrt_fp16", "--link"]) == 0
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
    paths = json.loads((deployment[2] / "bert_qa" / "1" / "sys_path.json").read_text())
    assert str(REPO_ROOT) in paths and any(Path(p, "onnxruntime").is_dir() for p in paths)


def test_answers_over_http_and_grpc_equal_inference(server, deployment, qa_items, reference_answers, capsys,
                                                    tmp_path):
    """client.py (CLI over HTTP, function over gRPC) returns inference.py's answers for the same questions."""
    client = load_script("client")
    (tmp_path / "items.json").write_text(json.dumps(qa_items))
    assert client.main(["--url", server["http_url"], "--protocol", "http", "--export_dir", str(deployment[1]),
                        "--input_file", str(tmp_path / "items.json"), "--batch_size", "3", "--doc_stride", "64",
                        "--output", str(tmp_path / "answers.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "answers.json").read_text())
    assert_answers_equal(printed, reference_answers)
    assert any(len(r["nbest"]) > 1 for r in printed)

    connection = client.TritonQA(server["grpc_url"], "grpc", "bert_qa")
    try:
        tokenizer = BertTokenizer(deployment[1] / "vocab.txt", do_lower_case=True)
        got = client.answer_with_triton(connection, tokenizer, qa_items, max_seq_length=MAX_SEQ, doc_stride=64,
                                        batch_size=MAX_BATCH)
    finally:
        connection.close()
    assert_answers_equal(got, reference_answers)


def test_server_side_text_model_equals_inference(server, qa_items, reference_answers, capsys, tmp_path):
    """Raw strings to bert_qa_text (tokenization, BLS calls to bert_qa, post-processing in the server)."""
    client = load_script("client")
    (tmp_path / "items.json").write_text(json.dumps(qa_items))
    assert client.main(["--url", server["grpc_url"], "--protocol", "grpc", "--text_model",
                        "--input_file", str(tmp_path / "items.json"), "--batch_size", "4"]) == 0
    assert_answers_equal(json.loads(capsys.readouterr().out), reference_answers)

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
        "batch over max_batch_size": (tuple(np.repeat(a[:1], MAX_BATCH + 1, 0) for a in good), ("INT32",) * 3,
                                      INPUT_NAMES),
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


def test_perf_measures_latency_and_throughput(server, tmp_path):
    perf = load_script("perf")
    out = tmp_path / "perf.json"
    assert perf.main(["--url", server["grpc_url"], "--protocol", "grpc", "--model_name", "bert_qa",
                      "--batch_sizes", "1", "4", "--concurrency", "1", "2", "--seq_length", "32", "--seconds", "1",
                      "--warmup", "1", "--min_requests", "2", "--output", str(out)]) == 0
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
    proc = subprocess.run(["bash", str(SCRIPTS / "stop_server.sh"), server["state_dir"], "20"], capture_output=True,
                          text=True, timeout=60, env=script_env())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stopped"] == server["pid"]
    assert group_members(server["pid"]) == []
    assert not Path(server["state_dir"], "server.json").exists()
    with pytest.raises(Exception):
        httpclient.InferenceServerClient(server["http_url"], connection_timeout=2).is_server_live()


def test_launcher_refuses_bad_requests(tmp_path):
    """Clear one-line errors and a non-zero exit: a missing repository, a model it does not hold, no server."""
    env = script_env()
    missing = subprocess.run(["bash", str(SCRIPTS / "launch_server.sh"), str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=60, env=env)
    assert missing.returncode != 0 and "is not a folder" in missing.stderr
    (tmp_path / "repo").mkdir()
    no_model = subprocess.run(["bash", str(SCRIPTS / "launch_server.sh"), str(tmp_path / "repo"), "bert_qa"],
                              capture_output=True, text=True, timeout=60, env=env)
    assert no_model.returncode != 0 and "no config.pbtxt" in no_model.stderr
    stop = subprocess.run(["bash", str(SCRIPTS / "stop_server.sh"), str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert stop.returncode != 0 and "no server.json" in stop.stderr
