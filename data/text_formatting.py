"""Raw corpora -> one document per line of plain prose (UTF-8), the common format the sharding step reads.

Three sources:
  * a Wikipedia `pages-articles.xml.bz2` dump, streamed (bz2 + iterparse, each <page> freed once read). Keeps
    main-namespace articles only, skips redirects and disambiguation pages, and turns wikitext into prose with
    mwparserfromhell: templates, tables, lists, <ref>s, file/image/category links, headings, math, HTML comments
    and tags are dropped; link text and bold/italic text are kept.
  * WikiExtractor output (`<doc id=.. title=..>` ... `</doc>`), as in older recipes (`--wikiextractor_dir`).
  * plain text files (BookCorpus-style or your own): a document per file, per blank-line-separated block, or per
    line (`--doc_boundary`). Files that start with `<doc ` are read as WikiExtractor output.

Article titles are not written (the original recipe dropped them too). The output is written atomically.

    python -m data.text_formatting --input enwiki-20240101-pages-articles.xml.bz2 --output wiki_one_article_per_line.txt
    python -m data.text_formatting --input my_corpus_dir/ --output mine.txt --doc_boundary blank_line
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import html
import itertools
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, deque
from pathlib import Path
from typing import Iterable, Iterator

from cli import InputError, script_errors

# Link namespaces whose links are not prose (an image with its caption, a category tag).
DROP_LINK_NAMESPACES = {"file", "image", "media", "category"}
# Tags whose content is not prose. Wikitables come out of mwparserfromhell as Tag("table"); list items as li/dt/dd.
DROP_TAGS = {"ref", "references", "table", "gallery", "math", "chem", "ce", "score", "timeline", "syntaxhighlight",
             "source", "pre", "imagemap", "mapframe", "maplink", "graph", "templatedata", "templatestyles", "hiero",
             "categorytree", "inputbox", "includeonly", "noinclude", "ul", "ol", "dl", "style", "script", "caption"}
LIST_TAGS = {"li", "dt", "dd"}
_LIST_MARK = "\x00"  # rendered where a list item starts; lines that carry it are dropped
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(-[a-z]+)*")
_DISAMBIGUATION = re.compile(r"(disambig\w*|dab|hndis|geodis|numberdis|.* disambiguation)")


# --------------------------------------------------------------------------------------------------------------
# Wikitext -> prose


def _render(nodes) -> str:
    """Concatenate the visible prose of a list of mwparserfromhell nodes (recursively)."""
    import mwparserfromhell.nodes as n

    out = []
    for node in nodes:
        if isinstance(node, n.Text):
            out.append(node.value)
        elif isinstance(node, n.Wikilink):
            out.append(_render_link(node))
        elif isinstance(node, n.ExternalLink):
            out.append(_render(node.title.nodes) if node.title else "")  # a bare URL is not prose
        elif isinstance(node, n.Tag):
            tag = str(node.tag).strip().lower()
            if tag in LIST_TAGS:
                out.append(_LIST_MARK)
            elif tag == "br":
                out.append(" ")
            elif tag not in DROP_TAGS and node.contents is not None:
                out.append(_render(node.contents.nodes))
        elif isinstance(node, n.HTMLEntity):
            out.append(node.normalize())
        # Template, Heading, Comment, Argument: dropped
    return "".join(out)


def _render_link(link) -> str:
    title = str(link.title).strip()
    prefix, colon, _ = title.partition(":")
    prefix = prefix.strip().lower()
    if colon and prefix in DROP_LINK_NAMESPACES:
        return ""
    if link.text is not None:
        return _render(link.text.nodes)
    if colon and _INTERLANGUAGE.fullmatch(prefix):
        return ""  # [[de:Albert Einstein]]: a link to another language's article, not shown in the text
    return title.lstrip(":").split("#", 1)[0]


def _clean_paragraph(text: str) -> str:
    """Tidy what removed markup leaves behind: '( ; born 1900)' -> '(born 1900)', 'word .' -> 'word.'."""
    text = re.sub(r"__[A-Z]+__", " ", text)  # magic words such as __NOTOC__
    text = " ".join(text.split())
    text = re.sub(r"\(\s*[,;:]+\s*", "(", text)
    text = re.sub(r"\(\s*\)", "", text)
    text = re.sub(r"\s+([,.;:!?])", r"\1", text)
    return " ".join(text.split())


def wikitext_to_paragraphs(wikitext: str) -> list[str]:
    """The prose paragraphs of an article's wikitext, markup removed, one string per paragraph."""
    import mwparserfromhell

    rendered = _render(mwparserfromhell.parse(wikitext).nodes)
    paragraphs = []
    for line in rendered.split("\n"):
        if line.lstrip().startswith(_LIST_MARK):
            continue
        line = _clean_paragraph(line.replace(_LIST_MARK, " "))
        if any(ch.isalnum() for ch in line):
            paragraphs.append(line)
    return paragraphs


