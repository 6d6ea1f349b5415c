"""What a pipeline stage has written, so that a rerun computes only what is missing.

    manifest = Manifest.open(folder / "manifest.json", settings={...})   # the settings that make the outputs
    if not manifest.reusable("shard_3.hdf5"): ... run the task ...; manifest.record("shard_3.hdf5", rows, sha256)
    manifest.report("create_hdf5_files", log)       # "reused 5 of 8 outputs, computed 3"

The manifest is a JSON file beside the outputs: the settings and, for each output, its file name (relative to the
manifest's folder), its rows (documents, sentences, instances: what the stage counts) and its sha256. It is
rewritten atomically (tasks write their outputs atomically too) at most every `SAVE_EVERY_S` seconds while a stage
records outputs, and at its end: so after a crash, a `scancel` or a lost node, every output the manifest lists is
whole, and a stage of many thousand tasks does not rewrite a growing file after each one (an output finished but
not yet listed is computed again, to the same bytes). An output is reused on a rerun when the
manifest was made with the same settings, lists it, and the file's sha256 still matches; otherwise it is computed
again. A manifest of other settings is set aside (its outputs are recomputed), never mixed with the new ones.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bert_recipe.io.atomic_io import atomic_write_json

SAVE_EVERY_S = 2.0


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Manifest:
    path: Path
    settings: dict[str, Any]
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    reused: int = 0
    computed: int = 0
    _saved_at: float = 0.0

    @classmethod
    def open(cls, path: str | Path, settings: dict[str, Any]) -> "Manifest":
        """The manifest at `path` when it was made with `settings` (JSON-normalised), else an empty one."""
        path = Path(path)
        settings = json.loads(json.dumps(settings))  # tuples -> lists, Paths are the caller's to str()
        outputs = {}
        if path.is_file():
            try:
                old = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                old = {}
            if old.get("settings") == settings:
                outputs = old.get("outputs", {})
        return cls(path, settings, outputs)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def reusable(self, name: str) -> bool:
        """Whether output `name` is listed and its file still has the recorded sha256 (counted as reused)."""
        entry = self.outputs.get(name)
        file = self.folder / name
        ok = entry is not None and file.is_file() and sha256_file(file) == entry["sha256"]
        if ok:
            self.reused += 1
        else:
            self.outputs.pop(name, None)
        return ok

    def record(self, name: str, rows: int, sha256: str, **extra: Any) -> None:
        """Output `name` is complete: listed with its rows and sha256 (on disk within SAVE_EVERY_S seconds; the
        stage calls save() at its end)."""
        self.outputs[name] = {"rows": int(rows), "sha256": sha256, **extra}
        self.computed += 1
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def save(self, **summary: Any) -> None:
        atomic_write_json(
            self.path, {"settings": self.settings, **summary, "outputs": dict(sorted(self.outputs.items()))}
        )
        self._saved_at = time.monotonic()

    def report(self, stage: str, log: Callable[[str], None] = print) -> dict[str, int]:
        counts = {"reused": self.reused, "computed": self.computed}
        if self.reused:
            log(
                f"{stage}: reused {self.reused} of {self.reused + self.computed} outputs from {self.path} (same "
                f"settings, sha256 checked), computed {self.computed}"
            )
        return counts
