// Lockstep's live page: polls the worker's /overview every second, draws the topology as a
// layered graph (SVG), the tables' figures, small plots over time (uPlot) and the barriers.
"use strict";

const POLL_MS = 1000;
const KEEP = 600; // points per plot: ten minutes at one a second
const history = { t: [], tables: [], freshness: {}, e2e: {}, lag: {} };
const plots = {};
const $ = (sel) => document.querySelector(sel);
const seconds = (ms) => (ms === null || ms === undefined ? null : ms / 1000);
const fmt = (ms) => (ms === null || ms === undefined ? "–" : `${(ms / 1000).toFixed(1)} s`);

function text(tag, attrs, content) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (content !== undefined) el.textContent = content;
  return el;
}

function cells(row, values) {
  const tr = document.createElement("tr");
  values.forEach(([value, cls]) => {
    const td = document.createElement("td");
    td.textContent = value;
    if (cls) td.className = cls;
    tr.appendChild(td);
  });
  if (row) tr.dataset.table = row;
  return tr;
}

function writerOf(data, table) { // its running (or stalled) job, else the last one it had
  const jobs = Object.entries(data.jobs).filter(([, j]) => j.sink === table);
  return jobs.find(([, j]) => j.status === "RUNNING" || j.status === "STALLED") || jobs[jobs.length - 1];
}

function drawGraph(data) {
  // depth: topics 0, a table one more than its deepest source
  const depth = {};
  const sourcesOf = {};
  for (const [, job] of Object.entries(data.jobs)) {
    if (!(job.sink in data.tables)) continue;
    sourcesOf[job.sink] = job.sources.length ? job.sources : job.external_topics.map((t) => `topic:${t}`);
    job.external_topics.forEach((t) => { depth[`topic:${t}`] = 0; });
  }
  const depthOf = (name, seen = new Set()) => {
    if (name in depth) return depth[name];
    if (seen.has(name)) return 1;
    seen.add(name);
    const srcs = sourcesOf[name] || [];
    depth[name] = 1 + Math.max(0, ...srcs.map((s) => depthOf(s, seen)));
    return depth[name];
  };
  Object.keys(data.tables).forEach((t) => depthOf(t));
  const layers = [];
  Object.keys(depth).sort().forEach((n) => { (layers[depth[n]] = layers[depth[n]] || []).push(n); });
  const W = 240, H = 54, GX = 70, GY = 18;
  const pos = {};
  layers.forEach((names, x) => names.forEach((n, y) => { pos[n] = { x: 10 + x * (W + GX), y: 10 + y * (H + GY) }; }));
  const width = 20 + layers.length * (W + GX);
  const height = 20 + Math.max(1, ...layers.map((l) => (l ? l.length : 0))) * (H + GY);
  const svg = text("svg", { viewBox: `0 0 ${width} ${height}`, height, "data-testid": "graph" });
  for (const [sink, srcs] of Object.entries(sourcesOf)) {
    for (const s of srcs) {
      if (!pos[s] || !pos[sink]) continue;
      const a = { x: pos[s].x + W, y: pos[s].y + H / 2 }, b = { x: pos[sink].x, y: pos[sink].y + H / 2 };
      const mid = (a.x + b.x) / 2;
      svg.appendChild(text("path", { class: "edge", d: `M${a.x},${a.y} C${mid},${a.y} ${mid},${b.y} ${b.x},${b.y}` }));
    }
  }
  const bottleneckSink = data.bottleneck && data.jobs[data.bottleneck] ? data.jobs[data.bottleneck].sink : null;
  for (const [name, p] of Object.entries(pos)) {
    const g = text("g", { transform: `translate(${p.x},${p.y})` });
    if (name.startsWith("topic:")) {
      g.setAttribute("class", "node topic");
      g.appendChild(text("rect", { width: W, height: H }));
      g.appendChild(text("text", { x: 10, y: 22 }, name.slice(6)));
      g.appendChild(text("text", { x: 10, y: 40, class: "detail" }, "Kafka topic"));
    } else {
      const t = data.tables[name];
      const writer = writerOf(data, name);
      const status = writer ? writer[1].status : "none";
      g.setAttribute("class", `node table ${status}${name === bottleneckSink ? " bottleneck" : ""}`);
      g.dataset.table = name;
      g.appendChild(text("rect", { width: W, height: H }));
      g.appendChild(text("text", { x: 10, y: 20 }, name + (name === bottleneckSink ? "  ⚠ bottleneck" : "")));
      g.appendChild(text("text", { x: 10, y: 38, class: "detail freshness" },
        `fresh ${fmt(t.freshness_ms)} · lag ${t.lag_barriers ?? "–"} · E2E ${fmt(t.e2e_last_ms)}` +
        (t.stride ? ` · every ${t.stride.every}` : "")));
    }
    svg.appendChild(g);
  }
  $("#graph").replaceChildren(svg);
}

