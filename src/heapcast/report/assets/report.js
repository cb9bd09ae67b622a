// heapcast report: draws the page from the JSON in #heapcast-data with the inlined plotly.js.
"use strict";
const D = JSON.parse(document.getElementById("heapcast-data").textContent);
const S = D.summary;
const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"] };
const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#7048e8", "#c2255c", "#0b7285", "#e67700"];
let RANGE = null;   // [t0, t1] seconds selected on the memory chart, or null

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Math.abs(n), i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (n < 0 ? "-" : "") + (i ? v.toFixed(1) : v.toFixed(0)) + " " + u[i];
}
function num(n) { return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"); }
function dur(ns) {
  if (ns >= 1e9) return (ns / 1e9).toPrecision(3) + " s";
  if (ns >= 1e6) return (ns / 1e6).toPrecision(3) + " ms";
  if (ns >= 1e3) return (ns / 1e3).toPrecision(3) + " µs";
  return ns + " ns";
}
function secs(s) { return s === null || s === undefined ? "at exit (VmHWM)" : "at " + (s >= 0.1 ? s.toFixed(3) + " s" : dur(Math.round(s * 1e9))); }
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function esc(s) { return String(s).replace(/[&<>]/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]); }
function classLabel(c) { return c === 0 ? "0" : c === 1 ? "1" : (2 ** (c - 1)).toLocaleString("en-US") + "–" + (2 ** c - 1).toLocaleString("en-US"); }

// ---- summary -------------------------------------------------------------------------------
function card(k, v, w, bad) {
  return el("div", { class: "card" + (bad ? " bad" : "") }, el("div", { class: "k" }, k),
            el("div", { class: "v" }, v), el("div", { class: "w" }, w || ""));
}
function drawSummary() {
  const pl = S.peak_live, pr = S.peak_rss;
  const cards = document.getElementById("cards");
  cards.append(
    card("events", num(S.events), `${S.processes} process(es), ${S.threads} thread(s)`),
    card("duration", dur(S.duration_ns), S.stacks ? `stacks of ${S.stacks} frames` : "call sites only"),
    card("peak live (requested)", bytes(S.peak_live_bytes), `${secs(pl.seconds)}, pid ${pl.pid}, event ${num(pl.event_index)}`),
    card("peak RSS", bytes(S.peak_rss_bytes), pr.bytes ? `${secs(pr.seconds)}, pid ${pr.pid}` : "no samples"),
    card("never freed", bytes(S.leaked_bytes), `${num(S.leaked_blocks)} blocks`, S.leaked_blocks > 0),
    card("temporary allocations", num(S.temporary), "freed before the next allocation"),
    card("freed blocks", num(S.lifetimes.freed_blocks), `lifetime p50 ${dur(S.lifetimes.ns.p50)}, p99 ${dur(S.lifetimes.ns.p99)}` +
         (S.clock_every > 1 ? ` (clock read once in ${S.clock_every} events: times between readings estimated)` : "")),
    card("lost events", num(S.lost_events), S.truncated ? "trace TRUNCATED" : "trace complete", S.lost_events > 0 || S.truncated),
    card("unknown frees", num(S.unknown_frees), `double acquires ${num(S.double_acquires)}`, S.unknown_frees > 0 || S.double_acquires > 0),
  );
  const R = S.recording || {};
  if (R.wall_s !== undefined && R.after_exit_s !== undefined)   // session.json of `heapcast record`
    cards.append(card("recording", `${R.wall_s.toFixed(2)} s + ${R.after_exit_s.toFixed(2)} s`,
      "the program's run, then the wait after its end" +
      (R.converted_while_running !== undefined ? ` (${num(R.converted_while_running)} events converted while it ran)` : "")));
  const ops = document.getElementById("ops");
  const tr = el("tr"), tv = el("tr");
  for (const [k, v] of Object.entries(S.ops)) { tr.append(el("th", {}, k)); tv.append(el("td", {}, num(v))); }
  ops.append(tr, tv);
  const procs = document.getElementById("procs");
  procs.append(el("tr", {}, ...["pid", "parent", "events", "threads", "peak live", "peak RSS", "never freed", "lost", "program"].map(h => el("th", { class: h === "program" ? "t" : "" }, h))));
  for (const p of S.per_process) {
    const argv = (D.processes.find(q => q.pid === p.pid) || {}).argv || [];
    procs.append(el("tr", {}, el("td", {}, p.pid), el("td", {}, p.forked_from ? `${p.forked_from} (fork)` : p.ppid),
      el("td", {}, num(p.events)), el("td", {}, p.threads), el("td", {}, bytes(p.peak_live_bytes)),
      el("td", {}, bytes(p.peak_rss_bytes)), el("td", {}, bytes(p.leaked_bytes)), el("td", {}, num(p.lost_events)),
      el("td", { class: "t" }, argv.join(" ") || p.exe || "?")));
  }
}