def is_disambiguation(title: str, wikitext: str) -> bool:
    """A disambiguation page: its title says so, or it carries {{disambiguation}} / {{dab}} / {{hndis}} ..."""
    if title.endswith("(disambiguation)"):
        return True
    import mwparserfromhell

    # Only the templates' names matter: search the raw text first so most articles skip the parse.
    if not re.search(r"\{\{\s*(disambig|dab|hndis|geodis|numberdis|[^{}|]*disambiguation)", wikitext, re.I):
        return False
    for template in mwparserfromhell.parse(wikitext).filter_templates(recursive=False):
        if _DISAMBIGUATION.fullmatch(str(template.name).strip().lower()):
            return True
    return False


def one_line(paragraphs: Iterable[str]) -> str:
    """Paragraphs -> one line: every whitespace run (newlines, U+2028, form feeds) becomes one space."""
    return " ".join(" ".join(paragraphs).split())


# --------------------------------------------------------------------------------------------------------------
# Wikipedia XML dump


def iter_dump_pages(path: str | os.PathLike, on_progress=None) -> Iterator[tuple[int, str, bool, str]]:
    """Stream (namespace, title, is_redirect, wikitext) from a pages-articles dump (.xml.bz2 or .xml).

    Memory stays bounded: the tree's root is cleared after every page, so nothing accumulates.
    on_progress(bytes_read) is called with the compressed bytes consumed so far.
    """
    raw = open(path, "rb")
    stream = bz2.open(raw, "rb") if str(path).endswith(".bz2") else raw
    try:
        root = None
        for event, elem in ET.iterparse(stream, events=("start", "end")):
            if root is None:
                root = elem
            if event != "end" or elem.tag.rsplit("}", 1)[-1] != "page":
                continue
            fields = {child.tag.rsplit("}", 1)[-1]: child for child in elem}
            revision = fields.get("revision")
            text_elem = None
            if revision is not None:
                text_elem = next((c for c in revision if c.tag.rsplit("}", 1)[-1] == "text"), None)
            ns = int(fields["ns"].text) if "ns" in fields else 0
            title = (fields["title"].text or "") if "title" in fields else ""
            text = (text_elem.text or "") if text_elem is not None else ""
            yield ns, title, "redirect" in fields, text
            root.clear()  # drop the finished page (and everything before it) from the tree
            if on_progress is not None:
                on_progress(raw.tell())
    finally:
        stream.close()
        raw.close()


def _format_pages(pages: list[tuple[int, str, bool, str]]) -> list[tuple[str, str]]:
    """Worker: [(ns, title, redirect, text)] -> [(kind, line)], kind one of article/redirect/disambiguation/..."""
    results = []
    for ns, title, redirect, text in pages:
        if ns != 0:
            results.append(("non_article_namespace", ""))
        elif redirect or re.match(r"\s*#redirect", text, re.I):
            results.append(("redirect", ""))
        elif is_disambiguation(title, text):
            results.append(("disambiguation", ""))
        else:
            line = one_line(wikitext_to_paragraphs(text))
            results.append(("article", line) if line else ("empty", ""))
    return results


def _batched(iterable, n):
    it = iter(iterable)
    while batch := list(itertools.islice(it, n)):
        yield batch


