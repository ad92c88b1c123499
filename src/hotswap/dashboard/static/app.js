// The hotswap dashboard page: renders the server's document (/api/stream, server-sent events).
// Text only through textContent: nothing the cluster says is ever parsed as HTML.
"use strict";

const COLORS = ["#58a6ff", "#3fb950", "#d29922", "#f778ba", "#a371f7", "#79c0ff", "#ffa657", "#56d364"];
const SILENT_S = 3; // no message for this long: the server is gone, the data stale
let lastMessage = 0;
let doc = null;
let stepsPlot = null, stepsKey = "";
let goodputPlot = null;

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  return typeof value === "number" ? value.toFixed(digits === undefined ? 0 : digits) : String(value);
}

function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(1) + "%"; }

function clock(t) { return new Date(t * 1000).toISOString().substring(11, 19); }

function setStatus() {
  const status = document.getElementById("status");
  const silent = lastMessage && (Date.now() / 1000 - lastMessage) > SILENT_S;
  let cls = "live", text = "live";
  if (!doc) { cls = "connecting"; text = "connecting…"; }
  else if (silent) { cls = "error"; text = "stale: the dashboard server does not answer (showing the last data)"; }
  else if (doc.error) { cls = "error"; text = (doc.waiting_for ? "waiting for " + doc.waiting_for + ": " : "stale: ") + doc.error; }
  else if (doc.stale) { cls = "stale"; text = "stale: last read " + fmt(doc.age_s, 1) + " s ago"; }
  status.className = "status " + cls;
  status.textContent = text;
  document.body.classList.toggle("stale", cls !== "live");
}

function renderHeader(d) {
  const c = d.cluster;
  document.getElementById("cluster-name").textContent = c.name || "";
  const parts = [c.backend, c.num_slices + " × " + c.device_type];
  if (c.backing === "gpu") parts.push("GPU-backed");
  if (c.controller_pid) parts.push("controller pid " + c.controller_pid);
  if (c.gpu_health && c.gpu_health.message) parts.push(c.gpu_health.message);
  document.getElementById("cluster-info").textContent = parts.filter(Boolean).join(" · ");
  const cap = d.capacity;
  document.getElementById("capacity").textContent =
    cap.held + " held · " + cap.spare + " spare · " + cap.unhealthy + " unhealthy · " + cap.warm_workers + " warm worker(s) per slice";
}

function renderSlices(d) {
  const box = document.getElementById("slices");
  box.replaceChildren(...d.slices.map((s) => {
    const card = el("div", { class: "slice " + s.kind, "data-slice": s.name, "data-holder": s.holder || "" });
    card.append(el("div", { class: "name" }, s.name + (s.gpus ? " · " + s.gpus + " GPU" : "")));
    card.append(el("div", { class: "holder" }, s.holder || (s.kind === "spare" ? "spare" : "unhealthy")));
    const nodes = el("div", { class: "nodes" });
    for (const n of s.nodes) {
      nodes.append(el("span", { class: "node " + n.health.replace(" ", "-"), title: n.name + ": " + n.health + (n.reason ? " (" + n.reason + ")" : "") }));
    }
    card.append(nodes);
    return card;
  }));
}

function renderQueue(d) {
  const body = document.querySelector("#queue tbody");
  body.replaceChildren(...d.queue.map((q) => {
    const row = el("tr", { "data-queued": q.name });
    row.append(el("td", {}, q.position), el("td", {}, q.name), el("td", {}, q.priority), el("td", { class: "reason" }, q.reason));
    return row;
  }));
  document.getElementById("queue-empty").hidden = d.queue.length > 0;
  document.getElementById("queue-table").hidden = d.queue.length === 0;
}

function renderWorkloads(d) {
  const body = document.querySelector("#workloads tbody");
  body.replaceChildren(...d.workloads.map((w) => {
    const row = el("tr", { "data-workload": w.name });
    // One cause a line, largest first. Status, slices, badput and run id wrap, so that the table
    // fits a laptop's width with every column seen whole.
    const badput = el("td", { class: "wrap badput" });
    const causes = Object.entries(w.badput).sort((a, b) => b[1] - a[1]);
    badput.append(...causes.map(([k, v]) => el("div", {}, k.replace(/_/g, " ") + "\u00a0" + fmt(v * 100, 1) + "%")));
    if (!causes.length) badput.textContent = "–";
    row.append(
      el("td", {}, w.name),
      el("td", { class: "wrap st-" + w.status, title: w.status_message || "" }, w.xpk_status),
      el("td", {}, w.priority),
      el("td", { class: "wrap" }, w.slices.length ? w.slices.join(", ") : "–"),
      el("td", {}, fmt(w.step)),
      el("td", {}, fmt(w.steps_per_s, 2)),
      restartsCell(w),
      el("td", {}, w.preemptions),
      goodputCell(w),
      badput,
      el("td", { title: w.failures + " failure(s); MTTR: mean time from a failure to the first training step after it, from the workers' records" +
        (w.mttr_s === null ? " (none measured)" : "") }, w.mttr_s === null ? "–" : fmt(w.mttr_s, 2) + " s"),
      el("td", { class: "wrap run-id" }, w.run_id || "–"),
    );
    return row;
  }));
}

