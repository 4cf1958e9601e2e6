// lumos dashboard: a read-only single page over the server's JSON endpoints.
// Every stored string reaches the page as a text node (el() below), never parsed as HTML.
"use strict";

const POLL_MS = 3000;
const MAX_CHARTS = 12;
let timer = null;
let lastBody = null;
let sortState = { key: "started_at", dir: -1 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "href") node.setAttribute("href", v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(5);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function fmtDuration(s) {
  if (s === null || s === undefined) return "";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(2) + " h";
}

function fmtBytes(b) {
  if (b === null || b === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + " " + units[i];
}

function fmtBest(best) {
  if (!best) return "";
  return best.metric + "=" + fmt(best.value) + (best.mode ? " (" + best.mode + ")" : "");
}

function statusCell(s) { return el("td", { class: "status status-" + s }, s); }

function link(kind, rel, text) {
  return el("a", { href: "#/" + kind + "/" + encodeURIComponent(rel) }, text);
}

function table(headers, rows, id) {
  const head = el("tr", {}, headers.map((h) => el("th", {}, h)));
  return el("table", id ? { id } : {}, el("thead", {}, head), el("tbody", {}, rows));
}

function setView(title, ...nodes) {
  const app = document.getElementById("app");
  app.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined));
  document.getElementById("where").textContent = title;
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

// -- the storage root ------------------------------------------------------------------

function rootRows(rows, filter) {
  const f = filter.toLowerCase();
  const shown = rows.filter((r) =>
    [r.name, r.kind, r.status, r.path].some((v) => String(v || "").toLowerCase().includes(f)));
  const key = sortState.key;
  shown.sort((a, b) => {
    const x = a[key] ?? "", y = b[key] ?? "";
    return (x < y ? -1 : x > y ? 1 : 0) * sortState.dir;
  });
  return shown.map((r) => el("tr", { class: "run-row" },
    el("td", {}, r.status === "unreadable" ? r.name : link(r.kind === "sweep" ? "sweep" : "run", r.rel, r.name)),
    el("td", {}, r.kind), statusCell(r.status), el("td", {}, r.started_at || ""),
    el("td", {}, fmtDuration(r.duration_s)), el("td", {}, fmt(r.reports)),
    el("td", {}, fmtBest(r.best) || r.note || ""), el("td", { class: "muted" }, r.path)));
}

function renderRoot(doc) {
  if (doc.single && doc.rows.length === 1) {
    const r = doc.rows[0];
    location.hash = "#/" + (r.kind === "sweep" ? "sweep" : "run") + "/";
    return;
  }
  const keys = ["name", "kind", "status", "started_at", "duration_s", "reports", "best", "path"];
  const labels = ["name", "kind", "status", "started", "duration", "steps", "best metric", "path"];
  const filter = el("input", { id: "filter", placeholder: "filter by name, kind, status" });
  const tbody = el("tbody", {});
  const redraw = () => tbody.replaceChildren(...rootRows(doc.rows, filter.value));
  filter.addEventListener("input", redraw);
  const head = el("tr", {}, labels.map((label, i) => el("th", {
    onclick: () => {
      sortState = { key: keys[i], dir: sortState.key === keys[i] ? -sortState.dir : 1 };
      redraw();
    },
  }, label)));
  redraw();
  setView(doc.root, el("h1", {}, "Runs and sweeps"), el("p", { class: "muted" }, doc.root),
    filter, el("table", { id: "runs" }, el("thead", {}, head), tbody),
    doc.rows.length ? null : el("p", {}, "no runs here yet"));
}

// -- charts ------------------------------------------------------------------------------

function markerPlugin(markers) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        for (const m of markers) {
          const x = u.valToPos(m.step, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = m.kind === "rollback" ? "#c62828" : "#e65100";
          ctx.setLineDash(m.kind === "rollback" ? [] : [5, 4]);
          ctx.lineWidth = 2;
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

const COLORS = ["#1e88e5", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41", "#3949ab"];

function chart(title, xs, series, markers, xLabel) {
  const box = el("div", { class: "chart" }, el("h3", {}, title));
  const opts = {
    width: 440, height: 230, plugins: [markerPlugin(markers || [])],
    scales: { x: { time: false } },
    axes: [{ label: xLabel }, {}],
    series: [{ label: xLabel }].concat(series.map((s, i) => ({
      label: s.label, stroke: COLORS[i % COLORS.length], spanGaps: true, points: { show: xs.length < 60 },
    }))),
  };
  const plot = new uPlot(opts, [xs].concat(series.map((s) => s.values)), box);
  box.plot = plot;
  return box;
}

function metricCharts(metrics) {
  const names = Object.keys(metrics.series);
  // a long history comes thinned: x holds the steps kept (every bucket's extremes)
  const xs = metrics.x || Array.from({ length: metrics.steps }, (_, i) => i);
  return names.slice(0, MAX_CHARTS).map((name) =>
    chart(name, xs, [{ label: name, values: metrics.series[name] }], metrics.markers, "step"));
}

// -- a run -------------------------------------------------------------------------------

function timeline(attempts) {
  const total = attempts.reduce((s, a) => s + (a.duration_s || 1), 0) || 1;
  return el("div", { class: "timeline", id: "timeline" }, attempts.map((a) => el("div", {
    class: "bar-" + a.status, title: "attempt " + a.index + ": " + a.status + (a.error ? " — " + a.error : ""),
    "data-width": ((a.duration_s || 1) / total * 100).toFixed(2),
  })));
}

function failureText(f) {
  const where = f.rank >= 0 ? "rank " + f.rank : "group";
  const node = f.node_ip || f.node_id;
  return where + (node ? " on node " + node : "") + (f.pid ? ", pid " + f.pid : "") +
    (f.kind ? " · " + f.kind : "") + (f.error_type ? " · " + f.error_type : "") +
    (f.preempted ? " · preempted" : "");
}

function workersText(workers) {
  return workers.map((w) => w.rank + ": " + (w.node_ip || w.node_id || "?")).join(", ");
}

// the time of an ISO 8601 UTC stamp (the full stamp is the cell's title)
function clock(iso) { return iso ? iso.slice(11) : ""; }

function attemptsTable(attempts) {
  return table(["#", "status", "ended by", "started", "ended", "duration", "how it started", "resumed at step",
    "rank", "node", "failures", "workers", "error"],
    attempts.map((a) => el("tr", { class: "attempt-row" }, el("td", {}, a.index), statusCell(a.status),
      el("td", { class: "ended-by" }, a.ended_by || ""),
      el("td", { title: a.started_at || "" }, clock(a.started_at)), el("td", { title: a.ended_at || "" }, clock(a.ended_at)),
      el("td", {}, fmtDuration(a.duration_s)),
      el("td", { class: "restart" }, a.restart), el("td", {}, fmt(a.resume_report)),
      el("td", { class: "rank" }, fmt(a.rank)), el("td", { class: "node" }, a.node || ""),
      el("td", { class: "failures" }, (a.failures || []).filter((f) => f.kind).map((f) => el("div", {}, failureText(f)))),
      el("td", { class: "workers muted" }, workersText(a.workers || [])),
      el("td", { class: "error-box" }, el("pre", {}, a.error || "")))), "attempts");
}

function hangsSection(run) {
  const hangs = run.attempts.filter((a) => a.hang);
  if (!hangs.length) return [];
  return [el("h2", {}, "Hangs (" + hangs.length + ")"), el("div", { id: "hangs" }, hangs.map((a) => {
    const h = a.hang;
    return el("div", { class: "hang" },
      el("p", {}, "attempt " + h.attempt + (h.stalled_s !== null && h.stalled_s !== undefined ? ": stalled " + fmtDuration(h.stalled_s) : "")),
      el("ul", {}, h.culprits.map((c) => el("li", { class: "culprit" },
        "rank " + c.rank + " on node " + (c.node || "?") + " stuck at " + (c.where || "?") + (c.why ? " (" + c.why + ")" : "")))),
      el("p", {}, "stacks: ", h.stacks_ranks.map((r) =>
        el("a", { class: "stacks-link", href: "#/stacks/" + encodeURIComponent(run.rel) + "/" + h.attempt + "/" + r }, "rank " + r + " "))),
      el("p", { class: "muted" }, h.folder));
  }))];
}

function checkpointsTable(cps) {
  return table(["checkpoint", "report", "status", "kept", "metrics", "validation error", "size", "path"],
    cps.map((c) => el("tr", { class: "checkpoint-row" + (c.status === "deleted" ? " checkpoint-deleted" : "") },
      el("td", {}, c.dir_name + (c.latest ? " (latest)" : "")),
      el("td", {}, c.report_index), el("td", {}, c.status), el("td", {}, c.kept),
      el("td", {}, el("pre", {}, JSON.stringify(c.metrics))), el("td", {}, c.validation_error || ""),
      el("td", {}, fmtBytes(c.size_bytes)), el("td", { class: "muted" }, c.uri))), "checkpoints");
}

function rollbacksTable(rbs) {
  return table(["#", "check", "reason", "fired at report", "back to", "rolled back", "at"],
    rbs.map((r) => el("tr", { class: "rollback-row" }, el("td", {}, r.number), el("td", {}, r.check),
      el("td", {}, r.reason), el("td", {}, r.from_report), el("td", {}, r.to_checkpoint || "the start"),
      el("td", {}, r.rolled_back.join(", ")), el("td", {}, r.at || ""))), "rollbacks");
}

function renderRun(run, metrics) {
  const markers = el("ul", { class: "markers", id: "markers" }, metrics.markers.map((m) =>
    el("li", { class: "marker-" + m.kind }, m.kind + " at step " + m.step + ": " + m.label)));
  const nested = run.nested.length ? [el("h2", {}, "Nested runs"),
    el("ul", {}, run.nested.map((n) => el("li", {}, link("run", n.rel, n.name))))] : [];
  const tl = timeline(run.attempts);
  const deleted = run.deleted_checkpoints || [];
  setView(run.path, el("h1", { id: "run-name" }, run.name),
    el("p", {}, el("span", { class: "status status-" + run.status, id: "run-status" }, run.status),
      " · " + run.attempts.length + " attempt(s) · " + run.reports + " report(s) · " +
      run.checkpoints.length + " checkpoint(s) · " + fmtDuration(run.duration_s)),
    el("h2", {}, "Attempts"), tl, attemptsTable(run.attempts), hangsSection(run),
    el("h2", {}, "Metrics"), el("div", { class: "charts", id: "charts" }, metricCharts(metrics)), markers,
    el("h2", {}, "Checkpoints (" + run.checkpoints.length + (deleted.length ? ", " + deleted.length + " deleted" : "") + ")"),
    checkpointsTable(run.checkpoints.concat(deleted).sort((a, b) => a.report_index - b.report_index)),
    el("h2", {}, "Rollbacks (" + run.rollbacks.length + ")"), rollbacksTable(run.rollbacks),
    el("h2", {}, "Config"), el("pre", { id: "config" }, JSON.stringify(run.config, null, 1)), nested);
  for (const bar of tl.children) bar.style.flexGrow = bar.getAttribute("data-width");
}

// -- a sweep -----------------------------------------------------------------------------

function bestSoFar(trials, metric, mode) {
  const done = trials.filter((t) => typeof t.last_result[metric] === "number");
  done.sort((a, b) => a.number - b.number);
  let best = null;
  const xs = [], ys = [], own = [];
  for (const t of done) {
    const v = t.last_result[metric];
    best = best === null ? v : mode === "max" ? Math.max(best, v) : Math.min(best, v);
    xs.push(t.number); ys.push(best); own.push(v);
  }
  return chart("best " + metric + " so far", xs,
    [{ label: "best so far", values: ys }, { label: "trial's " + metric, values: own }], [], "trial");
}

function trialCurves(trials, metric) {
  const len = Math.max(0, ...trials.map((t) => (t.curves[metric] || []).length));
  const xs = Array.from({ length: len }, (_, i) => i + 1);
  const series = trials.filter((t) => t.curves[metric]).map((t) => ({
    label: t.name + " (" + t.status + ")",
    values: xs.map((_, i) => (i < t.curves[metric].length ? t.curves[metric][i] : null)),
  }));
  return chart(metric + " per trial (pruned trials stop early)", xs, series, [], "iteration");
}

function renderSweep(sw) {
  const metric = (sw.metric || [])[0];
  const mode = (sw.mode || [])[0];
  const rows = sw.trials.map((t) => el("tr", { class: "trial-row" },
    el("td", {}, t.rel ? link("run", t.rel, t.name) : t.name), el("td", {}, t.number), statusCell(t.status),
    el("td", { class: "trial-runs" }, (t.runs || []).map((r) => link("run", r.rel, r.name))),
    el("td", {}, el("pre", {}, JSON.stringify(t.config))), el("td", {}, t.iteration),
    el("td", { class: "trial-updated" }, t.updated_at || ""),
    el("td", {}, metric ? fmt(t.last_result[metric]) : ""),
    el("td", {}, metric && t.curves[metric] ? fmt((mode === "max" ? Math.max : Math.min)(...t.curves[metric].filter((v) => v !== null))) : ""),
    el("td", { class: "error-box" }, t.error ? t.error.type + ": " + t.error.message : "")));
  const charts = metric ? [bestSoFar(sw.trials, metric, mode), trialCurves(sw.trials, metric)] : [];
  setView(sw.path, el("h1", { id: "sweep-name" }, sw.name),
    el("p", {}, el("span", { class: "status status-" + sw.status }, sw.status),
      " · " + sw.num_trials + " trial(s): " + Object.entries(sw.counts).map(([k, v]) => v + " " + k).join(", ") +
      (metric ? " · " + mode + " " + metric : "")),
    el("p", { class: "muted" }, "Optuna's own dashboard: ", el("code", {}, sw.optuna_command)),
    el("h2", {}, "Trials"),
    table(["trial", "#", "status", "Train run", "parameters", "iterations", "updated", "last " + (metric || ""), "best " + (metric || ""), "error"], rows, "trials"),
    el("h2", {}, "Charts"), el("div", { class: "charts", id: "charts" }, charts));
}

function renderStacks(doc, rel) {
  setView(doc.uri, el("h1", {}, "Stacks of rank " + doc.rank + ", attempt " + doc.attempt),
    el("p", {}, link("run", rel, "back to the run")), el("p", { class: "muted" }, doc.uri),
    el("pre", { id: "stacks" }, doc.text));
  window.scrollTo(0, 0);
}

// -- routing and polling -----------------------------------------------------------------

async function getJSON(url) {
  const resp = await fetch(url, { cache: "no-store" });
  const text = await resp.text();
  const doc = JSON.parse(text);
  if (!resp.ok) throw new Error(doc.error || resp.statusText);
  return [doc, text];
}

async function load() {
  const hash = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  const [kind, ...rest] = hash.split("/");
  const rel = "?path=" + encodeURIComponent(rest.join("/"));
  try {
    if (kind === "run") {
      const [run, text] = await getJSON("/api/run" + rel);
      if (text !== lastBody) { lastBody = text; renderRun(run, run.metrics); }
    } else if (kind === "sweep") {
      const [sw, text] = await getJSON("/api/sweep" + rel);
      if (text !== lastBody) { lastBody = text; renderSweep(sw); }
    } else if (kind === "stacks") {
      const [attempt, rank] = rest.slice(-2);
      const where = "?path=" + encodeURIComponent(rest.slice(0, -2).join("/")) +
        "&attempt=" + encodeURIComponent(attempt) + "&rank=" + encodeURIComponent(rank);
      const [doc, text] = await getJSON("/api/stacks" + where);
      if (text !== lastBody) { lastBody = text; renderStacks(doc, rest.slice(0, -2).join("/")); }
    } else {
      const [doc, text] = await getJSON("/api/root");
      if (text !== lastBody) { lastBody = text; renderRoot(doc); }
    }
  } catch (err) {
    setView("error", el("p", { class: "error-box", id: "load-error" }, String(err.message || err)));
    lastBody = null;
  }
}

function route() {
  lastBody = null;
  clearInterval(timer);
  load();
  timer = setInterval(load, POLL_MS);
}

window.addEventListener("hashchange", route);
route();
