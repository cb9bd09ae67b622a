"""heapcast report: the page of a real recording, opened in headless Chromium (Debian's package,
installed by scripts/setup.sh): it renders, logs nothing to the console, draws its charts and flame
graph with the trace's numbers, loads nothing over the network, and leaves a screenshot in
test-artifacts/report.png."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import heapcast
from heapcast.cli import main
from heapcast.report.data import build
from heapcast.report.sections import diff_section

ARTIFACTS = Path(os.environ.get("HEAPCAST_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts"))
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,2600", "--virtual-time-budget=8000"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, build):
    """churn.c recorded with 8-frame stacks: a parent and its forked child."""
    d = tmp_path_factory.mktemp("report")
    exe = build("churn")
    assert heapcast.record([str(exe)], output=d / "churn.trace", stacks=8).exit_code == 0
    return d, exe


def chromium(page: Path, tmp: Path, *extra, fragment: str = "") -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, page.as_uri() + fragment]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def page_requests(netlog: Path) -> list:
    """http(s) URLs the page asked for (the browser's own requests have no origin)."""
    d = json.loads(netlog.read_text())
    types = {v: k for k, v in d["constants"]["logEventTypes"].items()}
    return [e["params"]["url"] for e in d["events"]
            if types.get(e["type"]) == "URL_REQUEST_START_JOB"
            and e.get("params", {}).get("initiator") != "not an origin"
            and re.match(r"https?://", e["params"].get("url", ""))]


def console_messages(stderr: str) -> list:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def open_page(page: Path, tmp: Path, fragment: str = "") -> tuple[str, list, list]:
    """(DOM after the scripts ran, console messages, http(s) URLs the page requested)."""
    netlog = tmp / "net.json"
    done = chromium(page, tmp, "--enable-logging=stderr", "--v=0", f"--log-net-log={netlog}",
                    "--net-log-capture-mode=Everything", "--dump-dom", fragment=fragment)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, console_messages(done.stderr), page_requests(netlog)


def test_detectors_see_console_errors_and_requests(tmp_path):
    """The checks below are not vacuous: a page that logs an error and loads an image over http
    is caught by both."""
    probe = tmp_path / "probe.html"
    probe.write_text('<html><body><img src="http://127.0.0.1:9/probe.png">'
                     '<script>console.error("probe failed")</script></body></html>')
    _, console, requests = open_page(probe, tmp_path)
    assert any("probe failed" in line for line in console)
    assert requests == ["http://127.0.0.1:9/probe.png"]


def test_report_in_chromium(recorded, tmp_path):
    d, exe = recorded
    out = heapcast.report(d / "churn.trace", output=tmp_path / "report.html")
    assert out == tmp_path / "report.html" and oct(out.stat().st_mode & 0o777) == "0o600"
    assert "<script src" not in out.read_text()                        # everything inlined
    s = heapcast.stats(d / "churn.trace")

    dom, console, requests = open_page(out, tmp_path)
    assert console == []
    assert requests == []
    assert 'data-rendered="yes"' in dom
    # Every chart was drawn by plotly (an SVG in its div), the flame graph as an icicle.
    for div in ("mem", "flame", "sizes", "life-ns", "life-events"):
        m = re.search(rf'<div id="{div}"[^>]*>(.*?)</div>\s*(<p|<div class="controls"|</section|<div id=)', dom, re.S)
        assert m and "main-svg" in m.group(1), div
    assert "iciclelayer" in dom
    # The trace's numbers: the summary cards, the table, the flame graph's labels.
    cards = dom[dom.index('id="cards"'):dom.index('id="ops"')]
    assert f">{s['events']:,}<" in cards
    assert f"{s['processes']} process(es)" in cards
    assert f">{s['ops']['posix_memalign']:,}<" in dom
    assert f"main ({exe.name})" in dom                                 # a symbolized frame
    parent, child = s["per_process"]
    assert f">{child['forked_from']} (fork)<" in dom and f">{child['events']:,}<" in dom

    # A time range (as a link carries it) filters the histogram, the flame graph and the table.
    t_peak = s["peak_live"]["seconds"]
    ranged, console, requests = open_page(out, tmp_path / "ranged", f"#range=0,{t_peak:.6f}")
    assert console == [] and requests == []
    assert "time range 0.0000" in ranged and "allocations (in range)" in ranged
    assert "in the selected time range" in ranged
    assert "blocks allocated in the time range" in ranged       # the lifetime heatmaps
    # ... and the other measures of the flame graph too (a link can name the measure)
    for metric, title in (("at_peak", "bytes live at the peak"), ("temporary", "temporary allocations"),
                          ("leaked_bytes", "bytes never freed")):
        page, console, requests = open_page(out, tmp_path / metric, f"#range=0,{t_peak:.6f}&metric={metric}")
        assert console == [] and requests == []
        assert f"{title} in the selected time range" in page, metric

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    done = chromium(out, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 10_000


def test_report_data_numbers_match_stats(recorded):
    d, _ = recorded
    trace = heapcast.load(d / "churn.trace")
    data = build(trace, chunk=999)
    s = heapcast.stats(trace)
    for k in ("events", "peak_live_bytes", "peak_rss_bytes", "leaked_bytes", "ops", "lifetimes"):
        assert data["summary"][k] == s[k], k
    assert sum(c["count"] for c in data["size_classes"]) == sum(c["count"] for c in s["size_classes"])
    assert sum(r["count"] for r in data["sites"]) == sum(c["count"] for c in s["size_classes"])
    # The flame graph's root holds every allocation; the allocations of the time buckets too.
    assert data["flame"]["top_down"]["values"]["count"][0] == sum(r["count"] for r in data["sites"])
    assert data["flame"]["bottom_up"]["values"]["count"][0] == data["flame"]["top_down"]["values"]["count"][0]
    assert sum(sum(p["allocs"]) for p in data["processes"]) == sum(r["count"] for r in data["sites"])
    # Filtering by time range: per location and coarse bucket, adding up to the same allocations,
    # temporary allocations and bytes never freed; the bytes live at each bucket's own peak, at
    # the bucket of each process's peak, are that process's bytes at its peak.
    for tree in data["flame"].values():
        for metric in ("count", "temporary", "leaked_bytes"):
            total = sum(sum(loc["by"][metric][1]) for loc in tree["ranged"] if metric in loc["by"])
            assert total == tree["values"][metric][0], metric
        for loc in tree["ranged"]:
            got = sum(loc["by"]["count"][1]) if "count" in loc["by"] else 0
            assert all(tree["values"]["count"][n] >= got for n in loc["nodes"])
        at_peak = 0
        for p in data["processes"]:
            b = max(range(len(p["range_peak"])), key=lambda i: p["range_peak"][i])
            at_peak += sum(d[1][d[0].index(b)] for loc in tree["ranged"] if loc["pid"] == p["pid"]
                           for d in [loc["by"].get("at_peak", [[], []])] if b in d[0])
        assert 0 < at_peak == tree["values"]["at_peak"][0] - sum(
            v for i, v in enumerate(tree["values"]["at_peak"]) if tree["labels"][i] == "inherited at fork")
    # The histogram's bytes and the lifetime heatmaps by time bucket add up to the run's.
    assert sum(sum(v) for p in data["processes"] for v in p["class_bytes_by_range"].values()) == \
        sum(c["bytes"] for c in data["size_classes"])
    for kind in ("ns", "events"):
        total = sum(sum(p["life_by_range"][kind][3]) for p in data["processes"])
        assert total == sum(map(sum, data["lifetimes"][kind]["counts"])) > 0, kind
    # The table's filtered columns too: over all buckets, each row's whole-run values; at each
    # process's peak bucket, the bytes it had live at its peak.
    peak_bucket = {str(p["pid"]): max(range(len(p["range_peak"])), key=lambda i: p["range_peak"][i])
                   for p in data["processes"]}
    for column in ("count", "temporary", "leaked_bytes", "at_peak"):
        got = [0] * len(data["sites"])
        for pid, per in data["site_ranges"].items():
            for r, (buckets, values) in per[column].items():
                got[int(r)] += sum(v for b, v in zip(buckets, values)
                                   if column != "at_peak" or b == peak_bucket[pid])
        assert got == [s[column] for s in data["sites"]], column
        assert sum(got) > 0 or column == "leaked_bytes"     # (this program frees everything)
    # Bytes live at the peak, by call site, add up to the peak (in the process that reached it).
    assert data["flame"]["top_down"]["values"]["at_peak"][0] == s["peak_live_bytes"]
    peak = max(max(p["live_max"]) for p in data["processes"])
    assert peak == s["peak_live_bytes"]


def test_diff_and_cli(recorded, tmp_path, cli):
    d, _ = recorded
    done = cli("report", d / "churn.trace", "--diff", d / "churn.trace", "-o", tmp_path / "r.html")
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stderr and (tmp_path / "r.html").stat().st_size > 1_000_000
    trace = heapcast.load(d / "churn.trace")
    a = build(trace)
    same = diff_section(a, a, "x")
    assert all(r["d_bytes"] == 0 and r["d_count"] == 0 for r in same["sites"])
    assert same["this"] == same["other_summary"]
    bad = cli("report", tmp_path / "missing.trace")
    assert bad.returncode == 2 and "missing.trace" in bad.stderr and "Traceback" not in bad.stderr


def test_model_and_lab_sections(recorded, tmp_path, cli):
    """--model (an n-gram trained on the first part, scored on the held-out rest) and --lab."""
    d, _ = recorded
    model = tmp_path / "ngram.safetensors"
    done = cli("train", d / "churn.trace", "--model", "ngram", "--split", "time", "-o", model)
    assert done.returncode == 0, done.stderr
    from heapcast.report.forecast import model_section
    from heapcast.report.sections import lab_section
    trace = heapcast.load(d / "churn.trace")
    sec = model_section(model, trace)
    (r,) = sec["results"]
    evaluated = json.loads(cli("evaluate", model, d / "churn.trace", "--protocol", "time",
                               "--json").stdout)
    assert (r["protocol"], r["events"]) == ("time", evaluated["events"])
    assert r["top1"] == pytest.approx(evaluated["top1"]) and r["top5"] == pytest.approx(evaluated["top5"])
    hits = [t for t in r["over_time"]["top1"] if t is not None]
    assert len(hits) == min(100, r["events"]) and min(hits) <= r["top1"] <= max(hits)
    # a compiled POLICY scores through the native runtime, as heapcast evaluate POLICY does
    policy = tmp_path / "ngram.table"
    assert cli("compile", model, "--kind", "table", "-o", policy).returncode == 0
    (p,) = model_section(policy, trace)["results"]
    native = json.loads(cli("evaluate", policy, d / "churn.trace", "--protocol", "time",
                            "--json").stdout)
    assert p["model"] == "policy:table" and p["events"] == native["events"]
    assert p["top1"] == pytest.approx(native["top1"])
    # the model and its policy read the same features: built once for both (once the results
    # that `heapcast evaluate` kept in the trace's directory are gone: test_results_cache.py)
    shutil.rmtree(d / "churn.trace" / ".cache")
    from heapcast.forecast import dataset
    real, built = dataset.featurize, []
    dataset.featurize = lambda *a, **k: built.append(a) or real(*a, **k)
    try:
        both = model_section([model, policy], trace)["results"]
    finally:
        dataset.featurize = real
    assert len(built) == 1 and [b["top1"] for b in both] == [r["top1"], p["top1"]]
    lab = lab_section(trace)
    assert {"first-fit", "best-fit", "buddy"} <= set(lab["policies"])
    assert len(lab["series"]) == 2 and all(len(s["t"]) == len(s["live"]) for s in lab["series"])
    # (a POLICY given to the command was refused as "not a heapcast forecasting model")
    done = cli("report", d / "churn.trace", "--model", model, "--model", policy, "--lab",
               "-o", tmp_path / "m.html")
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "m.html").read_text()
    assert '"model":{"results"' in html and '"lab":{"policies"' in html
    assert '"model":"policy:table"' in html


def test_a_model_the_protocol_refuses_is_refused_before_the_work(recorded, tmp_path, cli,
                                                                monkeypatch):
    """A model trained on the whole recording cannot be scored on it: refused from the metadata,
    before the page's pass or any feature is built, saying what to do (it named the cross-run
    protocol, which the user had not asked for)."""
    d, _ = recorded
    model = tmp_path / "whole.safetensors"
    assert cli("train", d / "churn.trace", "--model", "ngram", "-o", model).returncode == 0
    import importlib
    from heapcast.forecast import dataset
    from heapcast.forecast.modelfile import ModelError
    from heapcast.report import report

    def no_work(*a, **k):
        raise AssertionError("work done before the refusal")
    monkeypatch.setattr(importlib.import_module("heapcast.report.data"), "build", no_work)
    monkeypatch.setattr(dataset, "featurize", no_work)
    with pytest.raises(ModelError, match="trained on the whole of .*--split time"):
        report(d / "churn.trace", output=tmp_path / "r.html", model=model)
    assert not (tmp_path / "r.html").exists()
    monkeypatch.undo()
    done = cli("report", d / "churn.trace", "--model", model, "-o", tmp_path / "r.html")
    assert done.returncode == 2 and "none of its events left" in done.stderr
    assert "cross-run" not in done.stderr and "Traceback" not in done.stderr


def test_mapped_bytes_over_time_with_mmap():
    """Recorded with --mmap: the memory chart's mmap'd bytes follow mmap, munmap and mremap."""
    import numpy as np
    from heapcast.trace.format import EVENT_DTYPE, OP
    from heapcast.trace.model import Process, Trace
    rows = [("mmap", 0x10000, 0, 12288, 0), ("malloc", 0x500, 0, 100, 0),
            ("munmap", 0, 0x10000, 4096, 0), ("munmap", 0, 0x90000, 4096, 1),   # failed: no change
            ("mremap", 0x20000, 0x11000, 16384, 8192), ("mmap", 0, 0, 4096, 0)]  # failed mmap
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, (op, addr, old, size, arg) in enumerate(rows):
        ev[i]["op"], ev[i]["addr"], ev[i]["old_addr"], ev[i]["size"], ev[i]["arg"] = OP[op], addr, old, size, arg
    ev["seq"], ev["ts"] = np.arange(len(rows)), 10 ** 9 + np.arange(len(rows)) * 1000
    p = Process(index=0, pid=7, _events=ev, event_count=len(ev), mmap_recorded=True, start_ns=10 ** 9)
    d = build(Trace("mem://mmap", processes=[p]))
    assert d["processes"][0]["mapped"] == [12288, 12288, 8192, 8192, 16384, 16384]
    assert d["summary"]["ops"]["mremap"] == 1 and d["summary"]["peak_live_bytes"] == 100


def test_empty_trace_page_renders(tmp_path):
    """A trace with no event (a program that never allocated) still gives a working page."""
    import numpy as np
    from heapcast.trace.format import EVENT_DTYPE
    from heapcast.trace.model import Process, Trace
    trace = Trace(tmp_path / "empty.trace",
                  processes=[Process(index=0, pid=5, _events=np.zeros(0, EVENT_DTYPE))])
    out = heapcast.report(trace, output=tmp_path / "empty.html")
    dom, console, requests = open_page(out, tmp_path)
    assert 'data-rendered="yes"' in dom and console == [] and requests == []
    assert ">0<" in dom[dom.index('id="cards"'):dom.index('id="ops"')]


PY_SCRIPT = Path(__file__).parent / "programs" / "python" / "lines.py"


@pytest.mark.skipif(sys.version_info[:2] != (3, 11) or hasattr(sys, "gettotalrefcount"),
                    reason="Python frames are read from CPython 3.11 release builds")
def test_python_trace_page_names_the_scripts_lines(tmp_path):
    """A CPython program's page names its Python frames as file:line function: in the call-site
    table (file:line, "python"), in the flame graph's labels, and in the data's own lines."""
    lines = {m.group(1): i for i, text in enumerate(PY_SCRIPT.read_text().splitlines(), 1)
             if (m := re.search(r"# at: (\w+)", text))}
    r = heapcast.record([sys.executable, PY_SCRIPT, "basic"], output=tmp_path / "py.trace",
                        progress=False)
    assert r.exit_code == 0
    trace = heapcast.load(r.path)
    data = build(trace)
    big = f"{PY_SCRIPT}:{lines['dict_big']}"
    (row,) = [s for s in data["sites"] if s["python"] and f"{s['module']}:{s['offset']}" == big]
    assert row["function"] == "dict_growth" and row["bytes"] >= 100_004
    labels = set(data["flame"]["top_down"]["labels"]) | set(data["flame"]["bottom_up"]["labels"])
    assert f"{big} dict_growth" in labels
    assert f"{PY_SCRIPT}:{lines['listcomp']} listcomp.<locals>.<listcomp>" in labels
    own = {(s["module"], s["offset"]) for s in data["summary"]["top_program_lines_by_bytes"]}
    assert (str(PY_SCRIPT), lines["dict_big"]) in own
    # Time-range filtering still maps every table row's allocations (Python rows included).
    ranged = {int(k): sum(v[1]) for per in data["site_ranges"].values()
              for k, v in per["count"].items()}
    assert ranged[data["sites"].index(row)] == row["count"]

    out = heapcast.report(r.path, output=tmp_path / "py.html")
    dom, console, requests = open_page(out, tmp_path)
    assert console == [] and requests == [] and 'data-rendered="yes"' in dom
    table = dom[dom.index('id="sites"'):]
    assert f">{big}<" in table and ">python<" in table and ">dict_growth<" in table
    own_table = dom[dom.index('id="own-lines"'):]
    assert f">{big}<" in own_table[:own_table.index("</table>")]
    # The flame graph draws the outermost frame, the script's <module>, as file:line function.
    assert re.search(rf">{re.escape(str(PY_SCRIPT))}:\d+ &lt;module&gt;<", dom)


def trained_on_held_part(trace: Path, model: Path, *options: str) -> Path:
    """An n-gram trained on the first part of `trace` (--split time), written to `model`."""
    assert main(["train", str(trace), "--model", "ngram", "--split", "time", *options,
                 "-o", str(model), "-q"]) == 0
    return model


def test_a_model_file_is_checked_from_its_header_and_read_once(recorded, tmp_path, monkeypatch):
    """report() checks each model file before the page's pass from its header (a truncated one
    is refused there), and reads its tensors once, to predict (it read them twice: a GB-sized
    n-gram loaded for the check and again for the predictions)."""
    d, _ = recorded
    trace = d / "churn.trace"
    model = trained_on_held_part(trace, tmp_path / "held.safetensors")
    import importlib
    import heapcast.forecast.models as models
    from heapcast.forecast.modelfile import ModelError
    from heapcast.report import report
    data = importlib.import_module("heapcast.report.data")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(model.read_bytes()[:-7])

    def no_work(*a, **k):
        raise AssertionError("work done before the refusal")
    with monkeypatch.context() as m:
        m.setattr(data, "build", no_work)
        with pytest.raises(ModelError, match="truncated"):
            report(trace, output=tmp_path / "r.html", model=cut)
    shutil.rmtree(trace / ".cache", ignore_errors=True)   # (no evaluation kept to reuse)
    real, reads = models.read_model_file, []
    monkeypatch.setattr(models, "read_model_file", lambda p: reads.append(p) or real(p))
    report(trace, output=tmp_path / "r.html", model=model)
    assert reads == [model] and '"model":{"results"' in (tmp_path / "r.html").read_text()


def test_a_second_report_takes_the_first_ones_predictions(recorded, tmp_path, monkeypatch):
    """A report that predicted a model's sample itself (no evaluation kept) keeps its result in
    the trace's .cache/: the next report of that trace and model predicts nothing and shows the
    same figures; another model file (other bytes) is predicted again."""
    d, _ = recorded
    trace = d / "churn.trace"
    model = trained_on_held_part(trace, tmp_path / "again.safetensors")
    import importlib
    from heapcast.report import report
    forecast = importlib.import_module("heapcast.report.forecast")
    shutil.rmtree(trace / ".cache", ignore_errors=True)   # (no evaluation kept to reuse)
    real, calls = forecast.predictions, []
    monkeypatch.setattr(forecast, "predictions", lambda *a, **k: calls.append(a[0]) or real(*a, **k))

    def section(name):
        html = report(trace, output=tmp_path / name, model=model).read_text()
        return html[html.index('"model":{"results"'):][:2000]
    first = section("1.html")
    assert calls == [model]
    assert section("2.html") == first and calls == [model]
    other = trained_on_held_part(trace, tmp_path / "other.safetensors", "--set", "orders=[1,2]")
    report(trace, output=tmp_path / "3.html", model=other)
    assert calls == [model, other]
