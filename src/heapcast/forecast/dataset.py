"""`heapcast dataset`: token streams and side features of traces, on disk, memory-mapped.

A dataset is a directory:

| file | what |
|---|---|
| `dataset.json` | format/version, stream order, vocabularies and their versions, columns, sources |
| `offsets.npy` | int64 stream boundaries (stream s is rows offsets[s]:offsets[s+1]) |
| `<column>.npy` | one numpy array per column of heapcast.forecast.features (seed64 uint8, rich uint16, site, ...) |
| `events.parquet` | the same rows and columns (plus `stream`) for other tools (unless parquet=False) |

Traces are featurized one at a time and each column appended to its `.npy` file (its header
written first, for the rows the traces' metadata counts), so a corpus larger than memory streams
through (each trace's events must fit). `load_dataset` maps
the arrays back without reading them; `heapcast train/evaluate` accept a dataset directory
wherever they accept a trace.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from .features import COLUMNS, ORDERS, Features, featurize
from .lifetime import LIFETIME_VERSION
from .vocab import VOCABS

FORMAT = "heapcast-dataset"
VERSION = 3      # 2: the free_live column; 3: ranks within call site and size class
MANIFEST = "dataset.json"


def is_dataset(path) -> bool:
    """Whether `path` is a dataset directory."""
    return (Path(path) / MANIFEST).is_file()


def build_dataset(traces, out_dir, order: str = "thread", parquet: bool = True,
                  progress: bool = False) -> Path:
    """Writes the dataset of `traces` (paths or Trace objects) into the new directory `out_dir`."""
    from ..trace.model import Trace
    from ..trace.reader import load
    if order not in ORDERS:
        raise ValueError(f"unknown stream order {order!r} (known: {', '.join(ORDERS)})")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: already exists (expected a new or empty directory)")
    loaded = [t if isinstance(t, Trace) else load(t) for t in traces]
    total = sum(t.event_count for t in loaded)
    out.mkdir(parents=True, exist_ok=True)
    files: dict = {}
    try:
        # Written, not mapped: a mapping's pages written counted in the process's RSS until the
        # end (2.8 GB of pydoc -k's 34M events).
        for c, dt in COLUMNS.items():   # (one at a time: each opened is closed on failure)
            files[c] = _column_file(out / f"{c}.npy", dt, total)
        writer = _ParquetSink(out / "events.parquet") if parquet else None
        offsets, sources, row, proc = [0], [], 0, 0
        from tqdm import tqdm
        for trace in tqdm(loaded, desc="dataset", unit="trace", disable=not progress):
            f = featurize([trace], order=order)
            f.columns["proc"] = (f.columns["proc"] + proc).astype(np.uint16)
            proc += len(trace.processes)
            n = len(f)
            if row + n > total:
                raise ValueError(f"{trace.path}: more events than its metadata says")
            for c, dt in COLUMNS.items():
                files[c].write(np.ascontiguousarray(f.columns[c], dt).data)
            if writer is not None:
                writer.write(f, len(offsets) - 1)
            offsets.extend((f.offsets[1:] + row).tolist())
            sources += f.sources
            row += n
            for p in trace.processes:      # let the events go before the next trace
                p._events = None
        for fh in files.values():
            fh.close()
        if writer is not None:
            writer.close()
        if row != total:
            raise ValueError(f"{out}: the traces hold {row} events, their metadata {total}")
        np.save(out / "offsets.npy", np.asarray(offsets, np.int64))
        manifest = {"format": FORMAT, "version": VERSION, "order": order, "events": row,
                    "streams": len(offsets) - 1,
                    "vocabularies": {v.name: v.version for v in VOCABS.values()},
                    "lifetime_classes_version": LIFETIME_VERSION,
                    "columns": {c: np.dtype(d).name for c, d in COLUMNS.items()},
                    "parquet": "events.parquet" if parquet else None, "sources": sources}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    except BaseException:
        for fh in files.values():
            fh.close()
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def _column_file(path: Path, dtype, rows: int):
    """A new .npy file of `rows` values of dtype, its header written: the values follow."""
    fh = open(path, "wb")
    np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(
        np.dtype(dtype)), "fortran_order": False, "shape": (rows,)})
    return fh


def dataset_sources(path) -> list:
    """The recordings a dataset directory was built from (as recording_source describes them),
    from its manifest alone."""
    return read_manifest(Path(path)).get("sources", [])


def read_manifest(path: Path) -> dict:
    """A dataset directory's manifest, checked: its format, version and vocabularies."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path / MANIFEST}: cannot read the dataset manifest: {e}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path / MANIFEST}: not a heapcast dataset (format "
                         f"{manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path / MANIFEST}: a heapcast dataset of version "
                         f"{manifest.get('version')!r}; this heapcast reads version {VERSION}: "
                         f"rebuild it with heapcast dataset")
    for name, version in manifest.get("vocabularies", {}).items():
        if name in VOCABS and VOCABS[name].version != version:
            raise ValueError(f"{path}: built with vocabulary {name!r} version {version}, this "
                             f"heapcast has version {VOCABS[name].version}: rebuild it")
    return manifest


