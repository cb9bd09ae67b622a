"""Output files are made ready before the work that fills them (heapcast._outputs): a missing
directory is made, a path that cannot be written fails at once and names the file, and a figure
in a format matplotlib cannot write is refused before the trace is read."""
from __future__ import annotations

import importlib.util
import os

import pytest

import heapcast
from heapcast import cli
from heapcast._outputs import prepare_output


def test_the_directory_of_an_output_file_is_made(tmp_path):
    out = tmp_path / "a" / "b" / "x.json"
    assert prepare_output(out) == out
    assert out.parent.is_dir() and not out.exists()


@pytest.mark.parametrize("case", ["a directory", "under a file", "not writable"])
def test_an_output_that_cannot_be_written_is_refused_naming_it(tmp_path, monkeypatch, case):
    if case == "a directory":
        out, said = tmp_path, "is a directory"
    elif case == "under a file":
        (tmp_path / "f").write_text("")
        out, said = tmp_path / "f" / "g" / "x.png", f"{tmp_path / 'f'} is not a directory"
    else:   # (root may write anywhere: the check itself is what is tested)
        monkeypatch.setattr(os, "access", lambda path, mode: False)
        out, said = tmp_path / "x.png", "permission denied"
    with pytest.raises(OSError, match=said) as e:
        prepare_output(out)
    assert str(out) in str(e.value)


def _no_work(*args, **kwargs):
    raise AssertionError("the work ran before the output was checked")


needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="plots need matplotlib")


@needs_matplotlib
@pytest.mark.parametrize("verb", ["stats", "simulate"])
def test_a_figure_format_matplotlib_cannot_write_fails_before_the_work(tmp_path, monkeypatch,
                                                                       capsys, verb):
    import heapcast.lab.replay
    import heapcast.trace.reader
    monkeypatch.setattr(heapcast.trace.reader, "load", _no_work)
    monkeypatch.setattr(heapcast.lab.replay, "simulate", _no_work)
    (tmp_path / "t").mkdir()
    assert cli.main([verb, str(tmp_path / "t"), "--plot", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'x.txt'}: cannot draw a figure as .txt" in err and "png" in err


@needs_matplotlib
def test_the_stats_api_checks_its_plot_first(tmp_path, monkeypatch):
    summary = importlib.import_module("heapcast.stats.summary")
    plot = importlib.import_module("heapcast.stats.plot")
    monkeypatch.setattr(summary, "aggregate", _no_work)
    with pytest.raises(plot.PlotError, match="cannot draw a figure as .doc"):
        heapcast.stats(tmp_path, plot=tmp_path / "x.doc")


@pytest.mark.parametrize("argv", [
    ["export", "{t}", "--parquet", "{bad}"],
    ["report", "{t}", "-o", "{bad}"],
    ["run", "--policy", "none", "--log", "{bad}", "--", "{false}"],
    ["compile", "{t}/m.safetensors", "-o", "{bad}"],
    ["train", "{t}", "--model", "ngram", "-o", "{bad}"],
])
def test_commands_refuse_an_output_they_cannot_write_before_the_work(tmp_path, capsys, argv):
    """The output's directory lies under a file: refused before the trace or model is read, or
    the program run (`false` would exit 1)."""
    (tmp_path / "f").write_text("")
    bad = tmp_path / "f" / "out"
    (tmp_path / "t").mkdir()
    argv = [a.format(t=tmp_path / "t", bad=bad, false="/bin/false") for a in argv]
    assert cli.main(argv) == 2
    assert f"{bad}: {tmp_path / 'f'} is not a directory" in capsys.readouterr().err


def test_a_missing_output_directory_is_made(build, tmp_path, capsys):
    """`run --log` into a directory that does not exist yet: made, and the log written there
    (before this, the program ran and the log was lost)."""
    log = tmp_path / "new" / "dir" / "run.json"
    assert cli.main(["run", "--policy", "none", "--log", str(log), "--", str(build("churn"))]) == 0
    assert log.stat().st_size > 0


def test_a_system_error_names_its_file_plainly(build, tmp_path, capsys):
    """An OSError reaches the user as "FILE: reason", not as Python's "[Errno 2] ...: 'FILE'"."""
    assert heapcast.record([str(build("churn"))], output=tmp_path / "t").exit_code == 0
    missing = tmp_path / "missing.safetensors"
    assert cli.main(["report", str(tmp_path / "t"), "--model", str(missing),
                     "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"heapcast report: error: {missing}: No such file or directory" in err
    assert "Errno" not in err


@pytest.mark.parametrize("argv, unknown", [(["stats", "t", "--bogus"], "--bogus"),
                                           (["export", "t", "-o", "x.parquet"], "-o x.parquet"),
                                           (["simulate", "t", "--nosuch", "1"], "--nosuch 1")])
def test_an_unknown_option_is_the_subcommands_error(argv, unknown, capsys):
    """An option the subcommand does not have: its own usage and name, not the top-level
    `heapcast [-h] COMMAND ...` that argparse gives by default."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: heapcast {argv[0]} ")
    assert f"heapcast {argv[0]}: error: unrecognized arguments: {unknown}" in err