// ---- memory over time ----------------------------------------------------------------------
function drawMemory() {
  const traces = [], ann = [];
  const many = D.processes.length > 1;
  D.processes.forEach((p, i) => {
    const c = COLORS[i % COLORS.length], sfx = many ? ` (pid ${p.pid})` : "";
    traces.push({ x: p.t, y: p.live_max, name: "live requested" + sfx, type: "scatter", mode: "lines",
                  line: { shape: "hv", color: c, width: 1.6 }, fill: "tozeroy", fillcolor: c + "22", hovertemplate: "%{x:.4f} s<br>live %{customdata}<extra></extra>",
                  customdata: p.live_max.map(bytes) });
    if (p.rss.length) traces.push({ x: p.rss_t, y: p.rss, name: "RSS" + sfx, type: "scatter", mode: "lines",
                  line: { color: c, width: 1.2, dash: "dot" }, hovertemplate: "%{x:.4f} s<br>RSS %{customdata}<extra></extra>",
                  customdata: p.rss.map(bytes) });
    if (p.mapped) traces.push({ x: p.t, y: p.mapped, name: "mmap'd" + sfx, type: "scatter", mode: "lines",
                  line: { shape: "hv", color: c, width: 1.2, dash: "dash" }, hovertemplate: "%{x:.4f} s<br>mmap'd %{customdata}<extra></extra>",
                  customdata: p.mapped.map(bytes) });
    traces.push({ x: p.t, y: p.alloc_rate, name: "allocations/s" + sfx, type: "scatter", mode: "lines",
                  line: { color: c, width: 1 }, yaxis: "y2", opacity: 0.7, showlegend: !many || i === 0,
                  hovertemplate: "%{x:.4f} s<br>%{y:.3s} allocations/s<extra></extra>" });
    for (const d of p.divergence) {
      ann.push({ x: d.t, y: Math.max(d.rss, d.live), yref: "y", text: d.kind === "rss_above"
        ? `RSS ${bytes(d.bytes)} above live` : `live ${bytes(d.bytes)} above RSS`, showarrow: true,
        arrowhead: 2, ax: 0, ay: -30, font: { size: 11, color: c } });
    }
  });
  const layout = {
    height: 520, margin: { l: 70, r: 20, t: 10, b: 40 }, hovermode: "x",
    legend: { orientation: "h", y: 1.06 }, annotations: ann,
    xaxis: { title: "seconds since the trace began", anchor: "y2" },
    yaxis: { title: "bytes", domain: [0.32, 1], tickformat: ".3~s", rangemode: "tozero" },
    yaxis2: { title: "alloc/s", domain: [0, 0.24], tickformat: ".2~s", rangemode: "tozero" },
    dragmode: "zoom",
  };
  Plotly.newPlot("mem", traces, layout, CONFIG);
  document.getElementById("mem").on("plotly_relayout", ev => {
    if (ev["xaxis.autorange"]) setRange(null);
    else if (ev["xaxis.range[0]"] !== undefined) setRange([ev["xaxis.range[0]"], ev["xaxis.range[1]"]]);
  });
  const why = document.getElementById("why");
  const parts = [];
  for (const p of D.processes) for (const d of p.divergence) {
    parts.push(d.kind === "rss_above"
      ? `pid ${p.pid} at ${d.t.toFixed(3)} s: RSS ${bytes(d.rss)} vs ${bytes(d.live)} live requested. The difference is memory the allocator holds (freed blocks it keeps, headers, rounding), the program's code, stacks and other mappings.`
      : `pid ${p.pid} at ${d.t.toFixed(3)} s: ${bytes(d.live)} live requested vs RSS ${bytes(d.rss)}. Pages that were allocated but never written (calloc'd memory, large untouched buffers) cost no RSS until written.`);
  }
  why.textContent = parts.join(" ");
}

