// Riverbed dashboard: reads one snapshot a second from /api/events (server-sent events) and redraws the
// cards, the two SVG charts and the tables from it; a picked stream's recent records come from
// /api/streams/NAME/records. Plain DOM, no libraries; every server string goes in through textContent.
"use strict";

const HISTORY = 60;            // samples kept per series (one a second)
const MAX_SERIES = 6;          // lines per chart; the busiest streams win
const RECORDS_SHOWN = 20;
const PALETTE = ["#0b6e99", "#e07b24", "#2c9e5b", "#b8428a", "#6a55c2", "#c9a227", "#d64545", "#4a8fb3"];
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  series: new Map(),   // stream name -> {rate: [..], lag: [..]}, HISTORY long, oldest first
  colors: new Map(),   // stream name -> colour, fixed once given
  selected: null,      // the stream whose records are shown
  shownNext: null,     // its next_offset when its records were last fetched
  fetching: false,
  last: null,          // the latest snapshot
};

// ---------------------------------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fmtNum(n) {
  if (n === null || n === undefined) return "-";
  return Number(n).toLocaleString("en-US", {maximumFractionDigits: 1});
}

function fmtRate(n) {
  return Number(n).toLocaleString("en-US", {maximumFractionDigits: n < 10 ? 1 : 0});
}

function fmtShort(n) {
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n * 10) / 10);
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function fmtTime(ms) {
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace("Z", " UTC");
}

function colorOf(name) {
  if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(name);
}

function push(list, value) {
  list.push(value);
  if (list.length > HISTORY) list.shift();
}

function swatch(color) {
  const s = el("span", {class: "swatch"});
  s.style.background = color;
  return s;
}

// ---------------------------------------------------------------------------------------- charts

