"""`heapcast run`: a program under heapcast's allocator, with classes from a POLICY, from an
oracle file, or none."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


class AllocError(ValueError):
    """The allocator cannot run the program as asked (library not built, bad POLICY...)."""


def alloc_library(backend: str = "pack") -> Path:
    """Path of the allocator library that `backend` runs on, built by `pip install .`:
    libheapcast_alloc.so (the packer, glibc's malloc beside it) or, for "mimalloc",
    libheapcast_alloc_mimalloc.so (built where libmimalloc-dev exists)."""
    name = "libheapcast_alloc_mimalloc.so" if backend == "mimalloc" else "libheapcast_alloc.so"
    lib = Path(__file__).resolve().parent.parent / name
    if not lib.exists():
        if backend == "mimalloc":
            raise AllocError(
                f"{lib} is missing: --backend mimalloc is built on Debian's mimalloc, whose "
                "headers were not found when heapcast was installed; install them (apt-get "
                "install libmimalloc-dev) and reinstall heapcast (`pip install .`), or run the "
                "default backend (--backend pack)")
        raise AllocError(f"{lib} is missing: reinstall heapcast (`pip install .`) so that its "
                         "allocator is built")
    return lib


def _policy_env(policy: str) -> dict:
    """The allocator's variables for a --policy value: none, oracle:TRACE or a POLICY path."""
    if policy in (None, "", "none"):
        return {"HEAPCAST_ALLOC_POLICY": "none"}
    if policy.startswith("oracle:"):
        trace = Path(policy[len("oracle:"):])
        if not trace.exists():
            raise AllocError(f"{trace}: no such trace (--policy oracle:TRACE names a recording "
                             "of the same command)")
        from .oracle import cached_oracle
        return {"HEAPCAST_ALLOC_ORACLE": str(cached_oracle(trace))}
    path = Path(policy)
    if not path.is_file():
        raise AllocError(f"{path}: no such POLICY file (`heapcast compile MODEL --kind table -o "
                         "POLICY` makes one; or use --policy none, oracle:TRACE)")
    return {"HEAPCAST_ALLOC_POLICY": str(path.resolve())}


def _check(env: dict) -> None:
    """Loads the POLICY or oracle file in a throwaway process under the allocator, so that a bad
    file is an error before the program starts (the allocator itself only warns and runs on)."""
    probe = ["/bin/true"] if os.path.exists("/bin/true") else ["true"]
    check_env = {k: v for k, v in {**os.environ, **env}.items() if k != "HEAPCAST_ALLOC_LOG"}
    done = subprocess.run(probe, env={**check_env, "HEAPCAST_ALLOC_CHECK": "1"},
                          capture_output=True, text=True, timeout=60)
    if done.returncode == 97:
        raise AllocError(done.stderr.strip())
    if done.returncode != 0:
        raise AllocError(f"the allocator could not start a program ({done.returncode}): "
                         f"{done.stderr.strip()}")


def placement_of(policy: str) -> dict:
    """The placement a --policy value carries (heapcast.policy.placement): {} for none,
    oracle:TRACE, a table without one, or a file that does not read (the allocator's own check
    says what is wrong with it)."""
    if policy in (None, "", "none") or policy.startswith("oracle:"):
        return {}
    from ..policy.fileformat import PolicyError, read_spec
    try:
        return read_spec(policy).get("placement") or {}
    except (PolicyError, OSError):
        return {}


def family(policy: str) -> str:
    """What a --policy value runs the program on: "glibc" for a POLICY whose placement (the
    allocator lab's verdict) is glibc's own malloc, else "heapcast" (heapcast's allocator;
    policies compiled before the packer say "mimalloc" for it)."""
    return "glibc" if placement_of(policy).get("family") == "glibc" else "heapcast"


BACKENDS = ("pack", "mimalloc")


def environment(policy: str = "none", log=None, check: bool = True,
                backend: str = "pack", align: int | None = None) -> dict:
    """The environment variables that run a program under the allocator (LD_PRELOAD first, an
    existing LD_PRELOAD kept after it). `log`: a path prefix for the per-process summaries
    (PREFIX.PID.json). `backend`: what serves the blocks, "pack" (heapcast's packer,
    native/alloc/pack.c, one span set per lifetime group; a mapping each for blocks over 256
    KiB) or "mimalloc" (its heaps, one per group). `align`: 16 (glibc's guarantee for every
    block) or 8 (the packer's classes every 8 bytes: a block whose size is not a multiple of 16
    is 8-byte aligned, as mimalloc's are); None: the POLICY's (`heapcast compile --align`), else
    16. A POLICY whose placement is glibc's malloc preloads
    nothing: {} (the file is still checked). Raises AllocError for a missing library, a bad
    POLICY, an unknown backend or alignment."""
    if backend not in BACKENDS:
        raise AllocError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if align is None:   # mimalloc's small classes are every 8 bytes anyway
        align = int(placement_of(policy).get("align", 16)) if backend == "pack" else 16
    if align not in (8, 16):
        raise AllocError(f"align {align}: expected 16 (glibc's) or 8")
    if align == 8 and backend != "pack":
        raise AllocError("align 8: only the packer (--backend pack) has 8-byte size classes")
    lib = str(alloc_library(backend))
    preload = os.environ.get("LD_PRELOAD")
    env = {"LD_PRELOAD": lib + (":" + preload if preload else ""),
           "HEAPCAST_ALLOC_BACKEND": backend}
    if align == 8:
        env["HEAPCAST_PACK_GRAIN"] = "8"
    env.update(_policy_env(policy))
    if log is not None:
        env["HEAPCAST_ALLOC_LOG"] = str(Path(log).resolve())
    if check:
        _check(env)
    if family(policy) == "glibc":
        return {}
    return env


@dataclass
class RunResult:
    """How a run went: the program's exit status (128+N for signal N) and, with a log, the
    merged per-class summary of its processes."""
    exit_code: int
    summary: dict | None = None
    processes: list = field(default_factory=list)


def run(cmd, policy: str = "none", log=None, env: dict | None = None,
        backend: str = "pack", align: int | None = None) -> RunResult:
    """Runs `cmd` under heapcast's allocator and returns its exit status (and with `log`, a path,
    the merged summary written there as JSON)."""
    from ..recorder.session import run_program
    from .summary import merge_logs
    cmd = [str(c) for c in cmd]
    if not cmd:
        raise AllocError("no command to run")
    with tempfile.TemporaryDirectory(prefix="heapcast-run-") as tmp:
        prefix = Path(tmp) / "log" if log is not None else None
        # {}: the policy's placement is glibc's malloc
        ours = environment(policy, prefix, backend=backend, align=align)
        full = {**os.environ, **(env or {}), **ours}
        exit_code, _, _ = run_program(cmd, full, None, 10)
        result = RunResult(exit_code)
        if log is not None:
            result.processes = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("log.*.json"))]
            result.summary = merge_logs(result.processes, policy)
            if not ours:
                # nothing of heapcast's ran in the program, so nothing read its VmHWM; the
                # kernel's maxrss of a child would include this Python's pages from before exec
                result.summary.update(placement="glibc's malloc", max_vm_hwm_kb=-1)
            Path(log).write_text(json.dumps({**result.summary, "processes": result.processes},
                                            indent=2) + "\n")
    return result
