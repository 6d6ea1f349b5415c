"""WikiText (or any plain text) -> documents: one per line (for `python -m bert_recipe.prep.sharding`), or one sentence
per line with a blank line between documents (`--sentences`, the input of create_pretraining_data.py).

The CPU demo (scripts/run_cpu_demo.sh) pre-trains on ../shared/data/wikitext-2, whose files look like

     = Homarus gammarus =                      <- an article starts (one "=" on each side)
     Homarus gammarus , known as ... @-@ ...   <- a paragraph, one line, pre-tokenized, rare words as <unk>
     = = Description = =                       <- a section heading (two or more "=")

The conversion, which is all this file does:
  * a top-level heading " = Title = " starts a new document; section headings and blank lines are dropped;
  * WikiText's escapes are undone: " @-@ " -> "-", " @,@ " -> ",", " @.@ " -> "."; "<unk>" is dropped (BERT's
    tokenizer would cut it into "<", "un", "##k", ">", four tokens of noise);
  * every paragraph of an article goes, space-joined, onto the article's one line.
WikiExtractor output (`<doc ...>` ... `</doc>`, gzip-compressed or not: ../shared/data/wikipedia-en-slice, or the
output of an older recipe's WikiExtractor step) is read with bert_recipe/prep/text_formatting.py's reader: one document
per `<doc>`, its paragraphs as they are, the repeated title line dropped.
Any other text file (no WikiText headings found) is read as documents separated by blank lines.
A folder stands for every *.txt, *.gz and wiki_* file under it (sorted; data/create_vocab.py's rule).
With --sentences each paragraph is split into sentences by bert_recipe/prep/sentence_segmentation.py (blingfire) when it
is importable, else at " . ", " ? ", " ! " (right for WikiText's pre-tokenized text, rough for other text).
--test_fraction F writes the last F of the documents (at least one) to a second file, for held-out evaluation.

    python -m scripts.text_to_documents --input ../shared/data/wikitext-2/valid.txt --output docs.txt
    python -m scripts.text_to_documents --input corpus/ --output train.txt --sentences \
        --test_fraction 0.05 --test_output test.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Iterator

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prep.text_formatting import is_wikiextractor, iter_wikiextractor_docs, open_text
from bert_recipe.prep.vocab import list_input_files

_ARTICLE = re.compile(r"^ ?= [^=].* = ?$")  # " = Title = " (a section is " = = Title = = ")
_SECTION = re.compile(r"^ ?(= ){2,}.*( =){2,} ?$")
_ESCAPE = re.compile(r"\s*@([-,.])@\s*")  # " @-@ " -> "-", " @,@ " -> ",", " @.@ " -> "."


def clean_wikitext_line(line: str) -> str:
    """Drop <unk>, undo WikiText's number/hyphen escapes; collapse whitespace."""
    return _ESCAPE.sub(r"\1", " ".join(word for word in line.split() if word != "<unk>"))


def is_wikitext(lines: list[str]) -> bool:
    """True when the text has WikiText article headings (" = Title = ") in its first 200 lines."""
    return any(_ARTICLE.match(line.rstrip("\n")) for line in lines[:200])


def iter_documents(path: str | Path) -> Iterator[list[str]]:
    """Yield each document of a text file as a list of paragraphs (non-empty, cleaned for WikiText)."""
    if is_wikiextractor(path):
        yield from (paragraphs for _, paragraphs in iter_wikiextractor_docs(path) if paragraphs)
        return
    with open_text(path) as f:
        lines = f.read().splitlines()
    wikitext = is_wikitext(lines)
    doc: list[str] = []
    for raw in lines:
        line = raw.rstrip()
        if wikitext and _ARTICLE.match(line) and not _SECTION.match(line):
            if doc:
                yield doc
            doc = []
        elif wikitext and _SECTION.match(line):
            continue
        elif not line.strip():
            if not wikitext and doc:  # plain text: a blank line ends a document
                yield doc
                doc = []
        else:
            text = clean_wikitext_line(line) if wikitext else " ".join(line.split())
            if text:
                doc.append(text)
    if doc:
        yield doc


def sentence_splitter() -> Callable[[str], list[str]]:
    """bert_recipe/prep/sentence_segmentation.py's blingfire splitter when importable, else a split at WikiText's
    " . "."""
    try:
        from bert_recipe.prep.sentence_segmentation import get_segmenter

        return get_segmenter("blingfire")
    except ImportError:
        return lambda text: [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


_SENTENCE_END = re.compile(r"(?<= [.?!]) ")


def _write(docs: list[list[str]], output: str | Path, sentences: bool) -> None:

    split = sentence_splitter() if sentences else None
    with atomic_open(output, "w", encoding="utf-8") as out:
        for doc in docs:
            if split is None:
                out.write(" ".join(doc) + "\n")
                continue
            lines = [s for paragraph in doc for s in split(paragraph)]
            out.write("\n".join(lines) + "\n\n")


def write_documents(
    inputs: Iterable[str | Path],
    output: str | Path,
    sentences: bool = False,
    test_fraction: float = 0.0,
    test_output: str | Path | None = None,
) -> tuple[int, int]:
    """Write the documents of every input to `output`, the last `test_fraction` of them (at least one when > 0) to
    `test_output`, atomically. Returns (training documents, test documents)."""
    docs = [doc for path in list_input_files(list(inputs)) for doc in iter_documents(path)]
    test_documents = max(1, round(len(docs) * test_fraction)) if test_fraction > 0 else 0
    if test_documents and len(docs) <= test_documents:
        raise InputError(
            f"{len(docs)} document(s) found, too few to hold out a test set: give more text "
            "(documents are separated by blank lines) or --test_fraction 0"
        )
    train, test = (docs[:-test_documents], docs[-test_documents:]) if test_documents else (docs, [])
    _write(train, output, sentences)
    if test:
        _write(test, test_output, sentences)
    return len(train), len(test)


@dataclass(frozen=True)
class DocumentFlags:
    """What to read, what to write, and the held-out part."""

    input: list[str] = flag(required=True)
    """text files or folders of them (WikiText, WikiExtractor output, or documents separated by blank lines; .gz
    read as gzip)"""
    output: str = flag(required=True)
    """the output file"""
    sentences: bool = False
    """one sentence per line, a blank line between documents (create_pretraining_data.py's input)"""
    test_fraction: float = 0.0
    """put the last this fraction of the documents (at least one) in --test_output"""
    test_output: str | None = None
    """where the --test_fraction documents go"""


@dataclass(frozen=True)
class DocumentsConfig(flags.Config):
    """Every flag of text_to_documents.py."""

    documents: DocumentFlags = field(default_factory=DocumentFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("documents",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"

    def rules(self) -> list[tuple[bool, str]]:
        d = self.documents
        return [
            (not 0.0 <= d.test_fraction < 1.0, f"--test_fraction must be in [0, 1), got {d.test_fraction}"),
            (bool(d.test_fraction) and not d.test_output, "--test_fraction needs --test_output"),
        ]


def main(argv: list[str] | None = None) -> int:
    """0 when the documents are written; bad input: one line on stderr ("text_to_documents: error: ..."), exit 1."""
    with script_errors("text_to_documents", argv):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = flags.parse(DocumentsConfig, "text_to_documents.py", __doc__, argv).documents
    n_train, n_test = write_documents(args.input, args.output, args.sentences, args.test_fraction, args.test_output)
    if n_train == 0:
        raise InputError(f"no text found in {' '.join(args.input)}: give text files or folders of them")
    print(
        f"text_to_documents: {n_train} documents -> {args.output}"
        + (f", {n_test} -> {args.test_output}" if n_test else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
