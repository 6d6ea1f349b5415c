"""The --input_file of inference.py and triton/client.py: the items to answer or classify, read one way for both.

    [{"id"?, "question", "context"}, ...]   or   [{"id"?, "text_a", "text_b"?}, ...]

from a JSON list, a JSON-lines file (one object per line, blank lines skipped; a single object is a one-line
file), or a SQuAD file (v1.1 / v2.0, nested or Hugging Face's flat layout: every question with its context).
Anything else is a ValueError naming the file and the place: a line that is not JSON, an item that is not an
object, a SQuAD paragraph without its "qas" list or "context", a question without "id" or "question", a file
with no items. Which fields an item needs is checked by the task (tasks.squad.examples_from_qa_pairs,
predict.classify). No torch here: the Triton client imports this.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from bert_recipe.tasks.squad import squad_articles


def read_items(path: str | os.PathLike) -> list[dict]:
    """The items of a JSON list, JSON-lines or SQuAD file, in file order; FileNotFoundError / ValueError."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"input file {path} not found")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not JSON
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"input file {path} is not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line "
            f"{line}): {e.reason}; save it as UTF-8"
        ) from None
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
            raise ValueError(
                f"input file {path} line {n} is not JSON ({e.msg}); expected a JSON list or one JSON object per line"
            ) from None
    return items


def _squad_items(file: Path) -> list[dict]:
    """{"id", "question", "context"} per question of a SQuAD file (tasks.squad reads its layouts)."""
    items = []
    for i, article in enumerate(squad_articles(file)):
        for j, paragraph in enumerate(article["paragraphs"]):
            where = f"input file {file}: data[{i}].paragraphs[{j}]"
            if (
                not isinstance(paragraph, dict)
                or not isinstance(paragraph.get("qas"), list)
                or not isinstance(paragraph.get("context"), str)
            ):
                raise ValueError(f"{where} needs a 'context' string and a 'qas' list")
            for k, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict) or "id" not in qa or "question" not in qa:
                    raise ValueError(f"{where}.qas[{k}] needs 'id' and 'question'")
                items.append({"id": str(qa["id"]), "question": qa["question"], "context": paragraph["context"]})
    if not items:
        raise ValueError(f"input file {file} holds no questions")
    return items


# ----------------------------------------------------------------------------------------------------------------
# Text checks and size limits shared by inference.py and the Triton server-side text model
# (triton/backend/qa_text_model.py): the same refusals, each a one-line ValueError naming the input and the limit.

# Defaults (0 turns a limit off). A context of 20,000 characters is ~4,500 WordPiece tokens: ~35 windows of 384
# tokens at stride 128, some 25 s of MiniLM compute on a 2-core CPU. The server refuses beyond that by default so
# that one request cannot hold the others for long; inference.py runs on the user's own machine and allows more.


@dataclass(frozen=True)
class InputLimits:
    """How much text a command takes before any model work, with inference.py's defaults; each field is one flag of
    the commands that answer, a section of their configurations (0: no limit)."""

    max_context_chars: int = 100_000
    """refuse a context (or a sentence to classify) longer than this many characters"""
    max_question_chars: int = 2_000
    """refuse a question longer than this many characters"""
    max_windows: int = 512
    """refuse a question (the server: a request, all rows together) whose context needs more windows than this"""


@dataclass(frozen=True)
class ServerLimits(InputLimits):
    """The Triton text model's limits: lower, so that one request cannot hold the others for long."""

    max_context_chars: int = 20_000
    max_windows: int = 64


SERVER_LIMITS = ServerLimits()


def utf8_error(data: bytes) -> str | None:
    """Where `data` stops being UTF-8 ("byte 0xff at offset 7: invalid start byte"), or None when it is UTF-8."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"byte 0x{data[e.start]:02x} at offset {e.start}: {e.reason}"
    return None


def decode_utf8(data: bytes, what: str) -> str:
    """`data` as text; ValueError naming `what` and the first offending byte when it is not UTF-8."""
    problem = utf8_error(data)
    if problem is not None:
        raise ValueError(f"{what} is not UTF-8 ({problem})")
    return data.decode("utf-8")


def text_utf8_error(text: str) -> str | None:
    """Why a str cannot be UTF-8 text, or None. A command-line argument with bytes that are not UTF-8 reaches
    Python as lone surrogates (U+DC80..U+DCFF, PEP 383); a JSON file can spell lone surrogates as \\ud800 escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = (
            text.encode("utf-8", "surrogateescape")
            if all(0xDC80 <= ord(c) <= 0xDCFF for c in text[e.start : e.end])
            else None
        )
        if raw is not None:
            return utf8_error(raw)
        return f"lone surrogate U+{ord(text[e.start]):04X} at character {e.start}"
    return None


def check_text(text, label: str, limit: int, limit_name: str, how_to_raise: str) -> None:
    """ValueError (one line) for a text that is not UTF-8, empty or blank, or longer than `limit` characters
    (0: no limit). `label` names it ("row 0: the context", "--context"); `how_to_raise` says how the limit
    changes, with {name} standing for `limit_name` ({NAME} for it in capitals). A missing or non-string field is
    left to the task (examples_from_qa_pairs, predict.classify), which names what it needs."""
    if not isinstance(text, str):
        return
    problem = text_utf8_error(text)
    if problem is not None:
        raise ValueError(f"{label} is not UTF-8 text ({problem})")
    if not text.strip():
        raise ValueError(f"{label} is empty: nothing to answer or classify")
    if limit and len(text) > limit:
        raise ValueError(
            f"{label} has {len(text):,} characters, over the limit {limit_name}={limit:,}; "
            f"{_how(how_to_raise, limit_name)}"
        )


def check_qa_text(
    question, context, where: str, max_question_chars: int, max_context_chars: int, how_to_raise: str
) -> None:
    """check_text for a question and its context; `where` names the item ("item 3 of --input_file q.json")."""
    check_text(question, f"{where}: the question", max_question_chars, "max_question_chars", how_to_raise)
    check_text(context, f"{where}: the context", max_context_chars, "max_context_chars", how_to_raise)


def check_windows(count: int, limit: int, where: str, how_to_raise: str) -> None:
    """ValueError when `count` windows exceed `limit` (0: no limit)."""
    if limit and count > limit:
        raise ValueError(
            f"{where} needs {count:,} windows, over the limit max_windows={limit:,}; "
            f"{_how(how_to_raise, 'max_windows')}"
        )


def _how(how_to_raise: str, name: str) -> str:
    return how_to_raise.format(name=name, NAME=name.upper())
