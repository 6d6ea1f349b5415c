"""Downloads that can be trusted: resumable, verified, atomic, retried. Plus `cached_path` for checkpoints by URL.

A download streams into `<dest>.part` and is renamed onto `<dest>` only once its size matches what the server
announced and its checksum (when one is known) matches: a file at `<dest>` is always complete. An interrupted
download resumes from the `.part` file with an HTTP Range request; a server that ignores Range (answers 200 with
the whole body) is handled by starting the `.part` file over. Connection errors are retried with exponential
backoff, a bounded number of times in a row.

    download("https://dumps.wikimedia.org/enwiki/20240101/enwiki-20240101-pages-articles.xml.bz2", "dump.xml.bz2",
             checksum="sha1:0123...")
    path = cached_path("https://example.org/ckpt_7038.pt")   # -> ~/.cache/bert_recipe/<hash>.ckpt_7038.pt

`s3://bucket/key` URLs work the same way through boto3 (optional: `pip install boto3`); set AWS_ENDPOINT_URL for a
non-AWS endpoint.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlparse

from bert_recipe.io.atomic_io import durable_replace

HASH_ALGOS = ("md5", "sha1", "sha256")
_HEX_LENGTH_TO_ALGO = {32: "md5", 40: "sha1", 64: "sha256"}
CHUNK_SIZE = 1 << 20


class DownloadError(RuntimeError):
    """A download that cannot succeed by retrying: HTTP 4xx, a checksum or size mismatch, a missing S3 key."""


class _Retryable(Exception):
    """A transient failure (connection dropped, timeout, HTTP 5xx): retry after a backoff."""


class _Restart(_Retryable):
    """The `.part` file cannot be continued (the resource changed size, an odd Content-Range): start it over."""


# --------------------------------------------------------------------------------------------------------------
# Checksums


def parse_checksum(checksum: str | None) -> tuple[str, str] | None:
    """'sha1:ab12...' or a bare hex digest (algorithm inferred from its length) -> ('sha1', 'ab12...')."""
    if not checksum:
        return None
    algo, _, digest = checksum.rpartition(":")
    digest = digest.strip().lower()
    algo = algo.strip().lower() or _HEX_LENGTH_TO_ALGO.get(len(digest), "")
    if algo not in HASH_ALGOS or not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(f"checksum {checksum!r} is not 'md5:<hex>', 'sha1:<hex>', 'sha256:<hex>' or a bare hex digest")
    return algo, digest


def parse_checksum_file(text: str) -> dict[str, str]:
    """Parse a `<hex>  <filename>` listing (md5sum/sha1sum output, as Wikipedia's `<dump>-md5sums.txt`).

    Returns {filename: hex}. A leading '*' on the filename (binary-mode marker) is dropped; other lines are ignored.
    """
    sums = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([0-9a-fA-F]{32,128})\s+\*?(.+?)\s*", line)
        if match:
            sums[match.group(2)] = match.group(1).lower()
    return sums


def file_digest(path: str | os.PathLike, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_SIZE), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------------
# One attempt at the body of a URL, from a byte offset: HTTP(S) through requests, s3:// through boto3.


@dataclass
class _Body:
    start: int  # the byte offset the body starts at: the offset asked for, or 0 when the server ignored Range
    total: int | None  # the full size of the resource when the server said it
    chunks: Iterator[bytes]
    close: Callable[[], None]


def _parse_content_range(value: str | None) -> tuple[int | None, int | None]:
    """'bytes 100-199/1000' -> (100, 1000); 'bytes */1000' -> (None, 1000); unknown total -> None."""
    match = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    if not match:
        return None, None
    start = int(match.group(1)) if match.group(1) is not None else None
    total = int(match.group(2)) if match.group(2) != "*" else None
    return start, total


def _open_http(url: str, offset: int, timeout: float, session) -> _Body:
    import requests

    # identity: the bytes on disk must be the bytes the checksum and Content-Length describe, never re-encoded.
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        resp = session.get(url, headers=headers, stream=True, timeout=timeout, allow_redirects=True)
    except (requests.ConnectionError, requests.Timeout) as e:
        raise _Retryable(f"{type(e).__name__}: {e}") from e
    if resp.status_code == 416 and offset:
        # Nothing past `offset`: the .part file is already the whole resource, or the resource shrank.
        _, total = _parse_content_range(resp.headers.get("Content-Range"))
        resp.close()
        if total != offset:
            raise _Restart(f"HTTP 416: cannot resume at byte {offset} (size {total})")
        return _Body(start=offset, total=total, chunks=iter(()), close=lambda: None)
    if resp.status_code in (429,) or resp.status_code >= 500:
        resp.close()
        raise _Retryable(f"HTTP {resp.status_code} {resp.reason}")
    if resp.status_code >= 400:
        resp.close()
        raise DownloadError(f"HTTP {resp.status_code} {resp.reason} for {url}: check the URL (or the dump date)")
    if resp.status_code == 206:
        start, total = _parse_content_range(resp.headers.get("Content-Range"))
        start = offset if start is None else start
    else:  # 200: the whole body, whatever we asked for
        start = 0
        length = resp.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None

    def chunks() -> Iterator[bytes]:
        # read1 hands over whatever arrived (up to CHUNK_SIZE): when the link drops, every byte received so far is
        # already on disk, so the resume starts exactly where the body stopped (iter_content would drop the
        # partial chunk it was filling).
        import urllib3.exceptions

        try:
            while chunk := resp.raw.read1(CHUNK_SIZE, decode_content=False):
                yield chunk
        except (requests.ConnectionError, requests.Timeout, urllib3.exceptions.HTTPError, OSError) as e:
            raise _Retryable(f"connection broken: {e}") from e

    return _Body(start=start, total=total, chunks=chunks(), close=resp.close)


def _s3_client():
    try:
        import boto3
    except ImportError:
        raise DownloadError(
            "s3:// URLs need boto3: pip install boto3 (and AWS credentials, or AWS_ENDPOINT_URL)"
        ) from None
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)


def _open_s3(url: str, offset: int, timeout: float, session) -> _Body:
    import botocore.exceptions as bex

    parsed = urlparse(url)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    client = session
    kwargs = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        obj = client.get_object(Bucket=bucket, Key=key, **kwargs)
    except bex.ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code == "InvalidRange":  # the .part file already holds every byte
            size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
            if size != offset:
                raise _Restart(f"S3 InvalidRange: cannot resume at byte {offset} (size {size})") from e
            return _Body(start=offset, total=size, chunks=iter(()), close=lambda: None)
        if code in ("SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"):
            raise _Retryable(f"S3 {code}") from e
        raise DownloadError(f"S3 {code or 'error'} for {url}: {e}") from e
    except (bex.EndpointConnectionError, bex.ConnectionClosedError, bex.ReadTimeoutError) as e:
        raise _Retryable(str(e)) from e
    start, total = _parse_content_range(obj.get("ContentRange"))
    if start is None:
        start, total = 0, obj.get("ContentLength")

    def chunks() -> Iterator[bytes]:
        try:
            yield from obj["Body"].iter_chunks(CHUNK_SIZE)
        except (bex.IncompleteReadError, bex.ReadTimeoutError, bex.ResponseStreamingError, ConnectionError) as e:
            raise _Retryable(f"S3 stream broken: {e}") from e

    return _Body(start=start, total=total, chunks=chunks(), close=obj["Body"].close)


# --------------------------------------------------------------------------------------------------------------
# download()


@dataclass(frozen=True)
class Retry:
    """download()'s patience: `max_retries` consecutive failed attempts (connection errors, HTTP 5xx) tolerated,
    an attempt that made progress resetting the count; backoff * 2**k seconds between them (at most
    `max_backoff`); `timeout` seconds for the server to answer or send more."""

    max_retries: int = 8
    backoff: float = 1.0
    max_backoff: float = 60.0
    timeout: float = 60.0


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    checksum: str | None = None,
    expected_size: int | None = None,
    retry: Retry = Retry(),
    progress: bool = True,
    session=None,
) -> Path:
    """Download `url` to `dest`, resuming `<dest>.part`, verifying size and checksum, renaming only when complete.

    checksum: 'md5:<hex>' / 'sha1:<hex>' / 'sha256:<hex>' (or a bare hex digest). A complete body that fails it is
    deleted and DownloadError is raised. An existing `dest` is returned as is when it passes the checksum (or when
    there is none to check: `dest` only ever holds complete downloads).
    retry: consecutive failed attempts tolerated (see Retry); an attempt that made progress resets the count, so a
    flaky link still finishes a 20 GB dump.
    session: a requests.Session (HTTP) or a boto3 S3 client (s3://); one is made when None.
    """
    dest = Path(dest)
    want = parse_checksum(checksum)
    if dest.is_file():
        if want is None or file_digest(dest, want[0]) == want[1]:
            return dest
        dest.unlink()  # a stale file from an older dump under the same name
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    scheme = urlparse(url).scheme
    if scheme in ("http", "https"):
        opener = _open_http
        if session is None:
            import requests

            session = requests.Session()
    elif scheme == "s3":
        opener = _open_s3
        session = session if session is not None else _s3_client()
    else:
        raise DownloadError(f"unsupported URL scheme in {url!r}: use http://, https:// or s3://")

    failures = 0
    while True:
        offset = part.stat().st_size if part.exists() else 0
        try:
            total = _fetch_into(opener, url, part, offset, retry.timeout, session, progress)
            break
        except _Retryable as e:
            if isinstance(e, _Restart):
                part.unlink(missing_ok=True)
            grew = part.exists() and part.stat().st_size > offset
            failures = 0 if grew else failures + 1
            if failures > retry.max_retries:
                raise DownloadError(
                    f"giving up on {url} after {retry.max_retries} retries: {e} "
                    f"(the partial file {part} is kept; run again to resume)"
                ) from e
            time.sleep(min(retry.max_backoff, retry.backoff * 2 ** max(failures - 1, 0)))
    _verify_and_publish(part, dest, url, total, expected_size, want)
    return dest


def _fetch_into(opener, url: str, part: Path, offset: int, timeout: float, session, progress: bool) -> int | None:
    """Stream one attempt into `part` (appending from `offset`, or from 0 if the server restarted the body)."""
    from tqdm.auto import tqdm

    body = opener(url, offset, timeout, session)
    try:
        if body.start not in (0, offset):
            raise _Restart(f"server answered from byte {body.start}, asked for {offset}")
        mode = "ab" if body.start == offset and offset else "wb"  # 'wb' truncates: the server ignored Range
        with (
            open(part, mode) as f,
            tqdm(
                total=body.total,
                initial=body.start,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=part.name[:-5][:40],
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            for chunk in body.chunks:
                f.write(chunk)
                bar.update(len(chunk))
    finally:
        body.close()
    size = part.stat().st_size
    if body.total is not None and size < body.total:
        raise _Retryable(f"body ended at {size} of {body.total} bytes")
    return body.total


def _verify_and_publish(
    part: Path, dest: Path, url: str, total: int | None, expected_size: int | None, want: tuple[str, str] | None
) -> None:

    size = part.stat().st_size
    for label, expected in (("server's", total), ("expected", expected_size)):
        if expected is not None and size != expected:
            part.unlink()
            raise DownloadError(
                f"{url}: got {size} bytes, the {label} size is {expected}; the partial file was deleted, run again"
            )
    if want is not None:
        got = file_digest(part, want[0])
        if got != want[1]:
            part.unlink()
            raise DownloadError(
                f"{url}: {want[0]} checksum mismatch (expected {want[1]}, got {got}): the body is "
                f"corrupted; the partial file was deleted, run again"
            )
    durable_replace(part, dest)


def fetch_text(url: str, *, timeout: float = 60.0, max_retries: int = 4, backoff: float = 1.0, session=None) -> str:
    """GET a small text resource (a checksum listing, a status page) with the same retry policy; 4xx raises."""
    import requests

    session = session or requests.Session()
    for attempt in range(max_retries + 1):
        try:
            resp = session.get(url, timeout=timeout)
        except (requests.ConnectionError, requests.Timeout) as e:
            error = f"{type(e).__name__}: {e}"
        else:
            if resp.status_code < 400:
                return resp.text
            if resp.status_code < 500 and resp.status_code != 429:
                raise DownloadError(f"HTTP {resp.status_code} {resp.reason} for {url}")
            error = f"HTTP {resp.status_code}"
        if attempt < max_retries:
            time.sleep(backoff * 2**attempt)
    raise DownloadError(f"giving up on {url} after {max_retries} retries: {error}")


# --------------------------------------------------------------------------------------------------------------
# cached_path: a file by URL, downloaded once into a cache folder keyed by the URL's hash.


def default_cache_dir() -> Path:
    return Path(os.environ.get("BERT_CACHE", Path.home() / ".cache" / "bert_recipe"))


def is_url(path_or_url: str | os.PathLike) -> bool:
    return urlparse(str(path_or_url)).scheme in ("http", "https", "s3")


def cached_path(
    path_or_url: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    *,
    checksum: str | None = None,
    progress: bool = True,
    **download_kwargs,
) -> Path:
    """A local path for a local file or a URL (http, https, s3); URLs are downloaded once into `cache_dir`.

    The cache name is sha256(url)[:16] + the URL's basename, so two URLs never collide and the file keeps its
    extension (`.pt`, `.safetensors`). A file lock serialises concurrent callers (every rank of a job asking for the
    same --init_checkpoint): one downloads, the others wait and reuse it.
    """
    if not is_url(path_or_url):
        path = Path(path_or_url)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist (give a local path or an http(s)/s3 URL)")
        return path
    url = str(path_or_url)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    basename = Path(urlparse(url).path).name or "download"
    dest = cache / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.{basename}"
    with open(cache / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not dest.exists():
                download(url, dest, checksum=checksum, progress=progress, **download_kwargs)
                from bert_recipe.io.atomic_io import atomic_write_json

                atomic_write_json(dest.with_name(dest.name + ".json"), {"url": url, "checksum": checksum})
            elif checksum:
                download(url, dest, checksum=checksum, progress=progress, **download_kwargs)  # verifies, or refetches
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return dest
