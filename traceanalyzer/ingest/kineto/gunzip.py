"""Read an input file into memory, gunzipping as a stream with a bound on the uncompressed size.

``gzip.decompress`` holds the compressed bytes, its own output and a copy of it at once: a 2 MB
gzip that inflates to 2 GiB peaked at 4.2 GB. Here the compressed file is read in
:data:`READ_CHUNK_BYTES` pieces and inflated into one growing ``bytearray`` (grown in place by
realloc), so the peak is the uncompressed size plus one piece; and a file that inflates beyond
:data:`MAX_UNCOMPRESSED_BYTES` is refused before it can exhaust memory.

The bound is a named, documented default that the environment variable
``TRACEANALYZER_MAX_UNCOMPRESSED_BYTES`` overrides (read at each call: nothing process-wide is
changed, and worker processes see it too).
"""
from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from ...errors import TraceInputError

#: Largest uncompressed input accepted (8 GiB: the largest real rank trace we know of is about
#: 2 GB; a worker needs about 3x the uncompressed size). Override: TRACEANALYZER_MAX_UNCOMPRESSED_BYTES.
MAX_UNCOMPRESSED_BYTES = 8 * 1024**3
#: compressed bytes read (and inflated) at a time
READ_CHUNK_BYTES = 1 << 20
ENV_LIMIT = "TRACEANALYZER_MAX_UNCOMPRESSED_BYTES"


def max_uncompressed_bytes() -> int:
    value = os.environ.get(ENV_LIMIT, "").strip()
    if not value:
        return MAX_UNCOMPRESSED_BYTES
    try:
        limit = int(float(value))
    except ValueError:
        limit = 0
    if limit <= 0:
        raise TraceInputError(ENV_LIMIT, f"must be a positive number of bytes, not {value!r}")
    return limit


def open_regular(path: Path, what: str = "file"):
    """Open for reading without blocking on a FIFO; anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise TraceInputError(path, f"cannot read {what} ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else ("a folder" if stat.S_ISDIR(mode) else "not a regular file")
        raise TraceInputError(path, f"{kind}: only regular files are read (copy the data into a file)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, what: str = "file", limit: int | None = None) -> bytes | bytearray:
    """The file's bytes, gunzipped when it starts with the gzip magic number (not by extension)."""
    limit = max_uncompressed_bytes() if limit is None else limit
    with open_regular(path, what) as fh:
        try:
            head = fh.read(2)
            if head != b"\x1f\x8b":
                data = head + fh.read()
                if len(data) > limit:
                    raise TraceInputError(path, _too_big(limit))
                return data
            return _gunzip(path, fh, head, limit)
        except OSError as exc:
            raise TraceInputError(path, f"cannot read {what} ({exc.strerror or exc})") from None


def _too_big(limit: int) -> str:
    return (f"larger than {limit:,} bytes uncompressed (the limit, MAX_UNCOMPRESSED_BYTES; raise it with "
            f"{ENV_LIMIT}=BYTES if the file is genuine)")


def _gunzip(path: Path, fh, head: bytes, limit: int) -> bytearray:
    out = bytearray()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = head
    try:
        while True:
            piece = pending + fh.read(READ_CHUNK_BYTES)
            pending = b""
            if not piece:
                break
            while piece:
                # inflate at most one chunk's worth at a time: a bomb never grows past the limit
                out += d.decompress(piece, READ_CHUNK_BYTES * 16)
                if len(out) > limit:
                    raise TraceInputError(path, _too_big(limit))
                piece = d.unconsumed_tail
                if d.eof:
                    rest = d.unused_data + piece + fh.read()
                    if rest.strip(b"\x00"):  # concatenated gzip members (gzip allows them)
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                        piece = rest
                    else:
                        piece = b""
                        break
            if d.eof and not piece:
                break
        out += d.flush()
    except zlib.error as exc:
        raise TraceInputError(path, f"corrupt gzip data ({exc})") from None
    if not d.eof:
        raise TraceInputError(path, "truncated gzip file (the compressed stream ends early)")
    if len(out) > limit:
        raise TraceInputError(path, _too_big(limit))
    return out
