"""Raw corpora -> one document per line of plain prose (UTF-8), the common format the sharding step reads.

Three sources:
  * a Wikipedia `pages-articles.xml.bz2` dump, streamed (bz2 + iterparse, each <page> freed once read). Keeps
    main-namespace articles only, skips redirects and disambiguation pages, and turns wikitext into prose with
    mwparserfromhell: templates, tables, lists, <ref>s, file/image/category links, headings, math, HTML comments
    and tags are dropped; link text and bold/italic text are kept.
  * WikiExtractor output (`<doc id=.. title=..>` ... `</doc>`), as in older recipes (`--wikiextractor_dir`).
  * plain text files (BookCorpus-style or your own): a document per file, per blank-line-separated block, or per
    line (`--doc_boundary`). Files that start with `<doc ` are read as WikiExtractor output.

Article titles are not written (the original recipe dropped them too). The work is cut into pieces (runs of
files, Parquet row groups, pieces of a multistream dump), each a task (bert_recipe/prep/engine.py) writing a part
atomically; `format_pieces` says how the parts become the output (a folder of parts for the pipeline, one file for this
command) and how a rerun reuses them.

    python -m bert_recipe.prep.text_formatting --input enwiki-20240101-pages-articles.xml.bz2 \\
        --output wiki_one_article_per_line.txt
    python -m bert_recipe.prep.text_formatting --input my_corpus_dir/ --output mine.txt --doc_boundary blank_line
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import html
import io
import itertools
import json
import multiprocessing
import os
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Iterator, Literal

from bert_recipe.io import flags
from bert_recipe.io.atomic_io import atomic_open
from bert_recipe.io.cli import InputError, script_errors
from bert_recipe.io.flags import flag
from bert_recipe.prep.engine import local_engine
from bert_recipe.prep.manifest import Manifest, sha256_file

# Link namespaces whose links are not prose (an image with its caption, a category tag).
DROP_LINK_NAMESPACES = {"file", "image", "media", "category"}
# Tags whose content is not prose. Wikitables come out of mwparserfromhell as Tag("table"); list items as li/dt/dd.
DROP_TAGS = {
    "ref",
    "references",
    "table",
    "gallery",
    "math",
    "chem",
    "ce",
    "score",
    "timeline",
    "syntaxhighlight",
    "source",
    "pre",
    "imagemap",
    "mapframe",
    "maplink",
    "graph",
    "templatedata",
    "templatestyles",
    "hiero",
    "categorytree",
    "inputbox",
    "includeonly",
    "noinclude",
    "ul",
    "ol",
    "dl",
    "style",
    "script",
    "caption",
}
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
        for page in _pages_of(stream):
            yield page
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


def format_wiki_dump(
    dump: str | os.PathLike,
    output: str | os.PathLike,
    num_workers: int = 1,
    progress: bool = True,
    logger=None,
    engine=None,
    piece_bytes: int = 64 << 20,
    join: bool = True,
) -> Counter:
    """A pages-articles dump -> `output`, one article per line, in the dump's page order. Returns counts per page
    kind (article, redirect, disambiguation, ...).

    How it is read depends on what the dump is (dump_pieces): a multistream dump beside its index, or a folder of
    the numbered part files, is cut into pieces that are tasks on `engine` (bert_recipe.prep.engine: worker processes
    here, or a Dask cluster across nodes), each formatting its own pages into a part file; the parts are then joined in
    order. A single-stream .xml.bz2 cannot be cut: one process reads it and `num_workers` local processes parse its
    pages (whatever the engine)."""
    dump = Path(dump)
    if not dump.exists():
        raise InputError(f"Wikipedia dump {dump} does not exist (run --action download first)")
    pieces = dump_pieces(dump, piece_bytes)
    if pieces is None:
        if engine is not None and engine.name == "dask":
            print(
                f"text_formatting: {dump} is a single bz2 stream: read here by one process, its pages parsed by "
                f"{num_workers} local processes (the multistream dump and its index spread over the cluster)"
            )
        if join:
            return _format_single_stream(dump, output, num_workers, progress, logger)
        return _single_stream_part(dump, Path(output), num_workers, progress, logger)
    settings = {"kind": "wiki_dump", "size": sum(Path(name).stat().st_size for name in sorted({q[0] for q in pieces}))}
    return format_pieces(
        _format_dump_piece, pieces, output, settings, local_engine(engine, num_workers, progress), "dump pieces", join
    )


def multistream_index(dump: Path) -> Path | None:
    """The index beside a multistream dump (`...-multistream.xml.bz2` -> `...-multistream-index.txt.bz2`)."""
    if not dump.name.endswith("-multistream.xml.bz2"):
        return None
    index = dump.with_name(dump.name.replace("-multistream.xml.bz2", "-multistream-index.txt.bz2"))
    return index if index.is_file() else None


def _part_start(path: Path) -> int:
    """The first page id of a numbered part file (`...-pages-articles3.xml-p151574p311329.bz2`)."""
    match = re.search(r"\.xml-p(\d+)p\d+", path.name)
    return int(match.group(1)) if match else 0


def dump_pieces(dump: Path, piece_bytes: int = 64 << 20) -> list[tuple[str, int, int]] | None:
    """(file, first byte, end byte) pieces of a dump that tasks can format independently, or None for a single
    bz2 stream. A folder: its numbered part files (`*.xml-p*p*.bz2`, or every *.xml.bz2), each a whole piece, in
    page order. A multistream dump with its index: runs of its bz2 streams (100 pages each) of about
    `piece_bytes` compressed bytes, from the index's first offset (the stream before it holds only the site
    information) to the end of the file."""
    if dump.is_dir():
        parts = sorted(dump.glob("*.xml-p*p*.bz2"), key=_part_start) or sorted(dump.glob("*.xml.bz2"))
        if not parts:
            raise InputError(f"--wiki_dump {dump} holds no dump part files (*.xml-p*p*.bz2 or *.xml.bz2)")
        return [(str(p), 0, p.stat().st_size) for p in parts]
    index = multistream_index(dump)
    if index is None:
        return None
    try:
        with bz2.open(index, "rt", encoding="utf-8") as f:
            offsets = sorted({int(line.split(":", 1)[0]) for line in f if line.strip()})
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"multistream index {index} cannot be read ({e}): download it again") from None
    size = dump.stat().st_size
    if not offsets or offsets[-1] >= size:
        raise InputError(f"multistream index {index} does not fit {dump} ({size} bytes): they are of different dumps")
    pieces, start = [], offsets[0]
    for offset in offsets[1:]:
        if offset - start >= piece_bytes:
            pieces.append((str(dump), start, offset))
            start = offset
    pieces.append((str(dump), start, size))
    return pieces


def iter_piece_pages(path: str, start: int, end: int) -> Iterator[tuple[int, str, bool, str]]:
    """The pages of bytes [start, end) of a multistream dump: concatenated bz2 streams, each holding whole
    <page> elements (the last stream of the file also the closing </mediawiki>), parsed under a root of our own."""
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(end - start)
    text = bytearray()
    while raw:
        decompressor = bz2.BZ2Decompressor()
        text += decompressor.decompress(raw)
        if not decompressor.eof:
            raise OSError(
                f"a bz2 stream is cut off at byte {end} (the file is truncated or the index is of another dump)"
            )
        raw = decompressor.unused_data
    first, last = text.find(b"<page>"), text.rfind(b"</page>")
    if first < 0:
        return
    document = io.BytesIO(b"<pages>" + bytes(text[first : last + len(b"</page>")]) + b"</pages>")
    yield from _pages_of(document)


def _pages_of(stream) -> Iterator[tuple[int, str, bool, str]]:
    """(namespace, title, is_redirect, wikitext) of each <page> of an XML stream; the tree is cleared after each."""
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


def _format_dump_piece(job: tuple[str, int, int, str]) -> tuple[dict, str]:
    """Task: one piece of a dump (a byte range of a multistream dump, or a whole part file) -> a part file of one
    article per line, written atomically. Returns (counts per page kind, the part's sha256)."""
    path, start, end, part = job
    counts: Counter = Counter()
    whole = start == 0 and end == Path(path).stat().st_size and multistream_index(Path(path)) is None
    pages = iter_dump_pages(path) if whole else iter_piece_pages(path, start, end)
    with atomic_open(part, "w", encoding="utf-8") as out:
        for batch in _batched(pages, 64):
            for kind, line in _format_pages(batch):
                counts[kind] += 1
                if line:
                    out.write(line + "\n")
    return dict(counts), sha256_file(part)


def _single_stream_part(dump: Path, folder: Path, num_workers: int, progress: bool, logger) -> Counter:
    """A single-stream dump into a folder of one part (00000000.txt), listed in the folder's manifest.json as
    format_pieces lists its parts (reused by a rerun when the dump is the same)."""
    if folder.is_file():  # an older run's single file under the folder's name
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    ledger = Manifest.open(
        folder / "manifest.json", {"kind": "wiki_dump_single", "dump": [str(dump), dump.stat().st_size]}
    )
    if ledger.reusable("00000000.txt"):
        ledger.report("text_formatting")
        return Counter(ledger.outputs["00000000.txt"]["counts"])
    counts = _format_single_stream(dump, folder / "00000000.txt", num_workers, progress, logger)
    ledger.record("00000000.txt", counts["article"], sha256_file(folder / "00000000.txt"), counts=dict(counts))
    ledger.save()
    return counts


BATCH_PAGES = 64  # pages a single-stream dump's reader hands a parsing process at a time


def _format_single_stream(dump: Path, output, num_workers: int, progress: bool, logger) -> Counter:
    """One reader streams the dump; `num_workers` local processes format its pages, BATCH_PAGES at a time, in
    order."""
    from tqdm.auto import tqdm

    counts: Counter = Counter()
    start = time.time()
    with (
        tqdm(total=dump.stat().st_size, unit="B", unit_scale=True, desc="wiki dump", disable=not progress) as bar,
        atomic_open(output, "w", encoding="utf-8") as out,
    ):

        def on_progress(pos):
            bar.update(pos - bar.n)

        batch_pages = BATCH_PAGES
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
# Pieces -> part files (-> one file): every source's tasks


def format_pieces(
    task: Callable, pieces: list[tuple], output: str | os.PathLike, settings: dict, engine, desc: str, join: bool = True
) -> Counter:
    """Run task((*piece, part_file)) for every piece on `engine` (bert_recipe.prep.engine), each writing
    its part file atomically and returning (counts, sha256). Counts are summed ("largest_document_chars": the
    largest).

    join=False (the pipeline's way, data/bertPrep.py): `output` is a folder of the parts, 00000000.txt ... in piece
    order, and its manifest.json lists each with its documents and sha256; the next stages read the parts in
    order as one corpus, and nothing joins them on one machine (at the scale of all of Wikipedia that join would be
    the one serial pass over the text). join=True (the bert_recipe.prep.text_formatting command): the parts, kept in
    `.<output name>.parts/` until then, are joined in order into the file `output`, atomically, and
    `<output>.manifest.json` records it. Either way nothing is done twice: a rerun with the same settings reuses
    every listed output (or part) whose sha256 still matches."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    settings = {**settings, "pieces": json.loads(json.dumps(pieces))}
    if join:
        final = Manifest.open(output.with_name(output.name + ".manifest.json"), settings)
        if final.reusable(output.name):
            final.report("text_formatting")
            return Counter(final.outputs[output.name]["counts"])
        parts_dir = output.parent / f".{output.name}.parts"
    else:
        if output.is_file():  # an older run's single file under the folder's name: this stage's own output
            output.unlink()
        parts_dir = output
    parts_dir.mkdir(exist_ok=True)
    ledger = Manifest.open(parts_dir / ("parts.json" if join else "manifest.json"), settings)
    jobs = [(*piece, str(parts_dir / f"{i:08d}.txt")) for i, piece in enumerate(pieces)]
    names = [Path(job[-1]).name for job in jobs]
    for stale in set(p.name for p in parts_dir.glob("*.txt")) - set(names):  # parts of other settings
        (parts_dir / stale).unlink()
    todo = [i for i, name in enumerate(names) if not ledger.reusable(name)]
    try:
        for k, (counts, digest) in engine.map(task, [jobs[i] for i in todo], desc=desc):
            ledger.record(names[todo[k]], counts.get("documents", counts.get("article", 0)), digest, counts=counts)
    finally:  # what finished is listed, also when a task failed
        ledger.save()
    ledger.report("text_formatting" if not join else "text_formatting (parts)")
    total: Counter = Counter()
    for name in names:
        for key, value in ledger.outputs[name]["counts"].items():
            total[key] = max(total[key], value) if key == "largest_document_chars" else total[key] + value
    if join:
        _join_parts([parts_dir / name for name in names], output, final, total)
        shutil.rmtree(parts_dir, ignore_errors=True)
    return total


def _join_parts(parts: list[Path], output: Path, final, total: Counter) -> None:
    """The parts, in order, into `output` (atomically), hashed while written; recorded in `final`."""
    digest = hashlib.sha256()
    with atomic_open(output, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    final.record(output.name, total.get("documents", total.get("article", 0)), digest.hexdigest(), counts=dict(total))
    final.save()


def corpus_files(path: str | os.PathLike) -> list[Path]:
    """The files of a formatted corpus in order: a folder's parts (what the pipeline writes), or a single file."""
    path = Path(path)
    return sorted(path.glob("*.txt")) if path.is_dir() else [path]


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


def _format_text_files(job: tuple[tuple[str, ...], str, str]) -> tuple[dict, str]:
    """Task: a run of input files -> one part file of one document per line, in file order (atomically). Returns
    (counts, sha256)."""
    paths, doc_boundary, part = job
    docs, largest = 0, 0
    with atomic_open(part, "w", encoding="utf-8") as out:
        for path in paths:
            for doc in _iter_file_docs(Path(path), doc_boundary):
                line = one_line(doc)
                if line:
                    out.write(line + "\n")
                    docs += 1
                    largest = max(largest, len(line))
    return {"documents": docs, "largest_document_chars": largest}, sha256_file(part)


def file_runs(files: list[Path], piece_bytes: int) -> list[tuple[str, ...]]:
    """Consecutive files grouped into runs of about `piece_bytes` (a larger file is a run of its own): a task is
    then seconds of work, not the scheduler's milliseconds (WikiExtractor writes files of 1 MB)."""
    runs: list[list[str]] = []
    size = piece_bytes
    for path in files:
        if size >= piece_bytes:
            runs.append([])
            size = 0
        runs[-1].append(str(path))
        size += path.stat().st_size
    return [tuple(run) for run in runs]


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
            files.extend(
                sorted(
                    p
                    for p in item.rglob(pattern)
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(item).parts)
                )
            )
        else:
            raise InputError(f"input {item} does not exist: name a text file or a folder of them")
    return files


