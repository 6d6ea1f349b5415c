"""SQuAD's feature cache: the features of an input file on disk, one .npz of integer arrays (read with
np.load(..., allow_pickle=False)), written atomically and keyed by a hash of everything the features depend on (the
input file, the vocabulary, every length), so that a second run over the same file skips the WordPiece pass.
`load_or_build_features` is what run_squad.py calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from bert_recipe.io.atomic_io import atomic_open
from bert_recipe.tasks.squad import InputFeatures, SquadExample, convert_examples_to_features
from bert_recipe.tasks.squad_answers import QASettings

logger = logging.getLogger(__name__)

# Bump whenever the feature layout or the cache file layout changes: old cache files are then ignored.
FEATURE_FORMAT_VERSION = 1


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def feature_cache_path(
    cache_dir: str | os.PathLike,
    input_file: str | os.PathLike,
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    version_2_with_negative: bool,
) -> Path:
    """The cache file for these features: its name holds a hash of everything the features depend on."""
    key = json.dumps(
        {
            "format": FEATURE_FORMAT_VERSION,
            "input": file_sha256(input_file),
            "vocab": file_sha256(tokenizer.vocab_file),
            "do_lower_case": tokenizer.do_lower_case,
            "max_seq_length": max_seq_length,
            "doc_stride": doc_stride,
            "max_query_length": max_query_length,
            "is_training": is_training,
            "v2": version_2_with_negative,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(input_file).stem)
    return Path(cache_dir) / f"{stem}.{'train' if is_training else 'predict'}.{max_seq_length}.{digest}.npz"


def save_features(path: str | os.PathLike, features: Sequence[InputFeatures]) -> None:
    """Write features as flat integer arrays; the per-window maps are concatenated with offsets."""
    if not features:
        raise ValueError("no features to cache")
    doc_offset = [min(f.token_to_orig_map, default=len(f.tokens) - 1) for f in features]
    map_lengths = [len(f.token_to_orig_map) for f in features]
    arrays = {
        "format": np.array(FEATURE_FORMAT_VERSION),
        "unique_id": np.array([f.unique_id for f in features], dtype=np.int64),
        "example_index": np.array([f.example_index for f in features], dtype=np.int64),
        "doc_span_index": np.array([f.doc_span_index for f in features], dtype=np.int32),
        "num_tokens": np.array([len(f.tokens) for f in features], dtype=np.int32),
        "input_ids": np.array([f.input_ids for f in features], dtype=np.int32).reshape(len(features), -1),
        "segment_ids": np.array([f.segment_ids for f in features], dtype=np.int8).reshape(len(features), -1),
        "start_position": np.array([f.start_position for f in features], dtype=np.int32),
        "end_position": np.array([f.end_position for f in features], dtype=np.int32),
        "is_impossible": np.array([f.is_impossible for f in features], dtype=bool),
        "doc_offset": np.array(doc_offset, dtype=np.int32),
        "map_offsets": np.concatenate([[0], np.cumsum(map_lengths, dtype=np.int64)]).astype(np.int64),
        "orig_index": np.array([i for f in features for i in f.token_to_orig_map.values()], dtype=np.int32),
        "is_max_context": np.array([b for f in features for b in f.token_is_max_context.values()], dtype=bool),
    }
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)


def load_features(path: str | os.PathLike, tokenizer) -> list[InputFeatures]:
    """Read features written by save_features (no pickled objects are accepted)."""
    with np.load(path, allow_pickle=False) as z:
        if int(z["format"]) != FEATURE_FORMAT_VERSION:
            raise ValueError(f"{path}: feature format {int(z['format'])}, expected {FEATURE_FORMAT_VERSION}")
        a = {k: z[k] for k in z.files}
    features = []
    for i in range(len(a["unique_id"])):
        n = int(a["num_tokens"][i])
        ids = a["input_ids"][i].tolist()
        lo, hi = int(a["map_offsets"][i]), int(a["map_offsets"][i + 1])
        offset = int(a["doc_offset"][i])
        positions = range(offset, offset + hi - lo)
        features.append(
            InputFeatures(
                unique_id=int(a["unique_id"][i]),
                example_index=int(a["example_index"][i]),
                doc_span_index=int(a["doc_span_index"][i]),
                tokens=tokenizer.convert_ids_to_tokens(ids[:n]),
                token_to_orig_map=dict(zip(positions, a["orig_index"][lo:hi].tolist())),
                token_is_max_context=dict(zip(positions, a["is_max_context"][lo:hi].tolist())),
                input_ids=ids,
                input_mask=[1] * n + [0] * (len(ids) - n),
                segment_ids=a["segment_ids"][i].tolist(),
                start_position=int(a["start_position"][i]),
                end_position=int(a["end_position"][i]),
                is_impossible=bool(a["is_impossible"][i]),
            )
        )
    return features


def load_or_build_features(
    input_file: str | os.PathLike,
    examples: Sequence[SquadExample],
    tokenizer,
    settings: QASettings,
    is_training: bool,
    cache_dir: str | os.PathLike | None,
    write_cache: bool = True,
    progress=None,
) -> tuple[list[InputFeatures], str]:
    """Features from the cache when it has them, else built (and cached when `write_cache`) with the window
    settings of `settings`. `cache_dir` None means no cache at all. Returns (features, how: "cache <path>" /
    "built" / "built, cached in <path>")."""
    max_seq_length, doc_stride, max_query_length = (
        settings.max_seq_length,
        settings.doc_stride,
        settings.max_query_length,
    )
    path = None
    if cache_dir is not None:
        path = feature_cache_path(
            cache_dir,
            input_file,
            tokenizer,
            max_seq_length,
            doc_stride,
            max_query_length,
            is_training,
            settings.version_2_with_negative,
        )
        if path.is_file():
            try:
                features = load_features(path, tokenizer)
                if features and features[-1].example_index == len(examples) - 1:
                    return features, f"cache {path}"
                logger.warning("feature cache %s does not match the examples; rebuilding it", path)
            except (OSError, ValueError, KeyError) as e:  # a truncated or foreign file: rebuild rather than fail
                logger.warning("feature cache %s unreadable (%s); rebuilding it", path, e)
    features = convert_examples_to_features(
        examples, tokenizer, max_seq_length, doc_stride, max_query_length, is_training, progress=progress
    )
    if path is not None and write_cache:
        try:
            save_features(path, features)
            return features, f"built, cached in {path}"
        except (OSError, ValueError) as e:  # a read-only data folder must not stop a run
            logger.warning("could not write feature cache %s: %s", path, e)
    return features, "built"