def load_dataset(path) -> Features:
    """The Features of a dataset directory, columns memory-mapped (read-only)."""
    path = Path(path)
    manifest = read_manifest(path)
    offsets = np.load(path / "offsets.npy")
    cols = {}
    for c, dt in COLUMNS.items():
        if c == "seq" and not (path / "seq.npy").exists():
            continue        # a dataset built before rows kept their seq
        arr = np.load(path / f"{c}.npy", mmap_mode="r")
        if arr.dtype != np.dtype(dt) or len(arr) != int(offsets[-1]):
            raise ValueError(f"{path / (c + '.npy')}: expected {int(offsets[-1])} values of "
                             f"{np.dtype(dt).name}, found {len(arr)} of {arr.dtype}")
        cols[c] = arr
    return Features(manifest["order"], offsets, cols, manifest.get("sources", []))


class _ParquetSink:
    """Appends Features rows to one zstd-compressed Parquet file."""

    def __init__(self, path: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.pa = pa
        fields = [pa.field("stream", pa.uint32())]
        fields += [pa.field(c, pa.from_numpy_dtype(np.dtype(d))) for c, d in COLUMNS.items()]
        self.schema = pa.schema(fields)
        self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")

    def write(self, f: Features, first_stream: int) -> None:
        stream = np.repeat(np.arange(first_stream, first_stream + f.streams, dtype=np.uint32),
                           np.diff(f.offsets))
        arrays = [self.pa.array(stream)] + [self.pa.array(np.asarray(f.columns[c]))
                                            for c in COLUMNS]
        self.writer.write_table(self.pa.Table.from_arrays(arrays, schema=self.schema),
                                row_group_size=1 << 20)

    def close(self) -> None:
        self.writer.close()


def load_features(paths, order: str, need_ranks=False) -> Features:
    """Features of the given traces (paths or Trace objects) and/or dataset directories, in
    stream order `order`."""
    from ..trace.model import Trace
    from .features import concat
    parts, traces = [], []
    for p in paths:
        if not isinstance(p, Trace) and is_dataset(p):
            if traces:
                parts.append(featurize(traces, order, need_ranks))
                traces = []
            d = load_dataset(p)
            if d.order != order:
                raise ValueError(f"{p}: a dataset of {d.order}-order streams; this needs "
                                 f"{order}-order streams (heapcast dataset --order {order})")
            parts.append(d)
        else:
            traces.append(p)
    if traces:
        parts.append(featurize(traces, order, need_ranks))
    return parts[0] if len(parts) == 1 else concat(parts)


def load_task_for(paths, order: str, model) -> tuple:
    """(Features, TaskData) of the recordings or datasets `paths` in stream `order`, as `model` (a
    model, or a POLICY's label space) reads them: with only the rank columns its labels need."""
    from .tasks import make_task_for, rank_groupings
    feats = load_features(list(paths), order,
                          need_ranks=rank_groupings(model.task, getattr(model, "free_group", "all")))
    return feats, make_task_for(feats, model)
