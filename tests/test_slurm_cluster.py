"""tests/slurm_cluster.py's lock: a second Slurm cluster waits for the first one's end, or gives up with an error
that names the lock."""

from __future__ import annotations

import re
import threading
import time

import pytest
from slurm_cluster import SlurmError, one_cluster_at_a_time


def test_a_second_holder_waits_until_the_first_lets_go(tmp_path):
    lock = tmp_path / "slurm.lock"
    held, waited = threading.Event(), []

    def first():
        with one_cluster_at_a_time(lock):
            held.set()
            time.sleep(0.5)

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    start = time.monotonic()
    with one_cluster_at_a_time(lock, timeout=10):
        waited.append(time.monotonic() - start)
    thread.join()
    assert 0.3 < waited[0] < 5


def test_a_holder_that_stays_is_an_error_naming_the_lock(tmp_path):
    lock = tmp_path / "slurm.lock"
    with one_cluster_at_a_time(lock):
        with (
            pytest.raises(SlurmError, match=re.escape(f"held {lock} for 0 s")),
            one_cluster_at_a_time(lock, timeout=0.2),
        ):
            pass
    with one_cluster_at_a_time(lock, timeout=0.2):  # free again once the first block ended
        pass