function inRange(ts) {
  // Coarse buckets whose end lies in the selected range (all of them without a selection).
  return ts.map((t, i) => RANGE === null || (t >= RANGE[0] && (i === 0 ? t : ts[i - 1]) <= RANGE[1]));
}
function setRange(r) {
  RANGE = r;
  document.getElementById("range").textContent = r ? `time range ${r[0].toFixed(4)} – ${r[1].toFixed(4)} s (double-click the chart to reset)` : "whole run";
  drawSizes();
  drawLifetimes("ns", "life-ns", "ns");
  drawLifetimes("events", "life-events", "events");
  drawTable();
  drawFlame();
}

// ---- call sites ----------------------------------------------------------------------------
const METRIC_NAMES = { at_peak: "bytes live at the peak", count: "allocations", temporary: "temporary allocations", leaked_bytes: "bytes never freed" };
let METRIC = "at_peak", INVERTED = false;
function drawFlame() {
  const t = INVERTED ? D.flame.bottom_up : D.flame.top_down;
  let v = t.values[METRIC];
  const ranged = RANGE !== null && t.ranged.length > 0 &&
    (METRIC !== "at_peak" || D.processes.every(p => p.range_peak));
  if (ranged) {
    // allocations, temporary ones and bytes never freed: of the blocks allocated in the range;
    // bytes live at the peak: at the range's own peak (each process's highest bucket in it)
    v = new Array(t.ids.length).fill(0);
    const chosen = rangeSelection();
    for (const loc of t.ranged) {
      const d = loc.by[METRIC], { sel, peak } = chosen[loc.pid];
      if (!d) continue;
      let c = 0;
      if (METRIC === "at_peak") { const k = d[0].indexOf(peak); c = k >= 0 ? d[1][k] : 0; }
      else for (let k = 0; k < d[0].length; k++) if (sel[d[0][k]]) c += d[1][k];
      if (!c) continue;
      v[0] += c;
      for (const n of loc.nodes) v[n] += c;
    }
  }
  const keep = v.map((x, i) => x > 0 || i === 0);
  const pick = a => a.filter((_, i) => keep[i]);
  const fmt = METRIC === "at_peak" || METRIC === "leaked_bytes" ? bytes : num;
  const depth = new Map([["0", 0]]);
  t.ids.forEach((id, i) => { if (i) depth.set(id, depth.get(t.parents[i]) + 1); });
  const levels = Math.min(8, Math.max(...depth.values()) + 1);
  Plotly.react("flame", [{
    type: "icicle", ids: pick(t.ids), labels: pick(t.labels), parents: pick(t.parents), values: pick(v),
    branchvalues: "total", customdata: pick(v).map(fmt), maxdepth: 8,
    hovertemplate: "%{label}<br>%{customdata} (%{percentRoot:.1%} of all)<extra></extra>",
    texttemplate: "%{label}<br>%{customdata}", tiling: { orientation: "v", flip: INVERTED ? "" : "" },
    root: { color: "#eef2f8" }, pathbar: { visible: true },
  }], { height: Math.max(220, Math.min(600, 70 * levels + 40)), margin: { l: 4, r: 4, t: 4, b: 4 } }, CONFIG);
  document.getElementById("flame-title").textContent =
    `${METRIC_NAMES[METRIC]}${ranged ? " in the selected time range" : ""}, ${INVERTED ? "inverted (allocating function at the top, its callers below)" : "callers at the top, allocating call sites below"}; click a box to zoom in`;
}
function flameControls() {
  const box = document.getElementById("flame-controls");
  const buttons = {};
  for (const [m, label] of Object.entries(METRIC_NAMES)) {
    buttons[m] = el("button", { onclick: () => { METRIC = m; for (const b of Object.values(buttons)) b.classList.remove("on"); buttons[m].classList.add("on"); drawFlame(); } }, label);
    box.append(buttons[m]);
  }
  buttons[METRIC].classList.add("on");
  const inv = el("button", { onclick: () => { INVERTED = !INVERTED; inv.classList.toggle("on", INVERTED); drawFlame(); } }, "inverted");
  box.append(el("span", {}, " "), inv);
}