// Restarts as kubectl counts them: every restart, whatever its cause (attempt - 1); the ones
// charged against --max-restarts (the job's own failures) in brackets when they differ.
function restartsCell(w) {
  const all = Math.max((w.attempt || 0) - 1, w.restarts || 0);
  const text = all === w.restarts ? String(all) : all + " (" + w.restarts + " charged)";
  return el("td", { class: "restarts", title: "restarts of any cause: " + all + "; charged against --max-restarts (failures of the job itself): " +
    w.restarts + "; hotswaps, node failures, preemptions and evictions are not charged" }, text);
}

// Goodput is what the workers' step reports say: productive step time over the workload's
// slice-time. Without a reported step it cannot be told: "unknown", with the backend's reason.
function goodputCell(w) {
  if (w.goodput_unknown) {
    const cell = el("td", { class: "wrap unknown", title: "goodput unknown: " + (w.goodput_reason || "no training step was reported") });
    cell.append(el("div", {}, "unknown"), el("div", { class: "muted reason" }, w.goodput_reason || "no step reported"));
    return cell;
  }
  return el("td", { title: "productive training-step time over the workload's slice-time so far, from its workers' step reports" }, pct(w.goodput));
}

function renderEvents(d) {
  const list = document.getElementById("events");
  const items = d.events.slice().reverse().map((e) => {
    const li = el("li", { class: "cat-" + e.category });
    li.append(el("time", {}, clock(e.t)), document.createTextNode(e.workload + ": " + e.message));
    return li;
  });
  if (!items.length) items.push(el("li", { class: "muted" }, "No events yet."));
  list.replaceChildren(...items);
}

function chartWidth(id) { return Math.max(240, document.getElementById(id).clientWidth); }

