"""bert_recipe/prep/text_formatting.py: a Wikipedia dump built here (bz2 XML, the real export schema) -> exact prose;
the WikiExtractor fixture ../shared/data/hf-test-fixtures/wiki_text/wiki_00; plain-text folders.

The expected prose is written out by hand from the wikitext below (what a reader of the rendered article sees,
minus lists, tables, captions, references and headings), not captured from the code.
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path

import pytest

from bert_recipe.io.cli import InputError
from bert_recipe.prep import text_formatting as tf
from data import bertPrep

NS = "http://www.mediawiki.org/xml/export-0.10/"

ALBERT = """{{Short description|Fictional physicist}}
{{Infobox scientist
| name = Albert Testperson
| birth_date = {{birth date|1900|1|1}}
}}
'''Albert Testperson''' ({{lang-de|Albert Testmensch}}; born 1900) was a [[physicist|scientist]] known for \
[[relativity]].<ref name="a">{{cite web|url=http://example.org|title=Source}}</ref> He won two [[Nobel Prize]]s.\
<ref name="a"/>

== Early life ==
He lived in [[Bern]] &ndash; and ''worked'' at <b>ETH</b>.<!-- hidden remark --> See \
[http://example.org the archive] for letters.
{| class="wikitable"
|-
! Year !! Prize
|-
| 1921 || Nobel
|}
* a list item that is not prose
# a numbered item
; term : definition
[[File:Albert.jpg|thumb|Albert in [[Bern]], 1921]]
Later he wrote about <math>E=mc^2</math> and water, H<sub>2</sub>O.<br/>He died in 1980.

=== Legacy ===
{{Main|Legacy of Albert}}
The [[Albert Prize|prize]] is named after him.
[[Category:Physicists]]
[[de:Albert Testperson]]
__NOTOC__
"""

ALBERT_PROSE = (
    "Albert Testperson (born 1900) was a scientist known for relativity. He won two Nobel Prizes. "
    "He lived in Bern \u2013 and worked at ETH. See the archive for letters. "
    "Later he wrote about and water, H2O. He died in 1980. "
    "The prize is named after him."
)

PAGES = [  # (ns, title, redirect, wikitext)
    (0, "Albert Testperson", False, ALBERT),
    (0, "A. Testperson", True, "#REDIRECT [[Albert Testperson]]"),
    (0, "Testperson", False, "#redirect [[Albert Testperson]] {{R from surname}}"),  # no <redirect/> element
    (
        0,
        "Mercury",
        False,
        "'''Mercury''' may refer to:\n* [[Mercury (planet)]]\n* [[Mercury (element)]]\n{{disambiguation}}",
    ),
    (0, "Smith", False, "'''Smith''' is a surname.\n* [[John Smith]]\n{{hndis|Smith}}"),
    (4, "Wikipedia:About", False, "Wikipedia is an encyclopedia project with prose that must not appear."),
    (14, "Category:Physicists", False, "Physicists of every kind are listed here."),
    (0, "Only templates", False, "{{Infobox thing|name=x}}\n{{Navbox|list=y}}"),
    (
        0,
        "Bern",
        False,
        "'''Bern''' is the ''de facto'' capital of [[Switzerland]].<ref>Ref.</ref>\n\n"
        "It lies on the [[Aare]] river.{{citation needed|date=May 2020}}",
    ),
]
BERN_PROSE = "Bern is the de facto capital of Switzerland. It lies on the Aare river."


def corpus_text(folder: Path) -> str:
    """A formatted corpus as the pipeline writes it (a folder of parts, in order), read as one text; the folder's
    manifest lists every part."""
    import json

    parts = sorted(folder.glob("*.txt"))
    assert sorted(json.loads((folder / "manifest.json").read_text())["outputs"]) == [p.name for p in parts]
    return "".join(p.read_text(encoding="utf-8") for p in parts)


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_dump(path: Path, pages=PAGES) -> Path:
    """A pages-articles dump in the real export schema, bz2-compressed."""
    parts = [
        f'<mediawiki xmlns="{NS}" version="0.10" xml:lang="en">\n<siteinfo><sitename>Wikipedia</sitename>'
        f'<namespaces><namespace key="0" case="first-letter" /></namespaces></siteinfo>\n'
    ]
    for i, (ns, title, redirect, text) in enumerate(pages):
        parts.append(
            f"<page>\n<title>{_xml_escape(title)}</title>\n<ns>{ns}</ns>\n<id>{i + 1}</id>\n"
            + ('<redirect title="Albert Testperson" />\n' if redirect else "")
            + f"<revision><id>{100 + i}</id><model>wikitext</model><format>text/x-wiki</format>"
            f'<text bytes="{len(text)}" xml:space="preserve">{_xml_escape(text)}</text></revision>\n</page>\n'
        )
    parts.append("</mediawiki>\n")
    path.write_bytes(bz2.compress("".join(parts).encode("utf-8")))
    return path


def test_wikitext_to_prose_drops_markup_keeps_link_text():
    assert " ".join(tf.wikitext_to_paragraphs(ALBERT)) == ALBERT_PROSE


def test_disambiguation_detection():
    assert tf.is_disambiguation("Mercury", "x {{Disambiguation|geo}}")
    assert tf.is_disambiguation("Smith", "{{hndis|Smith}}")
    assert tf.is_disambiguation("Foo (disambiguation)", "text")
    assert tf.is_disambiguation("Springfield", "{{Place name disambiguation}}")
    # an article that merely asks for a link to be disambiguated is an article
    assert not tf.is_disambiguation("Physics", "Physics is a science.{{disambiguation needed|date=May 2020}}")
    assert not tf.is_disambiguation("Physics", "Physics is a science.")


@pytest.mark.parametrize("num_workers", [1, 2])
def test_dump_to_one_article_per_line(tmp_path, num_workers, monkeypatch):
    monkeypatch.setattr(tf, "BATCH_PAGES", 2)  # batches of 2 pages: their order across workers is checked
    dump = write_dump(tmp_path / "enwiki-20240101-pages-articles.xml.bz2")
    out = tmp_path / "out.txt"
    counts = tf.format_wiki_dump(dump, out, num_workers=num_workers, progress=False)
    assert out.read_text(encoding="utf-8") == ALBERT_PROSE + "\n" + BERN_PROSE + "\n"
    assert dict(counts) == {"article": 2, "redirect": 2, "disambiguation": 2, "non_article_namespace": 2, "empty": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_dump_pages_stream_with_bounded_tree(tmp_path, monkeypatch):
    """iter_dump_pages frees each page: the parsed tree never holds more than a read buffer's worth of pages."""
    import xml.etree.ElementTree as ET

    n_pages = len(PAGES) * 100
    dump = write_dump(tmp_path / "d.xml.bz2", PAGES * 100)
    real_iterparse, roots = ET.iterparse, []

    def spy(*args, **kwargs):
        for event, elem in real_iterparse(*args, **kwargs):
            roots.append(elem) if not roots else None
            yield event, elem

    monkeypatch.setattr(ET, "iterparse", spy)
    held = [len(roots[0]) for _ in tf.iter_dump_pages(dump)]
    assert len(held) == n_pages
    # iterparse parses ahead by one 16 KiB read, so a few dozen pages may be in the tree, never the whole dump.
    assert max(held) < n_pages // 10


def test_bertprep_text_formatting_wikicorpus(tmp_path):
    download = tmp_path / "download" / "wikicorpus_en"
    download.mkdir(parents=True)
    write_dump(download / "enwiki-20240101-pages-articles.xml.bz2")
    bertPrep.main(
        [
            "--action",
            "text_formatting",
            "--dataset",
            "wikicorpus_en",
            "--working_dir",
            str(tmp_path),
            "--n_processes",
            "1",
            "--no_progress",
        ]
    )
    out = tmp_path / "formatted_one_article_per_line" / "wikicorpus_en_one_article_per_line"
    assert corpus_text(out).splitlines() == [ALBERT_PROSE, BERN_PROSE]
    assert (tmp_path / "bertPrep_log.jsonl").read_text().count('"text_formatting"') >= 1


def test_bertprep_text_formatting_missing_dump_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="expected one \\*.xml.bz2 dump"):
        bertPrep.main(["--action", "text_formatting", "--dataset", "wikicorpus_en", "--working_dir", str(tmp_path)])
    with pytest.raises(InputError, match="does not exist"):
        tf.format_wiki_dump(tmp_path / "nope.xml.bz2", tmp_path / "o.txt", progress=False)


# --------------------------------------------------------------------------------------------------------------
# WikiExtractor output: the real fixture


def _reference_wikiextractor_docs(raw: str) -> list[list[str]]:
    """Independent reading of the format: each <doc ...>...</doc> body, first line (the title) dropped."""
    docs = []
    for body in re.findall(r"<doc [^>]*>\n(.*?)\n</doc>", raw, flags=re.S):
        lines = [line.strip() for line in body.split("\n")]
        docs.append([line for line in lines[1:] if line])
    return docs


def test_wikiextractor_fixture(shared_data):
    path = shared_data / "hf-test-fixtures" / "wiki_text" / "wiki_00"
    docs = list(tf.iter_wikiextractor_docs(path))
    assert [title for title, _ in docs] == ["Anarchism", "Autism"]
    assert [paragraphs for _, paragraphs in docs] == _reference_wikiextractor_docs(path.read_text(encoding="utf-8"))
    assert docs[0][1][0].startswith("Anarchism is a political philosophy and movement")
    assert docs[1][1][0].startswith("Autism is a developmental disorder")


def test_bertprep_formats_wikiextractor_dir_and_custom_dir(shared_data, tmp_path):
    fixture = shared_data / "hf-test-fixtures" / "wiki_text" / "wiki_00"
    reference = [" ".join(" ".join(p).split()) for p in _reference_wikiextractor_docs(fixture.read_text("utf-8"))]
    extracted = tmp_path / "extracted" / "AA"
    extracted.mkdir(parents=True)
    (extracted / "wiki_00").write_bytes(fixture.read_bytes())
    bertPrep.main(
        [
            "--action",
            "text_formatting",
            "--dataset",
            "wikicorpus_en",
            "--working_dir",
            str(tmp_path),
            "--wikiextractor_dir",
            str(tmp_path / "extracted"),
            "--no_progress",
        ]
    )
    out = tmp_path / "formatted_one_article_per_line" / "wikicorpus_en_one_article_per_line"
    assert corpus_text(out).splitlines() == reference
    # The same file, renamed .txt, in a bring-your-own folder is recognised as WikiExtractor output.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "wiki.txt").write_bytes(fixture.read_bytes())
    bertPrep.main(
        [
            "--action",
            "text_formatting",
            "--dataset",
            "custom",
            "--input_dir",
            str(mine),
            "--working_dir",
            str(tmp_path),
            "--no_progress",
        ]
    )
    out = tmp_path / "formatted_one_article_per_line" / "custom_one_article_per_line"
    assert corpus_text(out).splitlines() == reference


# --------------------------------------------------------------------------------------------------------------
# Plain-text folders (books, your own corpus)


@pytest.fixture()
def text_folder(tmp_path) -> Path:
    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("\ufeffChapter one.\n  It was   dark.\n\nThe end of part one.\n", encoding="utf-8")
    (folder / "sub" / "b.txt").write_text(
        "Book two, line one.\u2028Still line one.\n\n\nSecond block.\n", encoding="utf-8"
    )
    (folder / "notes.md").write_text("not a .txt file\n")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "c.txt").write_text("hidden\n")
    return folder


@pytest.mark.parametrize(
    "doc_boundary, expected",
    [
        (
            "file",
            ["Chapter one. It was dark. The end of part one.", "Book two, line one. Still line one. Second block."],
        ),
        (
            "blank_line",
            [
                "Chapter one. It was dark.",
                "The end of part one.",
                "Book two, line one. Still line one.",
                "Second block.",
            ],
        ),
        (
            "line",
            [
                "Chapter one.",
                "It was dark.",
                "The end of part one.",
                "Book two, line one. Still line one.",
                "Second block.",
            ],
        ),
    ],
)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_text_folder_doc_boundaries(text_folder, tmp_path, doc_boundary, expected, num_workers):
    out = tmp_path / "out.txt"
    files = tf.list_text_files([text_folder])
    assert [f.relative_to(text_folder).as_posix() for f in files] == ["a.txt", "sub/b.txt"]
    counts = tf.format_text_files(files, out, doc_boundary, num_workers=num_workers, progress=False)
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert counts["documents"] == len(expected)


def test_bertprep_books_and_cli_errors(text_folder, tmp_path):
    bertPrep.main(
        [
            "--action",
            "text_formatting",
            "--dataset",
            "bookscorpus",
            "--books_dir",
            str(text_folder),
            "--working_dir",
            str(tmp_path),
            "--no_progress",
        ]
    )
    out = tmp_path / "formatted_one_article_per_line" / "bookscorpus_one_book_per_line"
    assert len(corpus_text(out).splitlines()) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no input files"):
        bertPrep.main(
            [
                "--action",
                "text_formatting",
                "--dataset",
                "custom",
                "--input_dir",
                str(empty),
                "--working_dir",
                str(tmp_path),
            ]
        )
    with pytest.raises(SystemExit, match="--input_dir is required"):
        bertPrep.main(["--action", "text_formatting", "--dataset", "custom", "--working_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="does not exist"):
        tf.main(["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o.txt")])


def test_text_formatting_cli(text_folder, tmp_path):
    assert (
        tf.main(
            [
                "--input",
                str(text_folder),
                "--output",
                str(tmp_path / "o.txt"),
                "--doc_boundary",
                "line",
                "--num_workers",
                "1",
                "--no_progress",
            ]
        )
        == 0
    )
    assert len((tmp_path / "o.txt").read_text(encoding="utf-8").splitlines()) == 5