let SORT = "bytes", DESC = true;
const COLUMNS = [["function", "function", "t"], ["module", "module", "t"], ["offset", "offset", ""], ["count", "allocations", ""],
  ["bytes", "bytes allocated", ""], ["at_peak", "live at peak", ""], ["temporary", "temporary", ""],
  ["leaked_count", "never freed", ""], ["leaked_bytes", "bytes never freed", ""]];
// A Python call site's module is its file and its offset its line: shown as file:line.
function siteWhere(s) { return s.python ? `${s.module}:${s.offset}` : s.module; }
// Each process's selected coarse buckets, and the one holding its peak within the selection.
function rangeSelection() {
  const out = {};
  for (const p of D.processes) {
    const sel = inRange(p.range_t);
    let best = -1, peak = -1;
    (p.range_peak || []).forEach((x, i) => { if (sel[i] && x > best) { best = x; peak = i; } });
    out[p.pid] = { sel, peak };
  }
  return out;
}
// The filtered columns of the table in the selected range: allocations, temporary ones and bytes
// never freed of the blocks allocated in it, bytes live at its peak.
const RANGE_COLUMNS = ["count", "temporary", "leaked_bytes", "at_peak"];
function rangeValues() {
  if (RANGE === null || !D.site_ranges) return null;
  const out = Object.fromEntries(RANGE_COLUMNS.map(c => [c, new Array(D.sites.length).fill(0)]));
  const chosen = rangeSelection();
  for (const p of D.processes) {
    const per = D.site_ranges[String(p.pid)] || {}, { sel, peak } = chosen[p.pid];
    for (const c of RANGE_COLUMNS)
      for (const [r, [buckets, values]] of Object.entries(per[c] || {}))
        for (let k = 0; k < buckets.length; k++)
          if (c === "at_peak" ? buckets[k] === peak : sel[buckets[k]]) out[c][+r] += values[k];
  }
  return out;
}
function drawTable() {
  const q = document.getElementById("search").value.trim().toLowerCase();
  const ranged = rangeValues();
  let rows = D.sites.map((s, i) => ranged ? { ...s, ...Object.fromEntries(RANGE_COLUMNS.map(c => [c, ranged[c][i]])) } : s);
  if (q) rows = rows.filter(s => (s.function + " " + siteWhere(s)).toLowerCase().includes(q));
  if (ranged) rows = rows.filter(s => s.count > 0 || s.at_peak > 0);
  rows.sort((a, b) => {
    const x = a[SORT], y = b[SORT];
    const c = typeof x === "string" ? x.localeCompare(y) : x - y;
    return DESC ? -c : c;
  });
  const t = document.getElementById("sites");
  t.replaceChildren();
  t.append(el("tr", {}, ...COLUMNS.map(([k, h, c]) => el("th", { class: c, onclick: () => { DESC = SORT === k ? !DESC : true; SORT = k; drawTable(); } },
    h + (ranged ? (RANGE_COLUMNS.includes(k) ? " (in range)" : (c === "t" || k === "offset" ? "" : " (whole run)")) : "") + (SORT === k ? (DESC ? " ▾" : " ▴") : "")))));
  for (const s of rows.slice(0, 300)) {
    t.append(el("tr", {}, el("td", { class: "t" }, s.function), el("td", { class: "t" }, siteWhere(s)),
      el("td", {}, s.python ? "python" : "0x" + s.offset.toString(16)), el("td", {}, num(s.count)), el("td", {}, bytes(s.bytes)), el("td", {}, bytes(s.at_peak)),
      el("td", {}, num(s.temporary)), el("td", {}, num(s.leaked_count)), el("td", {}, bytes(s.leaked_bytes))));
  }
  document.getElementById("sites-note").textContent = `${rows.length.toLocaleString("en-US")} of ${D.sites.length.toLocaleString("en-US")} call sites` +
    (rows.length > 300 ? " (first 300 shown)" : "") + (RANGE && !D.site_ranges ? "; too many locations to filter by time range" : "");
}

