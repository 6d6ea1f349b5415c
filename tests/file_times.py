"""The time each test file takes: a table at the end of a run (README: the suite stays within 10 minutes on 2
cores), kept in pytest's cache, and the order in which pytest-xdist hands the files to its workers (scripts/test.sh:
--dist loadfile --no-loadscope-reorder): the longest first by the last run's times, so that no worker starts a long
file while the others are nearly done (about 30 s a run on 2 cores). Files without a time yet go first, those with
the most tests first, as xdist orders them itself; so a fresh checkout runs in xdist's own order.

Registered by tests/conftest.py; only pytest's and xdist's public hooks.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

CACHE_KEY = "bert_recipe/seconds_per_file"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FileTimes:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.seconds: dict[str, float] = {}
        self.last: dict[str, float] | None = None

    def last_run(self) -> dict[str, float]:
        """The last run's times, read once: every worker must get the same, even when another run in this checkout
        rewrites the cache meanwhile (xdist stops a run whose workers collected different lists)."""
        if self.last is None:
            cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
            self.last = cache.get(CACHE_KEY, {}) if cache is not None else {}
        return self.last

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """On the controller, for each worker it starts: the times it orders its collection by."""
        node.workerinput[CACHE_KEY] = self.last_run()

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """On an xdist worker: whole files, the longest first; each file's tests keep their order."""
        if not hasattr(config, "workerinput"):
            return
        last = config.workerinput.get(CACHE_KEY, {})
        tests = Counter(file_of(item.nodeid) for item in items)

        def longest_first(item: pytest.Item) -> tuple[float, int]:
            path = file_of(item.nodeid)
            return -last.get(path, math.inf), -tests[path]

        items.sort(key=longest_first)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Setup + call + teardown time per test file (with several workers: the time on the worker that ran it)."""
        path = file_of(report.nodeid)
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section("time per test file (on its worker)")
        for path, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
        terminalreporter.write_line(f"{sum(self.seconds.values()):8.1f} s  in all")

    def pytest_sessionfinish(self) -> None:
        """This run's times over the last run's, for the files that still exist (not on a worker: the controller
        has them all)."""
        cache = getattr(self.config, "cache", None)
        if cache is None or hasattr(self.config, "workerinput") or not self.seconds:
            return
        times = {**cache.get(CACHE_KEY, {}), **self.seconds}
        cache.set(CACHE_KEY, {path: s for path, s in times.items() if (self.config.rootpath / path).is_file()})
