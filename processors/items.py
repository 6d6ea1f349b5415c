"""The --input_file of inference.py and triton/client.py: the items to answer or classify, read one way for both.

    [{"id"?, "question", "context"}, ...]   or   [{"id"?, "text_a", "text_b"?}, ...]

from a JSON list, a JSON-lines file (one object per line, blank lines skipped; a single object is a one-line
file), or a SQuAD file (v1.1 / v2.0, nested or Hugging Face's flat layout: every question with its context).
Anything else is a ValueError naming the file and the place: a line that is not JSON, an item that is not an
object, a SQuAD paragraph without its "qas" list or "context", a question without "id" or "question", a file
with no items. Which fields an item needs is checked by the task (processors.squad.examples_from_qa_pairs,
inference.classify). No torch here: the Triton client imports this.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def read_items(path: str | os.PathLike) -> list[dict]:
    """The items of a JSON list, JSON-lines or SQuAD file, in file order; FileNotFoundError / ValueError."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"input file {path} not found")
    text = file.read_text(encoding="utf-8")  # not UTF-8: UnicodeDecodeError, a ValueError
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = _json_lines(text, path)
    if isinstance(obj, dict) and "data" in obj:
        return _squad_items(file)
    if isinstance(obj, dict):
        obj = [obj]
    if not isinstance(obj, list):
        raise ValueError(f"input file {path} holds a JSON {type(obj).__name__}, expected a list of objects")
    for i, item in enumerate(obj):
        if not isinstance(item, dict):
            raise ValueError(f"input file {path}: item {i} is a JSON {type(item).__name__}, expected an object")
    if not obj:
        raise ValueError(f"input file {path} holds no items")
    return obj


def _json_lines(text: str, path) -> list:
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"input file {path} line {n} is not JSON ({e.msg}); expected a JSON list or one JSON "
                             "object per line") from None
    return items


def _squad_items(file: Path) -> list[dict]:
    """{"id", "question", "context"} per question of a SQuAD file (processors.squad reads its layouts)."""
    from processors.squad import squad_articles

    items = []
    for i, article in enumerate(squad_articles(file)):
        for j, paragraph in enumerate(article["paragraphs"]):
            where = f"input file {file}: data[{i}].paragraphs[{j}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list) \
                    or not isinstance(paragraph.get("context"), str):
                raise ValueError(f"{where} needs a 'context' string and a 'qas' list")
            for k, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict) or "id" not in qa or "question" not in qa:
                    raise ValueError(f"{where}.qas[{k}] needs 'id' and 'question'")
                items.append({"id": str(qa["id"]), "question": qa["question"], "context": paragraph["context"]})
    if not items:
        raise ValueError(f"input file {file} holds no questions")
    return items