// Python programs: the program's own lines under the allocations (by bytes; stats' table).
function drawOwnLines() {
  const lines = D.summary.top_program_lines_by_bytes || [];
  if (!lines.length) return;
  document.getElementById("own-lines-box").hidden = false;
  const t = document.getElementById("own-lines");
  t.append(el("tr", {}, ...["function", "line", "allocations", "bytes allocated"].map((h, i) => el("th", { class: i < 2 ? "t" : "" }, h))));
  for (const s of lines) t.append(el("tr", {}, el("td", { class: "t" }, s.function), el("td", { class: "t" }, siteWhere(s)),
    el("td", {}, num(s.count)), el("td", {}, bytes(s.bytes))));
}

// ---- sizes and lifetimes -------------------------------------------------------------------
let SIZE_BYTES = false;
function drawSizes() {
  let classes = D.size_classes.map(c => c.class);
  let counts = D.size_classes.map(c => SIZE_BYTES ? c.bytes : c.count);
  if (RANGE !== null) {
    const byClass = {};
    for (const p of D.processes) {
      const sel = inRange(p.range_t);
      for (const [c, row] of Object.entries(SIZE_BYTES ? p.class_bytes_by_range : p.class_by_range))
        byClass[c] = (byClass[c] || 0) + row.reduce((s, v, i) => s + (sel[i] ? v : 0), 0);
    }
    counts = classes.map(c => byClass[c] || 0);
  }
  const leak = Object.fromEntries(D.lifetimes.never_freed.map(c => [c.class, SIZE_BYTES ? c.bytes : c.count]));
  const fmt = SIZE_BYTES ? bytes : num;
  Plotly.react("sizes", [
    { type: "bar", x: classes.map(classLabel), y: counts, name: (SIZE_BYTES ? "bytes allocated" : "allocations") + (RANGE ? " in range" : ""),
      marker: { color: "#2f6fdb" }, customdata: counts.map(fmt), hovertemplate: "%{x} B<br>%{customdata}<extra></extra>" },
    { type: "bar", x: classes.map(classLabel), y: classes.map(c => leak[c] || 0), name: "never freed",
      marker: { color: "#d9480f" }, customdata: classes.map(c => fmt(leak[c] || 0)), hovertemplate: "%{x} B<br>never freed %{customdata}<extra></extra>" },
  ], { height: 380, barmode: "overlay", margin: { l: 70, r: 10, t: 10, b: 90 }, legend: { orientation: "h", y: 1.1 },
       xaxis: { title: "size class (bytes requested)", tickangle: -40 },
       yaxis: { title: SIZE_BYTES ? "bytes" : "blocks", type: "log", tickformat: ".2~s", dtick: 1 } }, CONFIG);
}
function drawLifetimes(key, div, unit) {
  const L = { ...D.lifetimes[key] };
  if (!L.classes.length) { document.getElementById(div).textContent = "no block was freed"; return; }
  const ranged = RANGE !== null && D.processes.every(p => p.life_by_range);
  if (ranged) {   // the blocks allocated in the selected time range (and freed)
    const row = new Map(L.classes.map((c, i) => [c, i])), lo = L.octaves[0];
    L.counts = L.counts.map(r => r.map(() => 0));
    for (const p of D.processes) {
      const sel = inRange(p.range_t), [b, c, o, n] = p.life_by_range[key];
      for (let k = 0; k < b.length; k++) if (sel[b[k]] && row.has(c[k])) L.counts[row.get(c[k])][o[k] - lo] += n[k];
    }
  }
  const x = L.octaves.map(o => o === 0 ? "0" : (unit === "ns" ? "≥" + dur(2 ** (o - 1)) : "≥" + (2 ** (o - 1)).toLocaleString("en-US")));
  Plotly.newPlot(div, [{ type: "heatmap", x, y: L.classes.map(c => classLabel(c) + " B"), z: L.counts.map(r => r.map(v => v ? Math.log10(v) : null)),
    customdata: L.counts, colorscale: "Viridis", hovertemplate: "size %{y}<br>lifetime %{x} " + (unit === "ns" ? "" : "events") + "<br>%{customdata:,} blocks<extra></extra>",
    colorbar: { title: "log10 blocks" } }],
    { height: 400, margin: { l: 150, r: 10, t: 30, b: 80 }, title: { text: (unit === "ns" ? "lifetime (time)" : "lifetime (events in between)") + (ranged ? ", blocks allocated in the time range" : ""), font: { size: 13 } },
      xaxis: { title: unit === "ns" ? "lifetime" : "events", tickangle: -40 }, yaxis: { title: "" } }, CONFIG);
}

