"""The `--log` summary: per lifetime class, allocations, bytes, blocks that outlived their
class and sites reclassified, and per heap (lifetime group) the pages the packer gave back to
the kernel, summed over the program's processes."""
from __future__ import annotations

import json
from pathlib import Path

CLASS_NAMES = {0: "1-15 events", 1: "16-255", 2: "256-4095", 3: "4096-65535", 4: ">=65536",
               5: "never freed", -1: "default (none/unknown/large)"}
FIELDS = ("allocations", "bytes", "mispredicted", "reclassified_sites")
# blocks that outlived their class at a site the allocator's table of watched sites
# (native/alloc/classify.c; its size is the log's watched_sites) had no room for, so that it
# could not be reclassified (logs of stop 45 and before lack it: 0)
UNTRACKED = "mispredicted_untracked"


def merge_logs(processes: list, policy: str) -> dict:
    """Sums the per-process logs the allocator wrote into one summary."""
    classes = {}
    for proc in processes:
        for row in proc["classes"]:
            acc = classes.setdefault(row["class"], {f: 0 for f in (*FIELDS, UNTRACKED)})
            for f in FIELDS:
                acc[f] += row[f]
            acc[UNTRACKED] += row.get(UNTRACKED, 0)
    rows = [{"class": c, "name": CLASS_NAMES.get(c, str(c)), **classes[c]}
            for c in sorted(classes, key=lambda c: (c < 0, c))]
    returned = None   # pages given back per heap: the packer counts them, mimalloc does not
    if processes and all("pages_returned_by_heap" in p for p in processes):
        returned = [sum(col) for col in zip(*(p["pages_returned_by_heap"] for p in processes))]
    peak = max((p.get("vm_hwm_kb", -1) for p in processes), default=-1)
    grouped = any(p.get("lifetime_groups", p.get("mode") != "none") for p in processes)
    return {"policy": policy or "none", "process_count": len(processes), "classes": rows,
            "placement": "by lifetime class" if grouped else "one group",
            "max_vm_hwm_kb": peak,
            "backend": processes[0].get("backend", "mimalloc") if processes else None,
            "pages_returned_by_heap": returned,
            "heap_of_class": processes[0]["heap_of_class"] if processes else None,
            "watched_sites": processes[0].get("watched_sites") if processes else None}


def format_summary(summary: dict) -> str:
    """The summary as a small text table."""
    if summary.get("placement") == "glibc's malloc":
        return (f"heapcast run: policy {summary['policy']} places on glibc's malloc (the allocator "
                f"lab's verdict): nothing of heapcast's ran in the program, so no per-class "
                f"summary and no peak RSS (`/usr/bin/time -v` or `heapcast record` measures it)")
    lines = [f"heapcast run: policy {summary['policy']}, {summary['process_count']} process(es), "
             f"peak RSS {summary['max_vm_hwm_kb'] / 1024:.1f} MiB, placement "
             f"{summary.get('placement', 'by lifetime class')}",
             f"{'class':<30} {'allocations':>12} {'bytes':>14} {'outlived':>9} {'reclassified':>12}"]
    for r in summary["classes"]:
        if r["allocations"] or r["mispredicted"]:
            lines.append(f"{r['name']:<30} {r['allocations']:>12,} {r['bytes']:>14,} "
                         f"{r['mispredicted']:>9,} {r['reclassified_sites']:>12,}")
    untracked = sum(r.get(UNTRACKED, 0) for r in summary["classes"])
    if untracked:
        lines.append(f"{untracked:,} of the outlived blocks were at sites that the allocator's "
                     f"table of watched sites ({summary.get('watched_sites') or 0:,}) had no "
                     f"room for: those sites kept their predicted class")
    returned, heap_of = summary.get("pages_returned_by_heap"), summary.get("heap_of_class")
    if returned is not None and heap_of:
        # spans belong to a heap (a lifetime group), not to a class: one line per heap in use.
        # heap_of_class: the classes 0-5, then "no class" (class -1 in the rows)
        names_of = {h: [] for h in range(len(returned))}
        for r in summary["classes"]:
            if r["allocations"]:
                names_of[heap_of[r["class"]]].append(r["name"])   # -1: the last entry
        for h, pages in enumerate(returned):
            names = names_of[h]
            if names or pages:
                lines.append(f"heap {h} ({', '.join(names) or 'no allocations'}): {pages:,} "
                             f"pages given back to the kernel ({pages * 4096 / 2**20:.1f} MiB)")
    elif summary.get("backend") in ("mimalloc", "glibc"):
        lines.append(f"pages given back: not counted on the {summary['backend']} backend")
    return "\n".join(lines)


def read_run_log(path) -> dict:
    """The summary in a `heapcast run --log` file (what `heapcast stats RUN.json` shows); a
    ValueError that names the file and the field for anything else."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a `heapcast run --log` file ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a `heapcast run --log` file (expected a JSON object)")
    for key, kind in (("policy", str), ("process_count", int), ("classes", list),
                      ("max_vm_hwm_kb", int)):
        if not isinstance(d.get(key), kind):
            raise ValueError(f"{path}: field {key!r}: expected {kind.__name__} (a `heapcast run "
                             f"--log` file has policy, process_count, classes, max_vm_hwm_kb)")
    for i, row in enumerate(d["classes"]):
        bad = [f for f in ("class", "name", *FIELDS)
               if not isinstance(row, dict) or f not in row]
        if bad:
            raise ValueError(f"{path}: classes[{i}]: missing {', '.join(bad)}")
    return d
