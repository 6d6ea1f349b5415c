"""atomic_io's one temporary-file + fsync + rename: atomic_path (any writer that opens a file by name) and
atomic_open (a file object), which both go through it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from bert_recipe.io import atomic_io


class Boom(Exception):
    pass


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_path_publishes_the_written_bytes_only_at_the_end(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    with atomic_io.atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".out.bin.") and tmp.name.endswith(".tmp")
        assert not target.exists()  # nothing under the final name while the block runs
        tmp.write_bytes(b"payload")
        assert not target.exists()
    assert target.read_bytes() == b"payload"
    assert listing(target.parent) == ["out.bin"]  # no temporary file left
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()  # the permissions of any new file, not mkstemp's 0600


def test_atomic_path_failure_leaves_neither_target_nor_temporary(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(Boom):
        with atomic_io.atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise Boom
    assert listing(tmp_path) == []


def test_atomic_path_failure_keeps_the_existing_target(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(Boom):
        with atomic_io.atomic_path(target) as tmp:
            tmp.write_bytes(b"new")
            raise Boom
    assert target.read_bytes() == b"old" and listing(tmp_path) == ["out.bin"]
    with atomic_io.atomic_path(target) as tmp:  # and a success replaces it
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and listing(tmp_path) == ["out.bin"]


def test_atomic_path_names_the_target_in_an_oserror_without_a_file_name(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(OSError) as info:
        with atomic_io.atomic_path(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert info.value.filename == str(target) and listing(tmp_path) == []


def test_atomic_path_with_h5py(tmp_path):
    target = tmp_path / "shard.hdf5"
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    with atomic_io.atomic_path(target) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("input_ids", data=data)
        assert not target.exists()
    with h5py.File(target, "r") as f:
        np.testing.assert_array_equal(f["input_ids"][:], data)
    assert listing(tmp_path) == ["shard.hdf5"]

    old = target.read_bytes()
    with pytest.raises(Boom):
        with atomic_io.atomic_path(target) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("input_ids", data=data * 2)
            raise Boom
    assert target.read_bytes() == old and listing(tmp_path) == ["shard.hdf5"]


def test_atomic_open_goes_through_the_same_primitive(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(Boom):
        with atomic_io.atomic_open(target, "w", encoding="utf-8") as f:
            f.write("new")
            raise Boom
    assert target.read_text() == "old" and listing(tmp_path) == ["out.txt"]
    with atomic_io.atomic_open(target, "w", encoding="utf-8") as f:
        f.write("new")
    assert target.read_text() == "new" and listing(tmp_path) == ["out.txt"]


def test_every_rename_is_fsynced_first(tmp_path, monkeypatch):
    """The file's bytes reach the disk before the rename, and the folder after it."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", _kind(fd))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(b).name)), real_replace(a, b))[1])
    with atomic_io.atomic_path(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"a")
    assert events == [("fsync", "file"), ("replace", "a.bin"), ("fsync", "folder")]
    events.clear()
    part = tmp_path / "b.bin.part"  # a resumable download's file, published when verified
    part.write_bytes(b"b")
    atomic_io.durable_replace(part, tmp_path / "b.bin")
    assert events == [("fsync", "file"), ("replace", "b.bin"), ("fsync", "folder")]
    assert (tmp_path / "b.bin").read_bytes() == b"b" and not part.exists()


def _kind(fd: int) -> str:
    import stat

    return "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