// ---- optional sections ---------------------------------------------------------------------
function pct(v) { return v === null || v === undefined ? "—" : (100 * v).toFixed(2) + "%"; }
function drawModel() {
  const M = D.model; if (!M) return;
  document.getElementById("model-sec").hidden = false;
  const cards = document.getElementById("model-cards");
  for (const r of M.results) cards.append(card(`${r.model} (${r.task})`, pct(r.top1), `top-5 ${pct(r.top5)} on ${num(r.events)} events, ${r.protocol}`));
  const main = M.results[0];
  const pc = main.per_class;
  Plotly.newPlot("model-classes", [{ type: "bar", x: pc.map(c => c.name), y: pc.map(c => c.top1), name: "top-1", marker: { color: "#2f6fdb" } },
    { type: "bar", x: pc.map(c => c.name), y: pc.map(c => c.top5), name: "top-5", marker: { color: "#94b4ec" } }],
    { height: 340, barmode: "group", margin: { l: 50, r: 10, t: 10, b: 90 }, yaxis: { tickformat: ".0%", range: [0, 1] }, legend: { orientation: "h", y: 1.1 } }, CONFIG);
  const tr = M.results.map((r, i) => ({ x: r.over_time.position, y: r.over_time.top1, name: r.model, type: "scatter", mode: "lines", line: { color: COLORS[i] } }));
  Plotly.newPlot("model-time", tr, { height: 300, margin: { l: 50, r: 10, t: 10, b: 45 }, xaxis: { title: "position among the scored events", tickformat: ".0%" }, yaxis: { title: "top-1", tickformat: ".0%", range: [0, 1] } }, CONFIG);
  if (main.confusion) {
    const names = pc.map(c => c.name);
    Plotly.newPlot("model-confusion", [{ type: "heatmap", z: main.confusion, colorscale: "Blues", x: main.confusion_names, y: main.confusion_names }],
      { height: 360, margin: { l: 90, r: 10, t: 10, b: 90 }, xaxis: { title: "predicted" }, yaxis: { title: "true", autorange: "reversed" } }, CONFIG);
  }
}
function drawLab() {
  const L = D.lab; if (!L) return;
  document.getElementById("lab-sec").hidden = false;
  const tr = [];
  L.series.forEach((s, i) => {
    tr.push({ x: s.t, y: s.live, name: "live requested", legendgroup: "live", showlegend: i === 0, type: "scatter", mode: "lines", line: { color: "#222", width: 1.5 } });
    Object.entries(s.policies).forEach(([name, y], j) => tr.push({ x: s.t, y, name, legendgroup: name, showlegend: i === 0, type: "scatter", mode: "lines", line: { color: COLORS[j % COLORS.length], width: 1.2 } }));
  });
  Plotly.newPlot("lab-chart", tr, { height: 420, margin: { l: 70, r: 10, t: 10, b: 45 }, xaxis: { title: "seconds since the trace began" }, yaxis: { title: "footprint (bytes)", tickformat: ".3~s" }, legend: { orientation: "h", y: 1.1 } }, CONFIG);
  const t = document.getElementById("lab-table");
  t.append(el("tr", {}, ...["policy", "peak footprint", "fragmentation", "4 KiB pages at peak", "internal at peak", "external at peak", "events/s"].map(h => el("th", { class: h === "policy" ? "t" : "" }, h))));
  for (const [name, p] of Object.entries(L.policies))
    t.append(el("tr", {}, el("td", { class: "t" }, name), el("td", {}, bytes(p.peak_footprint_bytes)), el("td", {}, p.fragmentation ? p.fragmentation.toFixed(3) : "—"),
      el("td", {}, num(p.peak_pages_4k)), el("td", {}, bytes(p.internal_bytes_at_peak)), el("td", {}, bytes(p.external_bytes_at_peak)), el("td", {}, num(Math.round(p.events_per_s || 0)))));
}
function drawDiff() {
  const F = D.diff; if (!F) return;
  document.getElementById("diff-sec").hidden = false;
  document.getElementById("diff-other").textContent = F.other;
  const cards = document.getElementById("diff-cards");
  for (const [k, label, fmt] of [["events", "events", num], ["peak_live_bytes", "peak live", bytes], ["peak_rss_bytes", "peak RSS", bytes], ["leaked_bytes", "never freed", bytes], ["duration_ns", "duration", dur]]) {
    const a = F.this[k], b = F.other_summary[k], d = a - b;
    cards.append(card(label, fmt(a), `was ${fmt(b)} (${d >= 0 ? "+" : "−"}${fmt(Math.abs(d))}${b ? ", " + (d >= 0 ? "+" : "") + (100 * d / b).toFixed(1) + "%" : ""})`, d > 0 && k !== "events" && k !== "duration_ns"));
  }
  const cls = F.size_classes;
  Plotly.newPlot("diff-sizes", [{ type: "bar", x: cls.map(c => classLabel(c.class)), y: cls.map(c => c.this), name: "this trace", marker: { color: "#2f6fdb" } },
    { type: "bar", x: cls.map(c => classLabel(c.class)), y: cls.map(c => c.other), name: "other", marker: { color: "#adb5bd" } }],
    { height: 340, barmode: "group", margin: { l: 70, r: 10, t: 10, b: 90 }, yaxis: { type: "log", title: "allocations", dtick: 1, tickformat: ".2~s" }, xaxis: { tickangle: -40 }, legend: { orientation: "h", y: 1.1 } }, CONFIG);
  const t = document.getElementById("diff-table");
  t.append(el("tr", {}, ...["function", "module", "Δ bytes allocated", "Δ allocations", "Δ never freed", "this: bytes", "other: bytes"].map(h => el("th", { class: h === "function" || h === "module" ? "t" : "" }, h))));
  for (const s of F.sites) t.append(el("tr", {}, el("td", { class: "t" }, s.function), el("td", { class: "t" }, siteWhere(s)),
    el("td", {}, bytes(s.d_bytes)), el("td", {}, num(s.d_count)), el("td", {}, bytes(s.d_leaked_bytes)), el("td", {}, bytes(s.bytes)), el("td", {}, bytes(s.other_bytes))));
}

