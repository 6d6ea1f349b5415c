"""Latency and throughput of a model on a running Triton server, over batch sizes and concurrency levels
(in the spirit of perf_analyzer, in Python with tritonclient, so it runs wherever the client does).

    PYTHONPATH=. .venv/bin/python triton/perf.py --url 127.0.0.1:8000 --protocol http --model_name bert_qa \
        --batch_sizes 1 8 32 --concurrency 1 2 4 --seq_length 384 --output results/triton_perf.json

For every (batch size, concurrency) pair, `concurrency` threads, each with its own client connection, send requests
back to back (a closed loop: each thread waits for its answer before the next request) for --seconds after
--warmup requests per thread. Reported per pair: latency p50/p90/p99/mean in ms (client-side, request sent to
answer received), throughput in sequences/s (sequences answered / wall time of the window), requests and errors.

Inputs are synthetic (ids drawn uniformly from the vocabulary, no padding, second half segment B), the dtype taken
from the server's model metadata. Writes JSON (--output), a table on stdout, and a plot (--plot, PNG).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open, atomic_write_json
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.io.triton_scripts import load_triton_script

client_script = load_triton_script("client")  # its connection helpers (triton/ is not a package: loaded by path)
INPUT_NAMES = client_script.INPUT_NAMES


@dataclass(frozen=True)
class PerfServer(client_script.Server):
    """client.py's server flags, with room for the biggest batches."""

    timeout: float = 300.0


@dataclass(frozen=True)
class Load:
    """The requests: their batch sizes, how many are in flight, their length, how long each pair is measured."""

    batch_sizes: list[int] = flag(factory=lambda: [1, 8, 32])
    """sequences per request, one measurement each"""
    concurrency: list[int] = flag(factory=lambda: [1, 2, 4])
    """threads sending requests back to back, one measurement each"""
    seq_length: int = 384
    """tokens per sequence"""
    seconds: float = 10.0
    """measurement window per configuration"""
    min_requests: int = 5
    """per configuration: keep measuring past --seconds until this many requests answered"""
    warmup: int = 2
    """unmeasured requests per thread before each window"""
    vocab_size: int = 30522
    """ids are drawn below this"""


@dataclass(frozen=True)
class Report:
    """Where the numbers go."""

    output: str = "results/triton_perf.json"
    """the JSON report"""
    plot: str | None = None
    """PNG path; default: --output with .png"""
    no_plot: bool = False
    """write no plot"""


@dataclass(frozen=True)
class PerfConfig(flags.Config):
    """Every flag of perf.py."""

    server: PerfServer = field(default_factory=PerfServer)
    load: Load = field(default_factory=Load)
    report: Report = field(default_factory=Report)

    ungrouped: ClassVar[tuple[str, ...]] = ("server", "load", "report")
    has_debug: ClassVar[bool] = False

    def rules(self) -> list[tuple[bool, str]]:
        load = self.load
        return [
            (
                any(b < 1 for b in load.batch_sizes) or any(c < 1 for c in load.concurrency) or load.seq_length < 1,
                "--batch_sizes, --concurrency and --seq_length must be positive",
            )
        ]


def input_dtype(module, url: str, model: str, protocol: str) -> str:
    """The Triton dtype (INT64 / INT32) of input_ids from the server's model metadata."""
    client = module.InferenceServerClient(url)
    try:
        by_name = client_script.input_datatypes(client, model, protocol)
    finally:
        client.close()
    missing = [n for n in INPUT_NAMES if n not in by_name]
    if missing:
        raise InputError(f"--model_name {model} has no inputs {missing}: is it a BERT tensor model?")
    return by_name["input_ids"]