def _ordered_parallel(fn, batches: Iterator, num_workers: int) -> Iterator:
    """fn over batches in a process pool, results in input order, at most 2 * num_workers batches in flight.

    (Pool.imap would read the whole input iterator ahead: the entire dump in memory.)
    """
    if num_workers <= 1:
        yield from map(fn, batches)
        return
    with multiprocessing.Pool(num_workers) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append(pool.apply_async(fn, (batch,)))
            if len(pending) >= 2 * num_workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def format_wiki_dump(dump: str | os.PathLike, output: str | os.PathLike, num_workers: int = 1,
                     progress: bool = True, logger=None, batch_pages: int = 64) -> Counter:
    """Stream a pages-articles dump into `output`, one article per line. Returns counts per page kind."""
    from tqdm.auto import tqdm

    from atomic_io import atomic_open

    dump = Path(dump)
    if not dump.is_file():
        raise InputError(f"Wikipedia dump {dump} does not exist (run --action download first)")
    counts: Counter = Counter()
    start = time.time()
    with tqdm(total=dump.stat().st_size, unit="B", unit_scale=True, desc="wiki dump", disable=not progress) as bar, \
            atomic_open(output, "w", encoding="utf-8") as out:
        def on_progress(pos):
            bar.update(pos - bar.n)

        batches = _batched(iter_dump_pages(dump, on_progress), batch_pages)
        for results in _ordered_parallel(_format_pages, batches, num_workers):
            for kind, line in results:
                counts[kind] += 1
                if line:
                    out.write(line + "\n")
            if logger is not None and counts["article"] and counts["article"] % 100_000 < batch_pages:
                logger.log("text_formatting", {**counts, "elapsed_s": round(time.time() - start, 1)})
    return counts


# --------------------------------------------------------------------------------------------------------------
# WikiExtractor output and plain text files


def open_text(path: str | os.PathLike):
    """A text file for reading, decompressed on the fly when its name ends in .gz or .bz2 (WikiExtractor's
    --compress output, archived dumps of formatted text); UTF-8, a byte-order mark dropped, bad bytes replaced."""
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(Path(path).suffix, open)
    return opener(path, "rt", encoding="utf-8-sig", errors="replace")


def iter_wikiextractor_docs(path: str | os.PathLike) -> Iterator[tuple[str, list[str]]]:
    """Stream (title, paragraphs) from a WikiExtractor file: `<doc id=.. url=.. title="T">`, the title line, the
    paragraphs, `</doc>`. The repeated title line is not part of the paragraphs."""
    title, paragraphs = None, []
    with open_text(path) as f:
        for line in f:
            stripped = line.strip()
            if stripped.startswith("<doc ") and stripped.endswith(">"):
                match = re.search(r'title="([^"]*)"', stripped)
                title, paragraphs = html.unescape(match.group(1)) if match else "", []
            elif stripped == "</doc>":
                if title is not None:
                    if paragraphs and paragraphs[0] == title:
                        paragraphs = paragraphs[1:]
                    yield title, paragraphs
                title, paragraphs = None, []
            elif title is not None and stripped:
                paragraphs.append(stripped)


def is_wikiextractor(path: str | os.PathLike) -> bool:
    """True when the file (gzip or bz2 by its suffix) starts like WikiExtractor's output: `<doc `."""
    with open_text(path) as f:
        return f.read(5) == "<doc "


def _format_text_file(job: tuple[str, str, str]) -> tuple[int, int]:
    """Worker: one input file -> a part file of one document per line. Returns (documents, largest doc chars)."""
    path, part, doc_boundary = job
    docs, largest = 0, 0
    with open(part, "w", encoding="utf-8") as out:
        for doc in _iter_file_docs(Path(path), doc_boundary):
            line = one_line(doc)
            if line:
                out.write(line + "\n")
                docs += 1
                largest = max(largest, len(line))
    return docs, largest


def _iter_file_docs(path: Path, doc_boundary: str) -> Iterator[list[str]]:
    if is_wikiextractor(path):
        for _, paragraphs in iter_wikiextractor_docs(path):
            yield paragraphs
        return
    with open_text(path) as f:
        if doc_boundary == "file":
            yield [line for line in (raw.strip() for raw in f) if line]
        elif doc_boundary == "line":
            yield from ([raw] for raw in f if raw.strip())
        else:  # blank_line
            for is_text, block in itertools.groupby(f, key=lambda raw: bool(raw.strip())):
                if is_text:
                    yield list(block)