// ---- page ----------------------------------------------------------------------------------
drawSummary();
drawMemory();
flameControls();
drawFlame();
document.getElementById("search").addEventListener("input", drawTable);
drawTable();
drawOwnLines();
const sb = document.getElementById("size-bytes");
sb.addEventListener("click", () => { SIZE_BYTES = !SIZE_BYTES; sb.classList.toggle("on", SIZE_BYTES); drawSizes(); });
drawSizes();
drawLifetimes("ns", "life-ns", "ns");
drawLifetimes("events", "life-events", "events");
drawModel();
drawLab();
drawDiff();
// A link can carry a time range and the flame graph's measure:
// report.html#range=START,END (seconds), #metric=NAME, or #range=START,END&metric=NAME.
const linkMetric = location.hash.match(/metric=([a-z_]+)/);
if (linkMetric && METRIC_NAMES[linkMetric[1]]) {
  METRIC = linkMetric[1];
  document.querySelectorAll("#flame-controls button").forEach(b => b.classList.toggle("on", b.textContent === METRIC_NAMES[METRIC]));
  drawFlame();
}
const linked = location.hash.match(/range=([0-9.e+-]+),([0-9.e+-]+)/);
if (linked) {
  const r = [+linked[1], +linked[2]];
  Plotly.relayout("mem", { "xaxis.range": r });
  setRange(r);
}
document.body.dataset.rendered = "yes";