function drawTables(data) {
  const rows = Object.entries(data.tables).map(([name, t]) => {
    const writer = writerOf(data, name);
    const status = writer ? writer[1].status : "–";
    const job = writer ? writer[0] + (writer[1].fused_with ? ` (fused with ${writer[1].fused_with})` : "") : "–";
    const s = t.stride;
    const tr = cells(name, [[name], [t.kind], [job], [status, `status-${status}`],
      [fmt(t.freshness_ms), "num freshness"], [fmt(t.staleness_p50_ms), "num"],
      [`${fmt(t.e2e_last_ms)} / ${fmt(t.e2e_p50_ms)}`, "num"], [String(t.lag_barriers ?? "–"), "num"],
      [s ? `every ${s.every} barriers` : "every barrier", s ? "stride strided" : "stride"],
      [String(t.dead_letters), "num"]]);
    if (s) { // why: a table far slower than the rest commits at a stride, so it does not hold back the others
      tr.querySelector("td.stride").title = `its commit takes ${fmt(s.cost_ms)}, ` +
        `${(s.cost_ms / s.reference_ms).toFixed(1)}x the ${fmt(s.reference_ms)} the clock keeps without it`;
    }
    return tr;
  });
  $("#tables tbody").replaceChildren(...rows);
  const lineage = [];
  for (const [table, columns] of Object.entries(data.columns || {}).sort()) {
    if (columns === null) { lineage.push(cells(table, [[`${table}.*`], ["unknown (it reads a table not declared here)"]])); continue; }
    for (const [column, sources] of Object.entries(columns)) {
      lineage.push(cells(table, [[`${table}.${column}`], [sources.length ? sources.join(", ") : "(no source column)"]]));
    }
  }
  $("#columns tbody").replaceChildren(...lineage);
  const now = data.now_ms;
  $("#leases tbody").replaceChildren(...data.leases.map((l) =>
    cells(null, [[l.lease_id], [l.holder], [String(l.barrier)], [fmt(l.expires_at_ms - now), "num"]])));
  $("#rejections tbody").replaceChildren(...data.rejections.slice().reverse().map((r) =>
    cells(null, [[new Date(r.at_ms).toLocaleTimeString()], [r.command], [r.reason]])));
  $("#timeline").replaceChildren(...data.barriers.map((b) => {
    const s = document.createElement("span");
    s.className = b.committed >= b.of ? "done" : "";
    s.title = `barrier ${b.barrier} at ${new Date(b.ts_ms).toLocaleTimeString()}: ${b.committed} of ${b.of} tables`;
    s.textContent = String(b.barrier % 1000);
    return s;
  }));
}

function record(data) {
  const names = Object.keys(data.tables).sort();
  if (names.join() !== history.tables.join()) { // the tables changed: start the plots again
    Object.assign(history, { t: [], tables: names, freshness: {}, e2e: {}, lag: {} });
    names.forEach((n) => { history.freshness[n] = []; history.e2e[n] = []; history.lag[n] = []; });
    Object.keys(plots).forEach((k) => { plots[k].destroy(); delete plots[k]; });
  }
  history.t.push(data.now_ms / 1000);
  for (const n of names) {
    const t = data.tables[n];
    history.freshness[n].push(seconds(t.freshness_ms));
    history.e2e[n].push(seconds(t.e2e_last_ms));
    history.lag[n].push(t.lag_barriers ?? null);
  }
  if (history.t.length > KEEP) {
    history.t.shift();
    for (const n of names) { history.freshness[n].shift(); history.e2e[n].shift(); history.lag[n].shift(); }
  }
}

const COLOURS = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#2c7a7b", "#975a16", "#4a5568"];

function drawPlots() {
  if (typeof uPlot === "undefined") return; // the library is missing: scripts/setup fetches it
  for (const key of ["freshness", "e2e", "lag"]) {
    const series = [history.t, ...history.tables.map((n) => history[key][n])];
    if (!plots[key]) {
      const el = $(`#plot-${key}`);
      plots[key] = new uPlot({
        width: Math.max(380, el.clientWidth || 420), height: 180,
        series: [{}, ...history.tables.map((n, i) => ({ label: n, stroke: COLOURS[i % COLOURS.length], width: 1.5 }))],
        axes: [{}, { size: 50 }],
      }, series, el);
    } else {
      plots[key].setData(series);
    }
  }
}

async function poll() {
  try {
    const response = await fetch("/overview", { cache: "no-store" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    $("#error").hidden = true;
    const last = data.barriers.length ? data.barriers[data.barriers.length - 1] : null;
    $("#summary").textContent = `${Object.keys(data.tables).length} tables · ${Object.keys(data.jobs).length} jobs · ` +
      (last ? `barrier ${last.barrier} at ${new Date(last.ts_ms).toLocaleTimeString()}` : "no barrier yet") +
      (data.bottleneck ? ` · bottleneck ${data.bottleneck}` : "");
    record(data);
    drawGraph(data);
    drawTables(data);
    drawPlots();
  } catch (err) {
    $("#error").hidden = false;
    $("#error").textContent = `cannot read /overview: ${err.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