function marksPlugin() {
  return {
    hooks: {
      draw: [(u) => {
        if (!doc) return;
        const ctx = u.ctx;
        ctx.save();
        for (const marks of Object.values(doc.marks)) {
          for (const m of marks) {
            const x = u.valToPos(m.t, "x", true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.strokeStyle = m.kind === "failure" ? "#f85149" : "#3fb950";
            ctx.lineWidth = 2 * devicePixelRatio;
            ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
          }
        }
        ctx.restore();
      }],
    },
  };
}

// Series on one time axis: every workload's step samples merged (gaps where it has none).
function alignSteps(steps) {
  const names = Object.keys(steps).sort();
  const times = [...new Set(names.flatMap((n) => steps[n].map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(times.map((t, i) => [t, i]));
  const data = [times];
  for (const n of names) {
    const ys = new Array(times.length).fill(null);
    for (const [t, s] of steps[n]) ys[index.get(t)] = s;
    data.push(ys);
  }
  return { names, data };
}

// Axis labels are page text, not canvas drawings: each y axis is as wide as its longest label
// (a "15,000" is never cut to "5,000"), x labels that would cross the chart's edge are left out,
// and the labels can be read (and checked) like the rest of the page.
const AXIS_FONT = "12px system-ui, -apple-system, 'Segoe UI', sans-serif";
const TICK = 5, GAP = 4;
const measurer = document.createElement("canvas").getContext("2d");
const wholeNumber = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const STEP_INCRS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9].map((p) => m * p)).sort((a, b) => a - b);

function textWidth(text) { measurer.font = AXIS_FONT; return measurer.measureText(text).width; }

// uPlot asks for the labels of its ticks: keep their text for the page, draw none on the canvas.
function keepLabels(index, format) {
  return (u, splits) => {
    u.pageLabels = u.pageLabels || [];
    u.pageLabels[index] = splits.map((v) => ({ v, text: v === null || v === undefined ? "" : format(v) }));
    return splits.map(() => "");
  };
}

function axes(yFormat, yIncrs) {
  const grid = { stroke: "#30363d" }, ticks = { stroke: "#30363d", size: TICK };
  const yWidth = (u) => TICK + GAP + Math.ceil(Math.max(0, ...((u.pageLabels || [])[1] || []).map((l) => textWidth(l.text)))) + 2;
  const y = { grid, ticks, gap: GAP, space: 30, values: keepLabels(1, yFormat), size: yWidth };
  if (yIncrs) y.incrs = yIncrs;
  return [{ grid, ticks, gap: GAP, space: 90, size: 26, values: keepLabels(0, clock) }, y];
}

function labelsPlugin() {
  return {
    hooks: {
      draw: [(u) => {
        const wrap = u.root.querySelector(".u-wrap");
        let box = wrap.querySelector(".axis-labels");
        if (!box) { box = el("div", { class: "axis-labels" }); wrap.append(box); }
        const ratio = devicePixelRatio || 1;
        const left = u.bbox.left / ratio, top = u.bbox.top / ratio, bottom = (u.bbox.top + u.bbox.height) / ratio;
        const [xs, ys] = u.pageLabels || [[], []];
        const spans = [];
        const xLabel = (text, x) => {
          const span = el("span", { class: "axis-label x" }, text);
          span.style.left = x + "px"; span.style.top = (bottom + TICK + 2) + "px";
          spans.push(span);
        };
        const named = (xs || []).filter((l) => l.text);
        for (const l of named) {
          const x = left + u.valToPos(l.v, "x"), half = textWidth(l.text) / 2;
          if (x - half >= 0 && x + half <= u.width) xLabel(l.text, x);
        }
        // A narrow chart of a short span can have every tick near an edge: the time axis still
        // gets one label, the tick nearest the middle, moved just inside the chart.
        if (!spans.length && named.length) {
          const middle = left + u.bbox.width / ratio / 2;
          const l = named.reduce((a, b) => Math.abs(left + u.valToPos(a.v, "x") - middle) <= Math.abs(left + u.valToPos(b.v, "x") - middle) ? a : b);
          const half = textWidth(l.text) / 2;
          xLabel(l.text, Math.min(Math.max(left + u.valToPos(l.v, "x"), half), u.width - half));
        }
        for (const l of ys || []) {
          if (!l.text) continue;
          const span = el("span", { class: "axis-label y" }, l.text);
          span.style.width = Math.max(0, left - TICK - GAP) + "px"; span.style.top = (top + u.valToPos(l.v, "y")) + "px";
          spans.push(span);
        }
        box.replaceChildren(...spans);
      }],
    },
  };
}

// A chart with no data says so instead of an empty axis.
function showChart(id, hasData, why) {
  const chart = document.getElementById(id);
  let note = document.getElementById(id + "-empty");
  if (!note) { note = el("p", { id: id + "-empty", class: "muted chart-empty" }); chart.before(note); }
  note.textContent = why;
  note.hidden = hasData;
  chart.hidden = !hasData;
}

function renderCharts(d) {
  const running = d.workloads.some((w) => w.status === "RUNNING");
  showChart("steps-chart", Object.keys(d.steps).length > 0,
    running ? "No training step reported yet." : "No training step reported: no workload is running.");
  showChart("goodput-chart", d.goodput.length > 0, "No goodput yet: no workload has reported a training step.");
  const { names, data } = alignSteps(d.steps);
  const key = names.join("\u0000");
  if (!stepsPlot || key !== stepsKey) {
    if (stepsPlot) stepsPlot.destroy();
    stepsKey = key;
    const series = [{}].concat(names.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { show: false } })));
    stepsPlot = new uPlot({ width: chartWidth("steps-chart"), height: 220, series, padding: [8, 12, 0, 0],
      axes: axes((v) => wholeNumber.format(v), STEP_INCRS), plugins: [marksPlugin(), labelsPlugin()] },
      names.length ? data : [[]], document.getElementById("steps-chart"));
  } else {
    stepsPlot.setData(data);
  }
  const gp = [d.goodput.map((p) => p[0]), d.goodput.map((p) => 100 * p[1])];
  if (!goodputPlot) {
    goodputPlot = new uPlot({
      width: chartWidth("goodput-chart"), height: 220, padding: [8, 12, 0, 0], axes: axes((v) => wholeNumber.format(v) + "%"),
      plugins: [labelsPlugin()],
      scales: { y: { range: [0, 100] } },
      series: [{}, { label: "goodput %", stroke: "#3fb950", width: 2, fill: "rgba(63,185,80,0.15)", points: { show: false } }],
    }, gp, document.getElementById("goodput-chart"));
  } else {
    goodputPlot.setData(gp);
  }
}

function render(d) {
  doc = d;
  renderHeader(d); renderSlices(d); renderQueue(d); renderWorkloads(d); renderEvents(d); renderCharts(d);
  setStatus();
}

function onMessage(event) {
  lastMessage = Date.now() / 1000;
  const d = JSON.parse(event.data);
  if (event.type === "state" || !doc || d.version !== doc.version) render(d);
  else { doc.age_s = d.age_s; doc.stale = d.stale; doc.error = d.error; setStatus(); }
}

function connect() {
  // EventSource reconnects by itself when the server comes back.
  const source = new EventSource("/api/stream");
  source.addEventListener("state", onMessage);
  source.addEventListener("ping", onMessage);
}

window.addEventListener("resize", () => {
  if (stepsPlot) stepsPlot.setSize({ width: chartWidth("steps-chart"), height: 220 });
  if (goodputPlot) goodputPlot.setSize({ width: chartWidth("goodput-chart"), height: 220 });
});
setInterval(setStatus, 1000);
connect();
