"""The `--log` summary: per lifetime class, allocations, bytes, blocks that outlived their
class and sites reclassified, summed over the program's processes."""
from __future__ import annotations

CLASS_NAMES = {0: "1-15 events", 1: "16-255", 2: "256-4095", 3: "4096-65535", 4: ">=65536",
               5: "never freed", -1: "default (none/unknown/large)"}
FIELDS = ("allocations", "bytes", "mispredicted", "reclassified_sites")


def merge_logs(processes: list, policy: str) -> dict:
    """Sums the per-process logs the allocator wrote into one summary."""
    classes = {}
    for proc in processes:
        for row in proc["classes"]:
            acc = classes.setdefault(row["class"], {f: 0 for f in FIELDS})
            for f in FIELDS:
                acc[f] += row[f]
    rows = [{"class": c, "name": CLASS_NAMES.get(c, str(c)), **classes[c]}
            for c in sorted(classes, key=lambda c: (c < 0, c))]
    peak = max((p.get("vm_hwm_kb", -1) for p in processes), default=-1)
    grouped = any(p.get("lifetime_groups", p.get("mode") != "none") for p in processes)
    return {"policy": policy or "none", "process_count": len(processes), "classes": rows,
            "placement": "by lifetime class" if grouped else "one group",
            "max_vm_hwm_kb": peak,
            "heap_of_class": processes[0]["heap_of_class"] if processes else None}


def format_summary(summary: dict) -> str:
    """The summary as a small text table."""
    if summary.get("placement") == "glibc's malloc":
        return (f"heapcast run: policy {summary['policy']} places on glibc's malloc (the allocator "
                f"lab's verdict; nothing of heapcast's ran), peak RSS "
                f"{summary['max_vm_hwm_kb'] / 1024:.1f} MiB")
    lines = [f"heapcast run: policy {summary['policy']}, {summary['process_count']} process(es), "
             f"peak RSS {summary['max_vm_hwm_kb'] / 1024:.1f} MiB, placement "
             f"{summary.get('placement', 'by lifetime class')}",
             f"{'class':<30} {'allocations':>12} {'bytes':>14} {'outlived':>9} {'reclassified':>12}"]
    for r in summary["classes"]:
        if r["allocations"] or r["mispredicted"]:
            lines.append(f"{r['name']:<30} {r['allocations']:>12,} {r['bytes']:>14,} "
                         f"{r['mispredicted']:>9,} {r['reclassified_sites']:>12,}")
    return "\n".join(lines)