def list_text_files(inputs: Iterable[str | os.PathLike], pattern: str = "*.txt") -> list[Path]:
    """Files given directly, plus files under folders matching `pattern` (recursive, sorted, hidden ones skipped)."""
    files = []
    for item in map(Path, inputs):
        if item.is_file():
            files.append(item)
        elif item.is_dir():
            files.extend(sorted(p for p in item.rglob(pattern) if p.is_file()
                                and not any(part.startswith(".") for part in p.relative_to(item).parts)))
        else:
            raise InputError(f"input {item} does not exist: name a text file or a folder of them")
    return files


def check_text_file(path: str | os.PathLike, probe: int = 1 << 16, what: str = "input",
                    expected: str = "") -> None:
    """Refuse (one line) a file that cannot be read, or is not text: NUL bytes in its first 64 KiB, or more than 1%
    of them not UTF-8 (an archive, an image, an HDF5 shard, a document in another encoding). Stray bad bytes in a
    real dump pass: they are replaced, as the readers do. `what` names the file in the message (a flag, or
    "input"); `expected` is appended to the advice (e.g. ", one sentence per line")."""
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(Path(path).suffix, open)
    try:
        with opener(path, "rb") as f:
            head = f.read(probe)
    except OSError as e:
        raise InputError(f"{what} {path} cannot be read ({e.strerror or e}): check its permissions, or that a "
                         "compressed file is complete") from None
    if b"\0" in head:
        raise InputError(f"{what} {path} is not text (it holds NUL bytes): give UTF-8 text{expected or ' files'}")
    bad = head.decode("utf-8", errors="replace").count("\ufffd")
    if bad > len(head) // 100:
        raise InputError(f"{what} {path} is not UTF-8 text ({bad} undecodable bytes in its first {len(head)}): "
                         f"convert it to UTF-8{expected}")


def format_text_files(files: list[Path], output: str | os.PathLike, doc_boundary: str = "file",
                      num_workers: int = 1, progress: bool = True) -> Counter:
    """Text files (or WikiExtractor files) -> `output`, one document per line, in file order.

    Each file goes to its own part file in a worker, then the parts are concatenated: memory stays at one line.
    """
    from tqdm.auto import tqdm

    from atomic_io import atomic_open

    if not files:
        raise InputError("no input files found (check the folder and --input_pattern)")
    for path in files:  # before the work: a binary file would become documents of replacement characters
        check_text_file(path)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter(files=len(files))
    with tempfile.TemporaryDirectory(prefix=".formatting_", dir=output.parent) as tmp:
        jobs = [(str(f), os.path.join(tmp, f"{i:08d}.txt"), doc_boundary) for i, f in enumerate(files)]
        pool = multiprocessing.Pool(num_workers) if num_workers > 1 else None
        try:
            results = pool.imap(_format_text_file, jobs) if pool else map(_format_text_file, jobs)
            for docs, largest in tqdm(results, total=len(jobs), desc="text files", disable=not progress):
                counts["documents"] += docs
                counts["largest_document_chars"] = max(counts["largest_document_chars"], largest)
        finally:
            if pool:
                pool.close()
                pool.join()
        with atomic_open(output, "wb") as out:
            for _, part, _ in jobs:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
    return counts


# --------------------------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True,
                   help="a pages-articles .xml.bz2 dump, or text/WikiExtractor files and folders")
    p.add_argument("--output", required=True, help="the one-document-per-line output file")
    p.add_argument("--doc_boundary", choices=("file", "blank_line", "line"), default="file",
                   help="for plain text: a document per file, per blank-line-separated block, or per line")
    p.add_argument("--input_pattern", default="*.txt", help="file pattern inside input folders (default *.txt)")
    p.add_argument("--num_workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    return p


def main(argv=None) -> int:
    """0 when the output is written; bad input: one line on stderr, exit status 1."""
    with script_errors("text_formatting.py", argv):
        return _main(argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.num_workers < 1:
        raise InputError("--num_workers must be >= 1")
    first = Path(args.input[0])
    if len(args.input) == 1 and first.name.endswith((".xml.bz2", ".xml")):
        counts = format_wiki_dump(first, args.output, args.num_workers, not args.no_progress)
    else:
        files = list_text_files(args.input, args.input_pattern)
        counts = format_text_files(files, args.output, args.doc_boundary, args.num_workers, not args.no_progress)
    print(f"wrote {args.output}: {dict(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
