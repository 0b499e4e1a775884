"""What an input file holds, told from its content (not its name), and whose rank it is.

:func:`sniff` reads the first 64 KiB (gunzipped when gzip, by magic number) and answers one of
:data:`KINDS`, or ``None`` with a short description of what it did see. File names are used only
where the content cannot tell (a ``.json`` that is too broken to recognise still goes to the Kineto
reader, which names the problem).

:func:`rank_of` is the one rule for the rank of a per-process input: the content, then the
collector's ``rank{R}.manifest.json`` beside it, then ``--rank``, then a number in the file name.
"""
from __future__ import annotations

import re
import zlib
from pathlib import Path

SNIFF_BYTES = 64 * 1024
SQLITE_MAGIC = b"SQLite format 3\x00"
PARQUET_MAGIC = b"PAR1"
#: Kinds that become traces (events tables) and kinds that are per-process inputs ("sidecars").
TRACE_KINDS = ("kineto", "nsys", "op_timeline")
SIDECAR_KINDS = ("flight_recorder", "nccl_log", "nccl_inspector", "nccl_profiler")
KINDS = TRACE_KINDS + SIDECAR_KINDS
#: The one line a file of none of these kinds gets (after what it looked like).
EXPECTED = ("expected a Kineto trace (JSON, optionally gzip), a Flight Recorder dump (JSON or pickle), an NCCL "
            "debug log (use --nccl-log for any name), an NCCL Inspector log, an NCCL profiler plugin dump, an "
            "Nsight Systems SQLite export or an op timeline (Parquet/CSV with rank, step, op, start, duration)")
_NUMBER = re.compile(r"(\d+)")


def head_bytes(path: Path, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes, gunzipped (by magic number) when gzip; b"" when unreadable."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(n)
    except OSError:
        return b""
    if data[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(31).decompress(data, n)
        except zlib.error:
            return b""
    return data


def sniff(path: str | Path, column_map: dict | None = None) -> tuple[str | None, str]:
    """(kind, what it looks like): kind is one of :data:`KINDS` or None (then the description
    says what was seen, for the one-line error)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(16)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if not raw:
        return None, "an empty file"
    if raw == SQLITE_MAGIC:  # the Nsight Systems reader says what is wrong with one that is not an export
        return "nsys", ""
    if raw[:4] == PARQUET_MAGIC:
        from .op_timeline import columns_match, parquet_columns
        cols = parquet_columns(path)
        if cols is None:
            return None, "a damaged Parquet file"
        missing = columns_match(cols, column_map)
        return ("op_timeline", "") if not missing else (None, f"a Parquet file without op-timeline columns "
                                                              f"{', '.join(missing)} (it has {', '.join(cols[:12])})")
    if raw[:1] == b"\x80":
        return "flight_recorder", ""  # a pickle: only the restricted unpickler ever reads it (safe_pickle)
    head = head_bytes(path)
    text = head.decode("utf-8", errors="replace")
    kind = _text_kind(text, column_map)
    if kind:
        return kind, ""
    return None, _describe(head, text)


#: A pickle found in a folder (not named like an FR dump) is opened, through the restricted
#: unpickler, only below this size to check that it is one.
FOLDER_PICKLE_MAX_BYTES = 64 * 1024 * 1024


def head_is_pickle(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False


def is_fr_pickle(path: Path) -> bool:
    """A pickle holding a Flight Recorder dump (its top level has pg_config and version/entries);
    read only through :func:`traceanalyzer.ingest.safe_pickle.load_plain` (nothing in it runs)."""
    from ..errors import TraceInputError
    from .safe_pickle import load_plain
    try:
        if path.stat().st_size > FOLDER_PICKLE_MAX_BYTES:
            return False
        doc = load_plain(path.read_bytes(), path)
    except (OSError, TraceInputError):
        return False
    return isinstance(doc, dict) and "pg_config" in doc and bool({"version", "entries"} & doc.keys())


def _text_kind(text: str, column_map: dict | None) -> str | None:
    from .nccl.logs import looks_like_nccl_log
    from .nccl.plugins import looks_like_inspector, looks_like_profiler_dump
    stripped = text.lstrip()
    if looks_like_inspector(text):
        return "nccl_inspector"
    if looks_like_profiler_dump(text):
        return "nccl_profiler"
    if stripped.startswith("{"):
        if re.search(r'"(traceEvents|schemaVersion|deviceProperties|displayTimeUnit)"\s*:', text):
            return "kineto"
        if re.search(r'"pg_config"\s*:', text) and re.search(r'"(version|entries|pg_status)"\s*:', text):
            return "flight_recorder"
    if looks_like_nccl_log(text):
        return "nccl_log"
    first = stripped.split("\n", 1)[0]
    if "," in first or "\t" in first:
        from .op_timeline import columns_match
        cols = [c.strip().strip('"') for c in re.split(r"[,\t]", first)]
        if not columns_match(cols, column_map):
            return "op_timeline"
    return None


def _describe(head: bytes, text: str) -> str:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        keys = re.findall(r'^\s*\{?\s*"([^"]{1,40})"\s*:', stripped[:2000], re.M)[:6]
        return "a JSON object" + (f" with keys {', '.join(keys)}" if keys else "") + " that is neither a Kineto trace nor a Flight Recorder dump"
    if stripped.startswith("["):
        return "a JSON array (not an NCCL profiler plugin dump)"
    if b"\x00" in head[:4096]:
        return "binary data"
    first = stripped.split("\n", 1)[0][:60]
    return f"text starting {first!r}" if first else "whitespace only"


def kind_by_name(path: Path) -> str | None:
    """The kind a file's name alone suggests (used only when the content cannot tell)."""
    from .flight_recorder import is_fr_name
    from .nccl.logs import NAME_RE
    name = path.name
    if is_fr_name(path) or path.suffix in (".pkl", ".pickle"):
        return "flight_recorder"
    if NAME_RE.search(name):
        return "nccl_log"
    if name.endswith((".json", ".json.gz")):
        return "kineto"
    return None


def rank_of(path: str | Path, content_rank: int | None = None, rank_arg: int | None = None,
            kind_key: str | None = None, cache: dict | None = None) -> tuple[int | None, str | None]:
    """(rank, source): the content's rank, then a ``rank{R}.manifest.json`` beside the file that
    lists it (under ``files.<kind_key>`` or ``files.traces``), then ``--rank``, then a number in
    the file name (``rank{R}``/``rank_{R}`` first, else the last number). (None, None) if none.
    ``cache``: each folder's manifests read once (:func:`.sidecars.rank_manifests`)."""
    path = Path(path)
    if content_rank is not None:
        return content_rank, "content"
    r = _manifest_rank(path, kind_key, cache)
    if r is not None:
        return r, "manifest"
    if rank_arg is not None:
        return rank_arg, "argument"
    from .nccl.logs import rank_from_name
    r = rank_from_name(path)
    if r is None:
        stem = path.name.split(".")[0]
        nums = _NUMBER.findall(stem) or _NUMBER.findall(path.name)
        r = int(nums[-1]) if nums else None
    return (r, "file_name") if r is not None else (None, None)


def _manifest_rank(path: Path, kind_key: str | None, cache: dict | None = None) -> int | None:
    from .sidecars import rank_manifests
    for _, doc in rank_manifests(path.parent, cache):
        try:
            files = doc.get("files") or {}
            listed = files.get(kind_key) if kind_key else None
            listed = [listed] if isinstance(listed, str) else list(listed or [])
            listed += list(files.get("traces") or [])
            if path.name in listed:
                return int(doc["rank"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # unreadable manifests are reported where they are checked (check_rank_manifest)
    return None
