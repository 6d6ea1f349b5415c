"""downloads.download and bertPrep's Wikipedia download against an HTTP server started here on 127.0.0.1.

The server honours Range (206 + Content-Range) unless told to ignore it, and can drop the connection after N bytes
of a response, so resuming, restarting and verification are exercised for real, over sockets. The expected bytes
and digests come from hashlib on the bytes the test itself generated.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import sys
import threading

import numpy as np
import pytest

from bert_recipe.io.downloads import DownloadError, Retry, cached_path, download, parse_checksum, parse_checksum_file
from data import bertPrep

BODY = np.random.default_rng(0).integers(0, 256, size=300_000, dtype=np.uint8).tobytes()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range")))
        if self.path not in srv.files:
            self.send_error(404, "Not Found")
            return
        body = srv.files[self.path]
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and self.path not in srv.ignore_range:
            start = int(match.group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        drops = srv.drop_after.get(self.path)
        if drops:  # announce the full length, send part of it, hang up
            n = drops.pop(0)
            self.wfile.write(payload[:n])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(payload)


@pytest.fixture()
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.files, srv.requests, srv.drop_after, srv.ignore_range = {}, [], {}, set()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


FAST = {"retry": Retry(max_retries=3, backoff=0.01, timeout=10), "progress": False}


def test_plain_download_with_checksum(server, tmp_path):
    server.files["/f.bin"] = BODY
    dest = download(
        server.url + "/f.bin", tmp_path / "f.bin", checksum="sha256:" + hashlib.sha256(BODY).hexdigest(), **FAST
    )
    assert dest.read_bytes() == BODY
    assert not (tmp_path / "f.bin.part").exists()
    assert server.requests == [("/f.bin", None)]
    # A second call finds the verified file and does not touch the network.
    download(server.url + "/f.bin", dest, checksum=hashlib.md5(BODY).hexdigest(), **FAST)
    assert len(server.requests) == 1


def test_dropped_connection_resumes_with_range(server, tmp_path):
    server.files["/f.bin"] = BODY
    server.drop_after["/f.bin"] = [100_000, 50_000]  # two broken responses, then a whole one
    dest = download(
        server.url + "/f.bin", tmp_path / "f.bin", checksum="sha1:" + hashlib.sha1(BODY).hexdigest(), **FAST
    )
    assert dest.read_bytes() == BODY
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=100000-"), ("/f.bin", "bytes=150000-")]


def test_resume_from_existing_part_file(server, tmp_path):
    server.files["/f.bin"] = BODY
    (tmp_path / "f.bin.part").write_bytes(BODY[:123_456])  # left by a killed run
    dest = download(server.url + "/f.bin", tmp_path / "f.bin", **FAST)
    assert dest.read_bytes() == BODY
    assert server.requests == [("/f.bin", "bytes=123456-")]


def test_complete_part_file_is_published_after_416(server, tmp_path):
    server.files["/f.bin"] = BODY
    (tmp_path / "f.bin.part").write_bytes(BODY)  # killed between the last byte and the rename
    dest = download(server.url + "/f.bin", tmp_path / "f.bin", checksum=hashlib.md5(BODY).hexdigest(), **FAST)
    assert dest.read_bytes() == BODY
    assert server.requests == [("/f.bin", f"bytes={len(BODY)}-")]


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    server.files["/f.bin"] = BODY
    server.ignore_range.add("/f.bin")
    server.drop_after["/f.bin"] = [70_000]
    dest = download(server.url + "/f.bin", tmp_path / "f.bin", checksum=hashlib.md5(BODY).hexdigest(), **FAST)
    assert dest.read_bytes() == BODY  # not the first 70,000 bytes twice
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=70000-")]


def test_corrupted_body_is_refused_and_deleted(server, tmp_path):
    corrupted = bytearray(BODY)
    corrupted[12_345] ^= 0xFF
    server.files["/f.bin"] = bytes(corrupted)
    with pytest.raises(DownloadError, match="checksum mismatch"):
        download(
            server.url + "/f.bin", tmp_path / "f.bin", checksum="sha256:" + hashlib.sha256(BODY).hexdigest(), **FAST
        )
    assert list(tmp_path.iterdir()) == []  # neither the final file nor the .part


def test_wrong_expected_size_is_refused(server, tmp_path):
    server.files["/f.bin"] = BODY
    with pytest.raises(DownloadError, match="size"):
        download(server.url + "/f.bin", tmp_path / "f.bin", expected_size=len(BODY) + 1, **FAST)
    assert list(tmp_path.iterdir()) == []


def test_404_is_a_clear_error_without_retries(server, tmp_path):
    with pytest.raises(DownloadError, match=r"HTTP 404.*/missing\.bin"):
        download(server.url + "/missing.bin", tmp_path / "m.bin", **FAST)
    assert len(server.requests) == 1
    assert list(tmp_path.iterdir()) == []


def test_gives_up_after_bounded_retries_and_keeps_part(tmp_path):
    import socket

    with socket.socket() as s:  # a port with nothing listening: every attempt is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match="giving up.*after 2 retries"):
        download(
            f"http://127.0.0.1:{port}/f.bin",
            tmp_path / "f.bin",
            **{**FAST, "retry": Retry(max_retries=2, backoff=0.01, timeout=10)},
        )


def test_s3_without_boto3_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` raises ImportError
    with pytest.raises(DownloadError, match="pip install boto3"):
        download("s3://bucket/key.bin", tmp_path / "k.bin", **FAST)


def test_checksum_parsing():
    assert parse_checksum("SHA1:ABCDEF0123456789abcdef0123456789abcdef01") == (
        "sha1",
        "abcdef0123456789abcdef0123456789abcdef01",
    )
    assert parse_checksum("d41d8cd98f00b204e9800998ecf8427e") == ("md5", "d41d8cd98f00b204e9800998ecf8427e")
    with pytest.raises(ValueError):
        parse_checksum("crc32:1234")
    listing = (
        "0123456789abcdef0123456789abcdef  enwiki-20240101-pages-articles.xml.bz2\n"
        "fedcba9876543210fedcba9876543210 *enwiki-20240101-abstract.xml.gz\n"
        "not a checksum line\n"
    )
    assert parse_checksum_file(listing) == {
        "enwiki-20240101-pages-articles.xml.bz2": "0123456789abcdef0123456789abcdef",
        "enwiki-20240101-abstract.xml.gz": "fedcba9876543210fedcba9876543210",
    }


def test_cached_path_downloads_once_per_url(server, tmp_path):
    server.files["/ckpt/ckpt_8601.pt"] = BODY
    url = server.url + "/ckpt/ckpt_8601.pt"
    first = cached_path(url, tmp_path / "cache", progress=False)
    second = cached_path(url, tmp_path / "cache", progress=False)
    assert first == second and first.name.endswith(".ckpt_8601.pt") and first.read_bytes() == BODY
    assert len(server.requests) == 1
    assert cached_path(first) == first  # a local path passes through
    with pytest.raises(FileNotFoundError):
        cached_path(tmp_path / "nope.pt")


# --------------------------------------------------------------------------------------------------------------
# bertPrep --action download --dataset wikicorpus_en against a fake dumps.wikimedia.org


INDEX_BODY = b"0:1:Anarchism\n"  # stands in for the multistream index: only its bytes and checksum matter here


def _serve_dump(server, date="20240101", listing_digest=None):
    """Both kinds of dump of `date` and their sha1 listing (the index's own entry too); returns their names."""
    single, multi = f"enwiki-{date}-pages-articles.xml.bz2", f"enwiki-{date}-pages-articles-multistream.xml.bz2"
    index = f"enwiki-{date}-pages-articles-multistream-index.txt.bz2"
    for name, body in ((single, BODY), (multi, BODY[::-1]), (index, INDEX_BODY)):
        server.files[f"/enwiki/{date}/{name}"] = body
    digest = lambda body: listing_digest or hashlib.sha1(body).hexdigest()  # noqa: E731
    listing = (
        f"{digest(BODY[::-1])}  {multi}\n{hashlib.sha1(INDEX_BODY).hexdigest()}  {index}\n{digest(BODY)}  {single}\n"
    ).encode()
    server.files[f"/enwiki/{date}/enwiki-{date}-sha1sums.txt"] = listing
    server.files["/enwiki/latest/enwiki-latest-sha1sums.txt"] = listing
    return {"single": single, "multistream": multi, "index": index}


@pytest.mark.parametrize("kind", ["multistream", "single"])
@pytest.mark.parametrize("dump_date", ["20240101", "latest"])
def test_bertprep_downloads_wikipedia_and_verifies_published_sha1(server, tmp_path, dump_date, kind):
    """The multistream dump (the default) comes with its index, which text_formatting needs to cut it into
    pieces; both files are checked against the published sha1 and resumed after a dropped connection."""
    names = _serve_dump(server)
    name = names[kind]
    server.drop_after[f"/enwiki/20240101/{name}"] = [40_000]
    bertPrep.main(
        [
            "--action",
            "download",
            "--dataset",
            "wikicorpus_en",
            "--dump_date",
            dump_date,
            "--base_url",
            server.url,
            "--working_dir",
            str(tmp_path),
            "--no_progress",
            "--wiki_dump_kind",
            kind,
        ]
    )
    path = tmp_path / "download" / "wikicorpus_en" / name
    assert path.read_bytes() == server.files[f"/enwiki/20240101/{name}"]
    assert (f"/enwiki/20240101/{name}", "bytes=40000-") in server.requests
    assert bertPrep.find_wiki_dump(path.parent) == path
    index = path.parent / names["index"]
    assert index.is_file() == (kind == "multistream")
    if kind == "multistream":
        assert index.read_bytes() == INDEX_BODY
        from bert_recipe.prep.text_formatting import multistream_index

        assert multistream_index(path) == index


def test_bertprep_refuses_a_dump_that_fails_the_published_checksum(server, tmp_path):

    names = _serve_dump(server, listing_digest="f" * 40)
    with pytest.raises(SystemExit, match="sha1 checksum mismatch"):
        bertPrep.main(
            [
                "--action",
                "download",
                "--dataset",
                "wikicorpus_en",
                "--dump_date",
                "20240101",
                "--base_url",
                server.url,
                "--working_dir",
                str(tmp_path),
                "--no_progress",
            ]
        )
    for name in (names["multistream"], names["single"]):
        assert not (tmp_path / "download" / "wikicorpus_en" / name).exists()
        assert not (tmp_path / "download" / "wikicorpus_en" / (name + ".part")).exists()


def test_bertprep_download_bad_input_errors(server, tmp_path):

    base = ["--action", "download", "--base_url", server.url, "--working_dir", str(tmp_path), "--no_progress"]
    with pytest.raises(SystemExit, match="YYYYMMDD"):
        bertPrep.main(base + ["--dataset", "wikicorpus_en", "--dump_date", "2024-01"])
    with pytest.raises(SystemExit, match="HTTP 404"):  # a dump date the mirror does not have
        bertPrep.main(base + ["--dataset", "wikicorpus_en", "--dump_date", "19990101"])
    with pytest.raises(SystemExit, match="--books_dir"):
        bertPrep.main(base + ["--dataset", "bookscorpus"])
    with pytest.raises(SystemExit, match="not a folder"):
        bertPrep.main(base + ["--dataset", "custom", "--input_dir", str(tmp_path / "nope")])


def test_bertprep_downloads_books_from_a_url_list(server, tmp_path):

    server.files["/books/a.txt"] = b"Book A.\n"
    server.files["/books/b.txt"] = b"Book B.\n"
    url_list = tmp_path / "urls.txt"
    url_list.write_text(
        f"{server.url}/books/a.txt sha256:{hashlib.sha256(b'Book A.' + bytes([10])).hexdigest()}\n"
        f"# a comment\n{server.url}/books/b.txt\n"
    )
    bertPrep.main(
        [
            "--action",
            "download",
            "--dataset",
            "bookscorpus",
            "--books_url_list",
            str(url_list),
            "--working_dir",
            str(tmp_path / "w"),
            "--no_progress",
        ]
    )
    books = sorted((tmp_path / "w" / "download" / "bookscorpus").glob("*.txt"))
    assert [b.read_bytes() for b in books] == [b"Book A.\n", b"Book B.\n"]


def test_bertprep_google_weights_zip_is_extracted_safely(server, tmp_path):
    import io
    import zipfile

    def make_zip(members: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        return buf.getvalue()

    server.files["/bert_models/uncased_L-24_H-1024_A-16.zip"] = make_zip(
        {"uncased_L-24_H-1024_A-16/vocab.txt": b"[PAD]\n[UNK]\n", "uncased_L-24_H-1024_A-16/bert_config.json": b"{}"}
    )
    server.files["/bert_models/evil.zip"] = make_zip({"../../escaped.txt": b"x"})
    base = [
        "--action",
        "download",
        "--dataset",
        "google_pretrained_weights",
        "--working_dir",
        str(tmp_path / "w"),
        "--no_progress",
    ]
    bertPrep.main(base + ["--weights_url", server.url + "/bert_models/uncased_L-24_H-1024_A-16.zip"])
    vocab = tmp_path / "w" / "download" / "google_pretrained_weights" / "uncased_L-24_H-1024_A-16" / "vocab.txt"
    assert vocab.read_bytes() == b"[PAD]\n[UNK]\n"
    with pytest.raises(SystemExit, match="unsafe path"):
        bertPrep.main(base + ["--weights_url", server.url + "/bert_models/evil.zip"])
    assert not list(tmp_path.rglob("escaped.txt"))