// Draws up to MAX_SERIES lines of `key` ("rate" or "lag") into the SVG `id`, with a legend.
function drawChart(id, legendId, key, names) {
  const plot = document.getElementById(id);
  const width = Math.max(plot.clientWidth, 200), height = Math.max(plot.clientHeight, 100);
  const left = 44, right = 8, top = 8, bottom = 18;
  plot.setAttribute("viewBox", `0 0 ${width} ${height}`);
  plot.replaceChildren();
  let max = 0;
  for (const n of names) for (const v of state.series.get(n)[key]) max = Math.max(max, v);
  max = niceMax(max);
  const x = i => left + (width - left - right) * i / (HISTORY - 1);
  const y = v => top + (height - top - bottom) * (1 - v / max);
  for (let g = 0; g <= 4; g++) {
    const v = max * g / 4;
    plot.append(svg("line", {class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v)}));
    const label = svg("text", {class: "axis", x: left - 6, y: y(v) + 3, "text-anchor": "end"});
    label.textContent = fmtShort(v);
    plot.append(label);
  }
  for (const [i, txt] of [[0, "-60 s"], [HISTORY - 1, "now"]]) {
    const label = svg("text", {class: "axis", x: x(i), y: height - 4, "text-anchor": i ? "end" : "start"});
    label.textContent = txt;
    plot.append(label);
  }
  const legend = document.getElementById(legendId);
  legend.replaceChildren();
  for (const n of names) {
    const values = state.series.get(n)[key];
    const offset = HISTORY - values.length;
    const points = values.map((v, i) => `${x(i + offset).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    plot.append(svg("polyline", {class: "series", points, stroke: colorOf(n)}));
    legend.append(el("span", {}, swatch(colorOf(n)), `${n} ${fmtShort(values[values.length - 1] || 0)}`));
  }
  if (!names.length) legend.append(el("span", {}, key === "lag" ? "no consumers" : "no streams"));
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function sparkline(values, color) {
  const w = 110, h = 22;
  const box = svg("svg", {class: "spark", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none"});
  const max = Math.max(1, ...values);
  const offset = HISTORY - values.length;
  const points = values.map((v, i) =>
    `${((i + offset) * w / (HISTORY - 1)).toFixed(1)},${(h - 2 - (h - 4) * v / max).toFixed(1)}`).join(" ");
  box.append(svg("polyline", {points, stroke: color}));
  return box;
}

// Streams with the highest peak of `key` over the window, busiest first.
function busiest(key, names) {
  const peak = n => Math.max(0, ...state.series.get(n)[key]);
  return names.filter(n => key !== "lag" || state.series.get(n).hasConsumers)
    .sort((a, b) => peak(b) - peak(a) || a.localeCompare(b)).slice(0, MAX_SERIES);
}

// ---------------------------------------------------------------------------------------- snapshot

function update(snap) {
  state.last = snap;
  const lagOf = new Map();
  for (const c of snap.consumers) lagOf.set(c.stream, (lagOf.get(c.stream) || 0) + (c.lag || 0));
  const names = snap.streams.map(s => s.name);
  for (const name of [...state.series.keys()]) if (!names.includes(name)) state.series.delete(name);
  for (const s of snap.streams) {
    if (!state.series.has(s.name)) state.series.set(s.name, {rate: [], lag: []});
    const series = state.series.get(s.name);
    push(series.rate, s.rate);
    push(series.lag, lagOf.get(s.name) || 0);
    series.hasConsumers = s.consumers > 0;
    colorOf(s.name);
  }
  document.getElementById("clock").textContent = fmtTime(snap.t);
  document.getElementById("version").textContent = `${snap.version} · RabbitMQ Stream ${snap.rabbitmq_version}`;
  renderCards(snap, lagOf);
  renderStreams(snap.streams);
  renderConsumers(snap.consumers);
  renderCluster(snap.cluster);
  drawChart("chart-rate", "legend-rate", "rate", busiest("rate", names));
  drawChart("chart-lag", "legend-lag", "lag", busiest("lag", names));
  const picked = snap.streams.find(s => s.name === state.selected);
  if (state.selected && !picked) select(null);
  else if (picked && picked.next_offset !== state.shownNext) loadRecords(picked.name, picked.next_offset);
}

function renderCards(snap, lagOf) {
  let rate = 0, bytes = 0, lag = 0;
  for (const s of snap.streams) { rate += s.rate; bytes += s.bytes; }
  for (const v of lagOf.values()) lag += v;
  document.getElementById("total-streams").textContent = fmtNum(snap.streams.length);
  document.getElementById("total-rate").textContent = fmtShort(rate) + " /s";
  document.getElementById("total-bytes").textContent = fmtBytes(bytes);
  document.getElementById("total-consumers").textContent = fmtNum(snap.consumers.length);
  document.getElementById("total-lag").textContent = fmtNum(lag);
  const chips = document.getElementById("connections");
  chips.replaceChildren();
  const protocols = Object.keys(snap.connections).sort();
  for (const p of protocols) chips.append(el("span", {class: "chip", "data-protocol": p}, p, el("b", {}, snap.connections[p])));
  if (!protocols.length) chips.append(el("span", {class: "empty"}, "none"));
}

function renderStreams(streams) {
  const body = document.querySelector("#streams tbody");
  body.replaceChildren();
  for (const s of streams) {
    const row = el("tr", {"data-stream": s.name, class: s.name === state.selected ? "selected" : ""},
      el("td", {class: "name"}, swatch(colorOf(s.name)), s.name),
      el("td", {class: "num records"}, fmtNum(s.records)),
      el("td", {class: "num"}, fmtBytes(s.bytes)),
      el("td", {class: "num"}, s.last_offset === null ? "-" : fmtNum(s.last_offset)),
      el("td", {class: "num rate"}, fmtRate(s.rate)),
      el("td", {}, sparkline(state.series.get(s.name).rate, colorOf(s.name))),
      el("td", {class: "num"}, fmtNum(s.consumers)),
      el("td", {class: "num"}, fmtNum(s.publishers)));
    body.append(row);
  }
  document.getElementById("no-streams").hidden = streams.length > 0;
}

function renderConsumers(consumers) {
  const body = document.querySelector("#consumers tbody");
  body.replaceChildren();
  const maxLag = Math.max(1, ...consumers.map(c => c.lag || 0));
  for (const c of consumers) {
    const bar = el("span", {class: "lagbar"});
    bar.style.width = `${Math.round(60 * (c.lag || 0) / maxLag)}px`;
    body.append(el("tr", {"data-stream": c.stream},
      el("td", {class: "name"}, c.stream),
      el("td", {}, el("span", {class: "proto"}, c.protocol)),
      el("td", {}, c.connection),
      el("td", {}, String(c.subscription_id)),
      el("td", {}, c.reference === null ? "-" : c.reference),
      el("td", {class: "num"}, fmtNum(c.offset)),
      el("td", {class: "num lag"}, bar, fmtNum(c.lag)),
      el("td", {class: "num"}, fmtRate(c.rate)),
      el("td", {class: "num"}, c.credits === null ? "-" : fmtNum(c.credits))));
  }
  document.getElementById("no-consumers").hidden = consumers.length > 0;
}

// A cluster node's view: nodes up/down with their addresses, each stream's leader and its members'
// lag (records behind the leader's log). Hidden on a node that runs alone (no `cluster` in the snapshot).
function renderCluster(cluster) {
  const panel = document.getElementById("cluster-panel");
  panel.hidden = !cluster;
  if (!cluster) return;
  document.getElementById("cluster-name").textContent = cluster.cluster;
  document.getElementById("cluster-self").textContent = cluster.self;
  const nodes = document.querySelector("#nodes tbody");
  nodes.replaceChildren();
  for (const n of cluster.nodes) {
    nodes.append(el("tr", {"data-node": n.name, class: n.up ? "up" : "down"},
      el("td", {class: "name"}, n.name),
      el("td", {class: "state"}, el("span", {class: `node-state ${n.up ? "up" : "down"}`}, n.up ? "up" : "down")),
      el("td", {}, n.advertised_host || "-"),
      el("td", {class: "num"}, n.stream_port ?? "-"),
      el("td", {class: "num"}, n.http_port ?? "-"),
      el("td", {class: "num"}, n.replication_port ?? "-"),
      el("td", {class: "leads"}, n.leads.join(", ") || "-")));
  }
  const forwarded = cluster.forwarded || {};
  const rows = document.querySelector("#placement tbody");
  rows.replaceChildren();
  for (const s of cluster.streams) {
    const members = el("td", {class: "members"});
    for (const m of s.members) {
      const lag = m.lag === null ? "-" : fmtNum(m.lag);
      const role = m.node === s.leader ? "leader" : "replica";
      members.append(el("span", {class: `member ${role}`, "data-node": m.node, "data-lag": m.lag ?? ""},
        m.node, el("b", {}, m.node === s.leader ? "leader" : lag)));
    }
    rows.append(el("tr", {"data-stream": s.name},
      el("td", {class: "name"}, s.name),
      el("td", {class: "num"}, fmtNum(s.epoch)),
      el("td", {class: "leader"}, s.leader || "(electing)"),
      members,
      el("td", {class: "num forwarded"}, s.name in forwarded ? fmtNum(forwarded[s.name]) : "-")));
  }
  document.getElementById("no-placement").hidden = cluster.streams.length > 0;
}

// ---------------------------------------------------------------------------------------- records

function select(name) {
  state.selected = name;
  state.shownNext = null;
  for (const row of document.querySelectorAll("#streams tbody tr"))
    row.classList.toggle("selected", row.dataset.stream === name);
  document.getElementById("records-panel").hidden = !name;
  document.getElementById("records-stream").textContent = name || "";
  document.getElementById("records").replaceChildren();
}

async function loadRecords(name, nextOffset) {
  if (state.fetching) return;
  state.fetching = true;
  try {
    const resp = await fetch(`/api/streams/${encodeURIComponent(name)}/records?last=${RECORDS_SHOWN}`);
    if (name !== state.selected) return;
    const box = document.getElementById("records");
    if (!resp.ok) {
      const err = await resp.json().catch(() => ({reason: resp.statusText}));
      box.replaceChildren(el("p", {class: "empty"}, `Cannot read records: ${err.reason}`));
    } else {
      const records = await resp.json();
      box.replaceChildren(...records.reverse().map(renderRecord));
      if (!records.length) box.append(el("p", {class: "empty"}, "No records."));
    }
    state.shownNext = nextOffset;
  } catch (e) {
    // the connection dropped; the next snapshot retries
  } finally {
    state.fetching = false;
  }
}

function renderRecord(r) {
  return el("div", {class: "record", "data-offset": r.offset},
    el("div", {class: "meta"},
      el("span", {class: "off"}, `#${r.offset}`),
      el("span", {}, fmtTime(r.timestamp).slice(11)),
      el("span", {}, r.content_type || "no content-type"),
      el("span", {class: `kind ${r.kind}`}, r.kind),
      r.truncated ? el("span", {}, "truncated") : ""),
    el("pre", {}, r.body));
}

// ---------------------------------------------------------------------------------------- wiring

function setStatus(text, cls) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = `status ${cls}`;
}

function connect() {
  const source = new EventSource("/api/events");
  source.onopen = () => setStatus("live", "live");
  source.onerror = () => setStatus("reconnecting", "down");   // EventSource retries by itself
  source.onmessage = event => {
    setStatus("live", "live");
    update(JSON.parse(event.data));
  };
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelector("#streams tbody").addEventListener("click", event => {
    const row = event.target.closest("tr");
    if (!row) return;
    select(row.dataset.stream === state.selected ? null : row.dataset.stream);
    const picked = state.last && state.last.streams.find(s => s.name === state.selected);
    if (picked) loadRecords(picked.name, picked.next_offset);
  });
  connect();
});
