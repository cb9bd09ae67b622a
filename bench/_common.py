"""Shared helpers for heapcast's benchmarks: locating and compiling the reference workloads, timing
commands, running trials interleaved, medians, plain-text tables and JSON results.

Every benchmark in bench/ prints a table on stdout, shows progress on stderr and writes its numbers
as JSON (with the machine they were taken on) under bench/results/ unless told otherwise.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKLOADS_DIR = REPO_ROOT.parent / "shared" / "workloads"
RESULTS_DIR = REPO_ROOT / "bench" / "results"


class BenchError(RuntimeError):
    """A benchmark step failed (a compile, or a command that exited badly)."""


def workload(name: str) -> Path:
    """Path of a reference workload file (../shared/workloads from the repository root)."""
    path = WORKLOADS_DIR / name
    if not path.is_file():
        raise BenchError(f"reference workload {path} not found (expected ../shared/workloads "
                         f"beside the repository root)")
    return path


def compile_c(source: Path, output: Path, flags: tuple = ("-O2",), libs: tuple = ()) -> Path:
    """Compiles one C file with gcc into `output` (a program, or a library with -shared);
    `libs` (-l options) go after the source, where the linker looks for them."""
    cmd = ["gcc", *flags, "-o", str(output), str(source), *libs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
    return output


def python_executable() -> str:
    """The real interpreter binary running this benchmark: a shim (pyenv's is a shell script)
    would be traced too and would add its own process to every measurement."""
    return os.path.realpath(sys.executable)


def time_command(cmd: list, env: dict | None = None, cwd: Path | None = None) -> float:
    """Runs `cmd` to completion and returns its wall time in seconds; raises BenchError, with
    the end of its stderr, if it exits non-zero. Its stdout is discarded."""
    full_env = {**os.environ, **(env or {})}
    start = time.perf_counter()
    done = subprocess.run(cmd, env=full_env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip()[-2000:]
        raise BenchError(f"{' '.join(map(str, cmd))} exited with {done.returncode}:\n{tail}")
    return seconds


def measured(cmd: list, env: dict | None = None) -> dict:
    """Runs `cmd` (with `env` added to the environment); its wall seconds, CPU seconds (user +
    system: what it costs on a quiet machine, which wall time on a shared one is not) and peak
    RSS in MB (wait4's: the largest of it and the processes it waited for). Raises BenchError,
    with the end of its stderr, if it exits non-zero. Its stdout is discarded."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    # (stderr read before the wait: a program that fills the pipe would never exit)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n{err[-2000:]}")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def interleaved(trials: dict[str, Callable[[], dict]], repeats: int,
                label: str = "") -> dict[str, list[dict]]:
    """Runs every trial `repeats` times, round-robin: each round runs each trial once, starting one
    trial later than the round before, so slow drifts of the machine (heat, other load) spread
    over all trials instead of biasing one; every other round runs backwards, so that no trial
    always follows the same one (a run can leave work behind for the next: the kernel freeing
    and discarding a deleted trace of hundreds of MB, which slowed `record_ab.py`'s B by 5-20%
    when it always ran after A). A trial returns a dict of measurements (at least "seconds");
    the result maps each trial name to its list of dicts, in run order."""
    names = list(trials)
    results: dict[str, list[dict]] = {name: [] for name in names}
    with tqdm(total=repeats * len(names), desc=label, unit="run", file=sys.stderr,
              leave=False) as bar:
        for round_ in range(repeats):
            shift = round_ % len(names)
            order = names[shift:] + names[:shift]
            for name in (order if round_ % 2 == 0 else order[::-1]):
                bar.set_postfix_str(name)
                results[name].append(trials[name]())
                bar.update()
    return results


def median(values) -> float | None:
    """Median of the values that are not None; None if there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def directory_bytes(path: Path, suffix: str = "") -> int:
    """Total size of the files under `path` (recursively) whose names end with `suffix`."""
    return sum(f.stat().st_size for f in Path(path).rglob(f"*{suffix}") if f.is_file())


def format_table(headers: list[str], rows: list[list]) -> str:
    """A plain-text table: numbers right-aligned, text left-aligned, None shown as "-"."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    numeric = [all(_looks_numeric(r[i]) for r in cells) if cells else False
               for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _looks_numeric(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x"))
        return True
    except ValueError:
        return text == "-"


def machine_info() -> dict:
    """Where and when the numbers were taken."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_json(path: Path, results: dict) -> Path:
    """Writes `results` as indented, strict JSON (creating the directory; infinities become the
    strings "inf"/"-inf", NaN null); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(results), indent=2, allow_nan=False) + "\n")
    return path


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
