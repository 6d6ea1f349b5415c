"""dist_env.exit_script: how an entry script's process ends.

A single process exits the usual way, with main's status; one process of a multi-process run (WORLD_SIZE > 1) ends
without Python's finalisation (os._exit: its atexit handlers do not run), after flushing what it printed. Why: see
exit_script's docstring; bench/exit_race.py counts the aborts it removes (tests/README.md, the reliability table).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import subprocess_env

from bert_recipe.training import dist_env

REPO = Path(__file__).resolve().parent.parent


def ended_with(monkeypatch, main) -> object:
    """exit_script(main) in this process, one process of one: the SystemExit's code."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as stop:
        dist_env.exit_script(main)
    return stop.value.code


def raising(code):
    def main():
        raise SystemExit(code)

    return main


def test_a_single_process_exits_with_what_main_returns_or_raises(monkeypatch, capsys):
    assert ended_with(monkeypatch, lambda: 75) == 75  # run_pretraining's "stopped by a signal, run again"
    assert ended_with(monkeypatch, lambda: 0) == 0
    assert ended_with(monkeypatch, lambda: {"exact_match": 80.0}) == 0  # run_squad's main returns its summary
    assert ended_with(monkeypatch, lambda: None) == 0
    assert ended_with(monkeypatch, raising(1)) == 1  # script_errors' one-line failure
    assert ended_with(monkeypatch, raising(None)) == 0
    assert capsys.readouterr().err == ""
    assert ended_with(monkeypatch, raising("run_x.py: no such file")) == 1  # as Python prints sys.exit("...")
    assert capsys.readouterr().err == "run_x.py: no such file\n"


SCRIPT = """
import atexit, sys
sys.path.insert(0, {repo!r})
from bert_recipe.training import dist_env
atexit.register(lambda: print("finalised", flush=True))
print("the run's last line", end="")  # no newline, no flush: still in stdout's buffer (a pipe is block-buffered)
dist_env.exit_script(lambda: {status})
"""


def run_script(tmp_path: Path, world_size: str, status: int) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(repo=str(REPO), status=status))
    return subprocess.run(
        [sys.executable, str(script)],
        env={**subprocess_env(), "WORLD_SIZE": world_size},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("status", [0, 75])
def test_a_process_of_a_multi_process_run_skips_finalisation_and_loses_no_output(tmp_path, status):
    alone = run_script(tmp_path, "1", status)
    assert alone.returncode == status and alone.stdout == "the run's last line" + "finalised\n", alone.stderr
    one_of_two = run_script(tmp_path, "2", status)
    assert one_of_two.returncode == status, one_of_two.stderr
    assert one_of_two.stdout == "the run's last line"  # flushed, and no atexit handler ran: no finalisation


def test_exit_race_bench_runs_both_endings(tmp_path):
    """bench/exit_race.py at its smallest: one two-process launch each way. The exit_script launch must end 0; the
    sys.exit one may or may not abort (5 launches of 40 did in one trial), so only its record is checked."""
    out = tmp_path / "race"
    done = subprocess.run(
        [sys.executable, "-m", "bench.exit_race", "--runs", "1", "--numel", "1024", "--out", str(out)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "exit_race.json").read_text())
    assert [r["way"] for r in report["runs"]] == ["sys.exit", "exit_script"]
    by_way = {r["way"]: r for r in report["runs"]}
    assert by_way["exit_script"]["returncode"] == 0, by_way["exit_script"]["tail"]
    plain = by_way["sys.exit"]
    assert plain["returncode"] == 0 or plain["abort"], plain["tail"]  # a failure other than the abort is a bug
    assert report["summary"] == {
        "sys.exit": {"runs": 1, "failed": int(plain["returncode"] != 0), "aborts": int(plain["abort"]), "hung": 0},
        "exit_script": {"runs": 1, "failed": 0, "aborts": 0, "hung": 0},
    }
    assert "| exit_script | 1 | 0 | 0 | 0 |" in (out / "exit_race.md").read_text()


def test_exit_race_bench_kills_a_hung_launch_with_its_workers(tmp_path):
    """--timeout shorter than a launch's start-up: every launch counts as hung and is killed; no process of it (the
    launcher or a worker it had started) is left running."""
    out = tmp_path / "race"
    done = subprocess.run(
        [sys.executable, "-m", "bench.exit_race", "--runs", "1", "--timeout", "0.5", "--out", str(out)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "exit_race.json").read_text())
    assert [(r["hung"], r["returncode"]) for r in report["runs"]] == [(True, None), (True, None)]
    assert {way: t["hung"] for way, t in report["summary"].items()} == {"sys.exit": 1, "exit_script": 1}
    left = [cmdline for cmdline in map(cmdline_of, Path("/proc").glob("[0-9]*")) if b"bench.exit_race\0" in cmdline]
    assert left == [], f"processes of a killed launch are still running: {left}"


def cmdline_of(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:  # the process ended meanwhile
        return b""
