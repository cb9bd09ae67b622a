"""Release mode's log: the predictions a policy made while `heapcast record --policy` ran, and
`heapcast evaluate --online TRACE`, which scores them against what happened.

The recorder writes, per process, `<pid>.pred` in the trace directory (docs/trace-format.md,
"Predictions"): a 128-byte header, then one 16-byte record per prediction (32 bytes in version 1),
keyed by the seq of the event it predicted. The rows and labels are those of `heapcast evaluate POLICY TRACE`, so the two
can be compared on the same trace.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..forecast.evaluate import metrics
from ..forecast.tasks import DEFAULT_ORDER, make_task
from ..trace.format import TraceError
from .fileformat import TASK_IDS, VOCAB_IDS
from .names import KINDS as KIND_IDS

MAGIC = b"HCPRED1\0"
HEADER = np.dtype([("magic", "S8"), ("version", "<u4"), ("task", "<u4"), ("every", "<u4"),
                   ("kind", "<u4"), ("vocab", "<u4"), ("pad0", "<u4"), ("skipped", "<u8"),
                   ("model_sha256", "S72"), ("pad", "S16")])
#: A prediction as read_predictions returns it (version 1's record on disk).
RECORD = np.dtype([("seq", "<u8"), ("label", "<i4", 5), ("conf", "<f4")])
#: Version 2's record on disk: seq (bits 0-39), confidence in 1/255 (40-47), top label (48-63) of
#: `word`, then labels 2-5 (int16, -1 padding).
RECORD_V2 = np.dtype([("word", "<u8"), ("label", "<i2", 4)])
FEATURE_MAGIC = b"HCFEAT1\0"
#: One decision of development mode (`--log-features`, <pid>.features; docs/trace-format.md).
FEATURE = np.dtype([("seq", "<u8"), ("stream", "<u4"), ("site", "<u4"), ("token", "<u2"),
                    ("dt", "u1"), ("level", "u1"), ("label", "<i4"), ("hint1", "<i4"),
                    ("hint2", "<i4"), ("conf", "u1"), ("n_cache", "u1"), ("pad", "<u2"),
                    ("cache", "<i4", 3), ("pred", "<i4", 3), ("pred_conf", "<f4")])
assert HEADER.itemsize == 128 and RECORD.itemsize == 32 and RECORD_V2.itemsize == 16
assert FEATURE.itemsize == 64
TASKS = tuple(TASK_IDS)           # by the number the header holds
VOCABS = tuple(VOCAB_IDS)
KINDS = {number: name for name, number in KIND_IDS.items()}


def read_predictions(path) -> tuple[dict, np.ndarray]:
    """(header as a dict, RECORD array) of one `<pid>.pred` file; TraceError naming the file and
    the offset when it is not one. A record cut short at the end (a full disk) is left out and
    the header says `truncated`."""
    header, raw = _read(path, MAGIC, {1: RECORD, 2: RECORD_V2}, "predictions")
    if raw.dtype == RECORD:
        return header, raw
    recs = np.zeros(len(raw), RECORD)
    w = raw["word"]
    recs["seq"] = w & np.uint64((1 << 40) - 1)
    recs["conf"] = ((w >> np.uint64(40)) & np.uint64(0xFF)).astype(np.float32) / 255
    recs["label"][:, 0] = (w >> np.uint64(48)).astype(np.uint16).view(np.int16)
    recs["label"][:, 1:] = raw["label"]
    return header, recs


def read_features(path) -> tuple[dict, np.ndarray]:
    """(header, FEATURE array) of one `<pid>.features` file (development mode)."""
    return _read(path, FEATURE_MAGIC, {1: FEATURE}, "features")


def _read(path, magic: bytes, dtypes: dict, what: str) -> tuple[dict, np.ndarray]:
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < HEADER.itemsize or raw[:8] != magic:
        raise TraceError(path, 0, f"not a {what} file (expected magic {magic!r} and a "
                                  f"{HEADER.itemsize}-byte header)")
    h = np.frombuffer(raw[:HEADER.itemsize], HEADER)[0]
    if int(h["version"]) not in dtypes:
        raise TraceError(path, 8, f"{what} format version {h['version']}, this heapcast reads "
                                  f"{', '.join(map(str, dtypes))}")
    dtype = dtypes[int(h["version"])]
    if h["task"] >= len(TASKS) or h["vocab"] >= len(VOCABS):
        raise TraceError(path, 12, f"unknown task {h['task']} or vocabulary {h['vocab']}")
    body = len(raw) - HEADER.itemsize
    recs = np.frombuffer(raw[HEADER.itemsize:HEADER.itemsize + body - body % dtype.itemsize],
                         dtype)
    header = {"task": TASKS[h["task"]], "vocab": VOCABS[h["vocab"]], "every": int(h["every"]),
              "kind": KINDS.get(int(h["kind"]), "?"), "skipped": int(h["skipped"]),
              "model_sha256": h["model_sha256"].decode(errors="replace"),
              "truncated": bool(body % dtype.itemsize)}
    return header, recs


def evaluate_online(trace_path) -> dict:
    """Scores the predictions logged in a trace recorded with `heapcast record --policy` against
    the trace's own labels; returns the metrics of `heapcast evaluate` as a JSON-able dict."""
    from ..forecast.features import featurize
    from ..trace.reader import load
    trace = load(trace_path)
    found = {p.pid: Path(trace.path) / f"{p.pid}.pred" for p in trace.processes}
    found = {pid: f for pid, f in found.items() if f.exists()}
    if not found:
        raise TraceError(trace.path, None, "no predictions: record with `heapcast record "
                                           "--policy POLICY` to log them")
    logs = {pid: read_predictions(f) for pid, f in found.items()}
    header = next(iter(logs.values()))[0]
    if any(h["task"] != header["task"] or h["vocab"] != header["vocab"] for h, _ in logs.values()):
        raise TraceError(trace.path, None, "processes logged predictions of different policies")
    feats = featurize([trace], DEFAULT_ORDER[header["task"]],
                      need_ranks=header["task"] == "free")
    data = make_task(feats, header["task"], header["vocab"])
    pred = np.full((len(data), 5), -1, np.int64)
    have = np.zeros(len(data), bool)
    seq = feats.columns["seq"]
    for i, p in enumerate(trace.processes):
        if p.pid not in logs:
            continue
        recs = logs[p.pid][1]
        rows = np.flatnonzero(feats.columns["proc"] == i)
        order = np.argsort(seq[rows], kind="stable")
        pos = np.searchsorted(seq[rows][order], recs["seq"])
        ok = pos < len(rows)
        ok[ok] = seq[rows][order][pos[ok]] == recs["seq"][ok]
        r = rows[order][pos[ok]]
        pred[r] = recs["label"][ok]
        have[r] = True
    rows = np.flatnonzero(have & (data.labels >= 0))
    result = {"protocol": "online", "task": header["task"], "vocab": header["vocab"],
              "model": f"policy:{header['kind']} (online)", "target": "true",
              "traces": [str(trace.path)], "events": int(len(rows)),
              "predictions_logged": int(sum(len(r) for _, r in logs.values())),
              "every": header["every"], "skipped": sum(h["skipped"] for h, _ in logs.values()),
              "truncated": any(h["truncated"] for h, _ in logs.values()),
              "model_sha256": header["model_sha256"], "sampled": False}
    result.update(metrics(SimpleNamespace(task=header["task"], vocab=header["vocab"],
                                          target="true", n_labels=data.n_labels),
                          data.labels[rows], pred[rows]))
    return result