def check_text_file(path: str | os.PathLike, probe: int = 1 << 16, what: str = "input", expected: str = "") -> None:
    """Refuse (one line) a file that cannot be read, or is not text: NUL bytes in its first 64 KiB, or more than 1%
    of them not UTF-8 (an archive, an image, an HDF5 shard, a document in another encoding). Stray bad bytes in a
    real dump pass: they are replaced, as the readers do. `what` names the file in the message (a flag, or
    "input"); `expected` is appended to the advice (e.g. ", one sentence per line")."""
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(Path(path).suffix, open)
    try:
        with opener(path, "rb") as f:
            head = f.read(probe)
    except OSError as e:
        raise InputError(
            f"{what} {path} cannot be read ({e.strerror or e}): check its permissions, or that a "
            "compressed file is complete"
        ) from None
    if b"\0" in head:
        raise InputError(f"{what} {path} is not text (it holds NUL bytes): give UTF-8 text{expected or ' files'}")
    bad = head.decode("utf-8", errors="replace").count("\ufffd")
    if bad > len(head) // 100:
        raise InputError(
            f"{what} {path} is not UTF-8 text ({bad} undecodable bytes in its first {len(head)}): "
            f"convert it to UTF-8{expected}"
        )


def format_text_files(
    files: list[Path],
    output: str | os.PathLike,
    doc_boundary: str = "file",
    num_workers: int = 1,
    progress: bool = True,
    engine=None,
    piece_bytes: int = 16 << 20,
    join: bool = True,
) -> Counter:
    """Text files (or WikiExtractor files) -> `output`, one document per line, in file order: each run of files of
    about `piece_bytes` a task on `engine` (None: `num_workers` processes here) writing its own part
    (format_pieces)."""
    if not files:
        raise InputError("no input files found (check the folder and --input_pattern)")
    for path in files:  # before the work: a binary file would become documents of replacement characters
        check_text_file(path)
    settings = {"kind": "text", "doc_boundary": doc_boundary, "inputs": [[str(f), f.stat().st_size] for f in files]}
    runs = file_runs(files, piece_bytes)
    counts = format_pieces(
        _format_text_files,
        [(run, doc_boundary) for run in runs],
        output,
        settings,
        local_engine(engine, num_workers, progress),
        "text files",
        join,
    )
    counts["files"] = len(files)
    return counts