def make_inputs(module, batch: int, seq_len: int, dtype: str, vocab_size: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    np_dtype = np.int64 if dtype == "INT64" else np.int32
    arrays = [
        rng.integers(1000 if vocab_size > 1000 else 1, vocab_size, (batch, seq_len)).astype(np_dtype),
        np.zeros((batch, seq_len), np_dtype),
        np.ones((batch, seq_len), np_dtype),
    ]
    arrays[1][:, seq_len // 2 :] = 1
    inputs = []
    for name, array in zip(INPUT_NAMES, arrays):
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def measure(module, cfg: PerfConfig, batch: int, concurrency: int, dtype: str) -> dict:
    """One closed-loop window at this batch size and concurrency."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    first_error: list[str] = []
    go = threading.Barrier(concurrency + 1)
    stop = threading.Event()

    def worker(k: int) -> None:
        kwargs = {"network_timeout": cfg.server.timeout} if cfg.server.protocol == "http" else {}
        client = module.InferenceServerClient(cfg.server.url, **kwargs)
        inputs = make_inputs(module, batch, cfg.load.seq_length, dtype, cfg.load.vocab_size, seed=k)
        try:
            for _ in range(cfg.load.warmup):
                client.infer(cfg.server.model_name, inputs)
            go.wait()
        except Exception as e:  # warm-up failed (or another thread's did): no window for this configuration
            if not isinstance(e, threading.BrokenBarrierError):
                errors[k] += 1
                first_error.append(str(e).splitlines()[0])
            go.abort()
            client.close()
            return
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    client.infer(cfg.server.model_name, inputs)
                except Exception as e:  # counted and reported; the window goes on
                    errors[k] += 1
                    first_error.append(str(e).splitlines()[0])
                    continue
                latencies[k].append(time.perf_counter() - t0)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    try:
        go.wait(timeout=cfg.server.timeout * (cfg.load.warmup + 1))
    except threading.BrokenBarrierError:
        stop.set()
    start = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.05)
        done = sum(len(x) for x in latencies)
        elapsed = time.perf_counter() - start
        if elapsed >= cfg.load.seconds and (done >= cfg.load.min_requests or elapsed >= cfg.server.timeout):
            break
    stop.set()
    for t in threads:
        t.join(timeout=cfg.server.timeout)
    wall = time.perf_counter() - start  # includes the last in-flight requests, which are counted too
    flat = np.array([x for per_thread in latencies for x in per_thread]) * 1e3
    result = {
        "batch_size": batch,
        "concurrency": concurrency,
        "seq_length": cfg.load.seq_length,
        "requests": int(flat.size),
        "errors": int(sum(errors)),
        "wall_s": round(wall, 3),
        "throughput_seq_per_s": round(flat.size * batch / wall, 3),
    }
    if flat.size:
        result.update({f"latency_p{q}_ms": round(float(np.percentile(flat, q)), 3) for q in (50, 90, 99)})
        result["latency_mean_ms"] = round(float(flat.mean()), 3)
    if first_error:
        result["first_error"] = first_error[0]
    return result


def table(rows: list[dict]) -> str:
    head = "| batch | concurrency | p50 ms | p90 ms | p99 ms | seq/s | requests | errors |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['batch_size']} | {r['concurrency']} | {r.get('latency_p50_ms', '-')} | "
            f"{r.get('latency_p90_ms', '-')} | {r.get('latency_p99_ms', '-')} | "
            f"{r['throughput_seq_per_s']} | {r['requests']} | {r['errors']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Throughput and p90 latency against concurrency, one line per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for batch in sorted({r["batch_size"] for r in rows}):
        mine = [r for r in rows if r["batch_size"] == batch and r["requests"]]
        conc = [r["concurrency"] for r in mine]
        ax1.plot(conc, [r["throughput_seq_per_s"] for r in mine], marker="o", label=f"batch {batch}")
        ax2.plot(conc, [r["latency_p90_ms"] for r in mine], marker="o", label=f"batch {batch}")
    ax1.set(xlabel="concurrent requests", ylabel="sequences / s", title="throughput")
    ax2.set(xlabel="concurrent requests", ylabel="ms", title="p90 latency", yscale="log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """0 when every request succeeded, 1 when some failed (counted in the table); bad input or an unreachable
    server: one line on stderr, exit status 1."""
    with script_errors("perf.py", argv):
        return _main(argv)


def _main(argv) -> int:
    cfg = flags.parse(PerfConfig, "perf.py", __doc__, argv)
    module = client_script.client_module(cfg.server.protocol)
    try:
        dtype = input_dtype(module, cfg.server.url, cfg.server.model_name, cfg.server.protocol)
    except InputError:
        raise
    except Exception as e:  # the client's own errors (connection refused, an unknown model)
        raise InputError(
            f"--url {cfg.server.url} ({cfg.server.protocol}): cannot read model {cfg.server.model_name!r}: "
            f"{str(e).splitlines()[0]}"
        ) from None
    rows = []
    for batch in cfg.load.batch_sizes:
        for concurrency in cfg.load.concurrency:
            rows.append(measure(module, cfg, batch, concurrency, dtype))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    report = {
        "url": cfg.server.url,
        "protocol": cfg.server.protocol,
        "model": cfg.server.model_name,
        "input_dtype": dtype,
        "seq_length": cfg.load.seq_length,
        "seconds_per_config": cfg.load.seconds,
        "results": rows,
    }
    atomic_write_json(cfg.report.output, report)
    print(table(rows))
    if not cfg.report.no_plot:
        path = Path(cfg.report.plot) if cfg.report.plot else Path(cfg.report.output).with_suffix(".png")
        plot(rows, path, f"{cfg.server.model_name} on Triton ({cfg.server.protocol}), sequence {cfg.load.seq_length}")
        print(f"wrote {cfg.report.output} and {path}", file=sys.stderr)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
