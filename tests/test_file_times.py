"""tests/file_times.py: the order in which pytest-xdist's workers list the test files (the longest first by the last
run's times, files without a time first by test count, each file's tests in their own order) and the times kept for
the next run."""

from __future__ import annotations

import types

from file_times import CACHE_KEY, FileTimes


class Cache:
    """pytest's config.cache, in memory."""

    def __init__(self, values: dict):
        self.values = values

    def get(self, key, default):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value


def item(nodeid: str):
    return types.SimpleNamespace(nodeid=nodeid)


def test_a_worker_lists_whole_files_longest_first_and_files_without_a_time_first():
    last = {"tests/test_a.py": 5.0, "tests/test_b.py": 60.0, "tests/test_c.py": 20.0}
    collected = [
        "tests/test_a.py::x",
        "tests/test_a.py::y",
        "tests/test_b.py::x",
        "tests/test_c.py::x",
        "tests/test_c.py::y[1]",
        "tests/test_c.py::y[2]",
        "tests/test_new.py::x",
        "tests/test_newer.py::x",
        "tests/test_newer.py::y",
    ]
    items = [item(n) for n in collected]
    config = types.SimpleNamespace(workerinput={CACHE_KEY: last})
    FileTimes(config).pytest_collection_modifyitems(config, items)
    assert [i.nodeid for i in items] == [
        "tests/test_newer.py::x",
        "tests/test_newer.py::y",
        "tests/test_new.py::x",
        "tests/test_b.py::x",
        "tests/test_c.py::x",
        "tests/test_c.py::y[1]",
        "tests/test_c.py::y[2]",
        "tests/test_a.py::x",
        "tests/test_a.py::y",
    ]


def test_without_xdist_the_collection_keeps_its_order():
    items = [item("tests/test_a.py::x"), item("tests/test_b.py::x")]
    config = types.SimpleNamespace(cache=Cache({CACHE_KEY: {"tests/test_b.py": 60.0}}))
    FileTimes(config).pytest_collection_modifyitems(config, items)
    assert [i.nodeid for i in items] == ["tests/test_a.py::x", "tests/test_b.py::x"]


def test_every_worker_gets_the_times_read_once():
    cache = Cache({CACHE_KEY: {"tests/test_a.py": 5.0}})
    times = FileTimes(types.SimpleNamespace(cache=cache))
    first, second = types.SimpleNamespace(workerinput={}), types.SimpleNamespace(workerinput={})
    times.pytest_configure_node(first)
    cache.set(CACHE_KEY, {"tests/test_a.py": 9.0})  # another run in the checkout finishes meanwhile
    times.pytest_configure_node(second)
    assert first.workerinput[CACHE_KEY] == second.workerinput[CACHE_KEY] == {"tests/test_a.py": 5.0}


def test_this_run_replaces_the_times_of_its_files_and_forgets_files_that_are_gone(tmp_path):
    (tmp_path / "tests").mkdir()
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / "tests" / name).touch()
    cache = Cache({CACHE_KEY: {"tests/test_a.py": 5.0, "tests/test_b.py": 60.0, "tests/test_gone.py": 9.0}})
    times = FileTimes(types.SimpleNamespace(cache=cache, rootpath=tmp_path))
    for nodeid, seconds in (("tests/test_a.py::x", 1.5), ("tests/test_a.py::x", 2.0), ("tests/test_a.py::y", 0.5)):
        times.pytest_runtest_logreport(types.SimpleNamespace(nodeid=nodeid, duration=seconds))
    times.pytest_sessionfinish()
    assert cache.values[CACHE_KEY] == {"tests/test_a.py": 4.0, "tests/test_b.py": 60.0}


def test_a_worker_keeps_no_times():
    cache = Cache({})
    times = FileTimes(types.SimpleNamespace(cache=cache, workerinput={}))
    times.pytest_runtest_logreport(types.SimpleNamespace(nodeid="tests/test_a.py::x", duration=1.0))
    times.pytest_sessionfinish()
    assert cache.values == {}
