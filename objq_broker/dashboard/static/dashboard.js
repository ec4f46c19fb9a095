// objq dashboard: confirmations, the overview's live numbers and charts (inline SVG), and the
// workers page kept live.
"use strict";

const COLORS = ["#2456c9", "#c2410c", "#2e7d32", "#7b1fa2", "#00838f", "#b3261e", "#5d4037", "#455a64"];
const HISTORY = 120; // samples kept: 6 minutes at the default 3 s
const SVG = "http://www.w3.org/2000/svg";

document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

document.addEventListener("DOMContentLoaded", () => {
  const charts = document.getElementById("charts");
  if (charts) startOverview(charts);
  const workers = document.getElementById("workers-summary");
  if (workers) every(workers.dataset.source, showWorkers);
});

// Ask `source` for JSON every few seconds while the tab is visible, and hand each answer to
// `use`; a failed request is tried again at the next turn, and the page keeps what it shows.
function every(source, use) {
  const period = 1000 * Number(document.body.dataset.refreshSeconds || 3);
  async function poll() {
    if (!document.hidden) {
      try {
        const answer = await fetch(source, { headers: { Accept: "application/json" } });
        if (answer.ok) use(await answer.json());
      } catch (error) {
        // Tried again at the next turn.
      }
    }
    setTimeout(poll, period);
  }
  poll();
}

function startOverview(charts) {
  const samples = [];
  every(charts.dataset.source, (reading) => {
    samples.push(reading);
    if (samples.length > HISTORY) samples.shift();
    updateTable(reading);
    draw(samples);
  });
}

function when(at) {
  return new Date(at * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

// The workers page from `/api/workers`: the rows the server renders, built as text (names
// are never markup), at work first, then the gone.
function showWorkers(reading) {
  const workers = reading.workers;
  const since = (at) => (at == null ? null : Math.max(reading.read_at - at, 0));
  const ago = (at) => (at == null ? "-" : `${age(since(at))} ago`);
  const working = workers.filter((w) => w.status !== "gone").length;
  document.getElementById("read-at").textContent = when(reading.read_at);
  const summary = document.getElementById("workers-summary");
  summary.firstChild.textContent = `${number(working)} working, ${number(workers.length - working)} gone, as of `;
  summary.hidden = workers.length === 0;
  document.getElementById("workers").hidden = workers.length === 0;
  document.getElementById("no-workers").hidden = workers.length > 0;
  const rows = workers.map((w) => {
    const row = document.createElement("tr");
    row.dataset.owner = w.owner;
    row.dataset.status = w.status;
    row.className = `worker-${w.status}`;
    const status = document.createElement("span");
    status.className = `state state-${w.status}`;
    status.textContent = w.status;
    const queues = w.queues.flatMap((q, i) => {
      const link = document.createElement("a");
      link.href = `/queues/${encodeURIComponent(q)}?state=in-flight`;
      link.textContent = q;
      return i ? [", ", link] : [link];
    });
    const cells = [
      ["owner", [w.owner], "id"],
      ["host", [w.host || "-"]],
      ["pid", [w.pid == null ? "-" : String(w.pid)], "num"],
      ["framework", [w.framework || "-"]],
      ["status", [status]],
      ["queues", queues.length ? queues : ["-"]],
      ["jobs-held", [number(w.jobs_held)], "num"],
      ["oldest-held", [ago(w.oldest_claimed_at)]],
      ["last-seen", [(w.status === "gone" ? "leases ran out " : "") + ago(w.last_seen_at)]],
    ];
    for (const [field, content, className] of cells) {
      const td = document.createElement("td");
      td.dataset.field = field;
      if (className) td.className = className;
      td.append(...content);
      row.append(td);
    }
    return row;
  });
  document.querySelector("#workers tbody").replaceChildren(...rows);
}

function number(n) { return Number(n).toLocaleString("en-US"); }

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 120) return `${seconds.toFixed(0)} s`;
  if (seconds < 7200) return `${(seconds / 60).toFixed(0)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

function updateTable(reading) {
  for (const q of reading.queues) {
    const row = document.querySelector(`tr[data-queue="${CSS.escape(q.queue)}"]`);
    if (!row) continue; // a queue declared since the page loaded shows on reload
    for (const state of ["ready", "delayed", "in_flight", "dead"]) {
      const cell = row.querySelector(`[data-state="${state}"] a`);
      if (cell) cell.textContent = number(q[state]);
    }
    row.querySelector('[data-state="dead"]').classList.toggle("alert", q.dead > 0);
    row.querySelector('[data-state="oldest_ready_age_seconds"]').textContent = age(q.oldest_ready_age_seconds);
  }
  const readAt = document.getElementById("read-at");
  readAt.dataset.readAt = reading.read_at;
  readAt.textContent = when(reading.read_at);
  const version = document.querySelector('[data-fact="version"]');
  if (version) version.textContent = number(reading.version);
}

function draw(samples) {
  const times = samples.map((s) => s.read_at);
  const names = [...new Set(samples.flatMap((s) => s.queues.map((q) => q.queue)))];
  const depth = (s, name) => {
    const q = s.queues.find((x) => x.queue === name);
    return q ? q.ready + q.delayed + q.in_flight : 0;
  };
  const last = samples[samples.length - 1];
  const deepest = names.sort((a, b) => depth(last, b) - depth(last, a)).slice(0, COLORS.length);
  plot("depth-chart", "depth-legend", times, deepest.map((name, i) => ({
    label: name, color: COLORS[i], values: samples.map((s) => depth(s, name)),
  })));
  const rate = (field) => samples.map((s, i) => {
    if (i === 0) return null;
    const span = s.read_at - samples[i - 1].read_at;
    return span > 0 ? Math.max(0, (s[field] - samples[i - 1][field]) / span) : null;
  });
  plot("rate-chart", "rate-legend", times, [
    { label: "jobs enqueued/s", color: COLORS[0], values: rate("enqueued_total") },
    { label: "commits/s", color: COLORS[1], values: rate("version") },
  ]);
}

function plot(svgId, legendId, times, series) {
  const svg = document.getElementById(svgId);
  const [width, height, left, bottom, top] = [600, 180, 48, 18, 8];
  svg.replaceChildren();
  const values = series.flatMap((s) => s.values).filter((v) => v !== null);
  const high = Math.max(1, ...values);
  const start = times[0], span = Math.max(1, times[times.length - 1] - start);
  const x = (t) => left + ((t - start) / span) * (width - left - 4);
  const y = (v) => height - bottom - (v / high) * (height - bottom - top);
  add(svg, "line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom });
  add(svg, "line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom });
  add(svg, "text", { class: "label", x: left - 4, y: top + 8, "text-anchor": "end" }, compact(high));
  add(svg, "text", { class: "label", x: left - 4, y: height - bottom, "text-anchor": "end" }, "0");
  add(svg, "text", { class: "label", x: width - 2, y: height - 4, "text-anchor": "end" }, "now");
  add(svg, "text", { class: "label", x: left, y: height - 4 }, `${Math.round(span)} s ago`);
  for (const s of series) {
    const points = s.values.map((v, i) => (v === null ? null : `${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean);
    if (points.length) add(svg, "polyline", { points: points.join(" "), stroke: s.color });
  }
  const legend = document.getElementById(legendId);
  legend.replaceChildren(...series.map((s) => {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = s.color;
    const current = s.values[s.values.length - 1];
    item.append(swatch, `${s.label} ${current === null ? "" : compact(current)}`);
    return item;
  }));
}

function compact(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e4) return `${(v / 1e3).toFixed(0)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

function add(parent, tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  parent.appendChild(node);
  return node;
}