# --------------------------------------------------------------------------------------------------------------
# Parquet: corpora as they ship today (a folder of .parquet files with a text column)


def parquet_row_groups(files: list[Path], text_column: str) -> list[tuple[str, int, str]]:
    """(file, row group, column) for every row group of every file, after checking that each file is Parquet and
    has `text_column` as a string column (one line naming the file otherwise)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pieces = []
    for path in files:
        try:
            meta = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise InputError(
                f"{path} is not a Parquet file ({str(e).splitlines()[0][:160]}): give a folder of "
                ".parquet files, or --input_format text"
            ) from None
        schema = meta.schema_arrow
        if text_column not in schema.names:
            raise InputError(
                f"{path} has no column {text_column!r} (it has {', '.join(schema.names[:8])}): name "
                "the text column with --text_column (TEXT_COLUMN=)"
            )
        kind = schema.field(text_column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise InputError(
                f"{path}: column {text_column!r} holds {kind}, not text: name the text column with --text_column"
            )
        pieces.extend((str(path), group, text_column) for group in range(meta.num_row_groups))
    return pieces


def _format_parquet_row_group(job: tuple[str, int, str, str]) -> tuple[dict, str]:
    """Task: one row group -> a part file, a document per row: its text's non-empty lines joined by spaces (the
    paragraphs of a document, as for plain text); null or blank rows are skipped. Returns (counts, sha256)."""
    import pyarrow.parquet as pq

    path, group, column, part = job
    texts = pq.ParquetFile(path).read_row_group(group, columns=[column]).column(0).to_pylist()
    docs, largest = 0, 0
    with atomic_open(part, "w", encoding="utf-8") as out:
        for text in texts:
            line = one_line(raw.strip() for raw in (text or "").splitlines() if raw.strip())
            if line:
                out.write(line + "\n")
                docs += 1
                largest = max(largest, len(line))
    return {"documents": docs, "largest_document_chars": largest, "rows": len(texts)}, sha256_file(part)


def format_parquet_files(
    files: list[Path],
    output: str | os.PathLike,
    text_column: str = "text",
    num_workers: int = 1,
    progress: bool = True,
    engine=None,
    join: bool = True,
) -> Counter:
    """Parquet files -> `output`, one document per row, in file and row order: each row group a task (read alone,
    its text column only)."""
    if not files:
        raise InputError("no .parquet files found (check the folder and --input_pattern)")
    pieces = parquet_row_groups(files, text_column)
    settings = {"kind": "parquet", "text_column": text_column, "inputs": [[str(f), f.stat().st_size] for f in files]}
    counts = format_pieces(
        _format_parquet_row_group,
        pieces,
        output,
        settings,
        local_engine(engine, num_workers, progress),
        "parquet row groups",
        join,
    )
    counts["files"] = len(files)
    return counts


# --------------------------------------------------------------------------------------------------------------
# CLI


@dataclass(frozen=True)
class FormatFlags:
    """What to read, where the documents go, how the text is cut into documents."""

    input: list[str] = flag(required=True)
    """a pages-articles .xml.bz2 dump, or text/WikiExtractor files and folders"""
    output: str = flag(required=True)
    """the one-document-per-line output file"""
    doc_boundary: Literal["file", "blank_line", "line"] = "file"
    """for plain text: a document per file, per blank-line-separated block, or per line"""
    input_pattern: str | None = None
    """file pattern inside input folders (default *.txt; *.parquet with --input_format parquet)"""
    input_format: Literal["text", "parquet"] = "text"
    """parquet: files with a text column (--text_column), a document per row"""
    text_column: str = "text"
    """the text column of Parquet input"""
    num_workers: int = flag(factory=lambda: os.cpu_count() or 1)
    """worker processes (default: the CPUs of this machine)"""
    no_progress: bool = False
    """no progress bar"""


@dataclass(frozen=True)
class FormatConfig(flags.Config):
    """Every flag of text_formatting.py."""

    format: FormatFlags = field(default_factory=FormatFlags)

    ungrouped: ClassVar[tuple[str, ...]] = ("format",)
    has_debug: ClassVar[bool] = False
    formatter: ClassVar[type[argparse.HelpFormatter]] = argparse.RawDescriptionHelpFormatter
    doc_layout: ClassVar[str] = "whole"

    def rules(self) -> list[tuple[bool, str]]:
        return [(self.format.num_workers < 1, "--num_workers must be >= 1")]


def main(argv=None) -> int:
    """0 when the output is written; bad input: one line on stderr, exit status 1."""
    with script_errors("text_formatting.py", argv):
        return _main(argv)


def _main(argv) -> int:
    args = flags.parse(FormatConfig, "text_formatting.py", __doc__, argv).format
    first = Path(args.input[0])
    if args.input_format == "parquet":
        files = list_text_files(args.input, args.input_pattern or "*.parquet")
        counts = format_parquet_files(files, args.output, args.text_column, args.num_workers, not args.no_progress)
    elif len(args.input) == 1 and first.name.endswith((".xml.bz2", ".xml")):
        counts = format_wiki_dump(first, args.output, args.num_workers, not args.no_progress)
    else:
        files = list_text_files(args.input, args.input_pattern or "*.txt")
        counts = format_text_files(files, args.output, args.doc_boundary, args.num_workers, not args.no_progress)
    print(f"wrote {args.output}: {dict(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
