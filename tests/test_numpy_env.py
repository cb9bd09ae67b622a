"""numpy loads in heapcast's own process without transparent huge pages for its arrays (the heavy
commands and record's converter; heapcast._numpy_env), unless the user chose otherwise, and the
environment the command's programs get stays the user's."""
from __future__ import annotations

import subprocess
import sys

import pytest

from heapcast import cli

PROBE = """
import os
from heapcast._numpy_env import import_numpy
import_numpy({"NUMPY_MADVISE_HUGEPAGE": "0"})
import numpy
try:
    from numpy._core.multiarray import _get_madvise_hugepage
except ImportError:   # numpy 1.x
    from numpy.core.multiarray import _get_madvise_hugepage
print(_get_madvise_hugepage(), os.environ.get("NUMPY_MADVISE_HUGEPAGE"))
"""


@pytest.mark.parametrize("users, huge, left", [(None, "False", "None"), ("1", "True", "1")])
def test_numpy_loads_without_huge_pages_unless_the_user_chose(users, huge, left):
    import os
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if users is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = users
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [huge, left]


@pytest.mark.parametrize("verb", ["stats", "evaluate", "record"])
def test_the_commands_load_numpy_so(tmp_path, monkeypatch, verb):
    """The heavy commands with HEAVY_NUMPY; `record` with its own settings (no OpenBLAS threads
    either), on its converter's thread."""
    from heapcast.recorder.session import QUIET_NUMPY
    calls = []
    monkeypatch.setattr("heapcast._numpy_env.import_numpy", calls.append)
    monkeypatch.setenv("HEAPCAST_MALLOC_TUNING", "0")   # (no run again with glibc's settings)
    monkeypatch.setattr(cli, "_exit_now", lambda code: None)
    argv = {"stats": [str(tmp_path / "none")],
            "evaluate": [str(tmp_path / "m"), str(tmp_path / "none"), "--protocol", "time"],
            "record": ["-o", str(tmp_path / "t"), "--", "/bin/true"]}[verb]
    monkeypatch.setattr(sys, "argv", ["heapcast", verb, *argv])
    cli.main()
    assert calls == [QUIET_NUMPY if verb == "record" else cli.HEAVY_NUMPY]
