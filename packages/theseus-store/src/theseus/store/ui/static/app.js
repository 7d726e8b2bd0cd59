// theseus-store ui: the one script. No third-party code, no network beyond this server.
"use strict";

const page = document.body.dataset.page;

async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response.json();
}

// -- live: the runs page and the lineage page refresh their numbers without a reload --------

function liveRuns() {
  const query = document.body.dataset.query || "";
  setInterval(async () => {
    const data = await getJSON(`/api/runs?${query}`);
    for (const row of data.rows) {
      const tr = document.querySelector(`tr[data-lineage="${CSS.escape(row.lineage)}"]`);
      if (!tr) continue;
      for (const field of ["status", "nodes", "last_seq"]) {
        const cell = tr.querySelector(`[data-field="${field}"]`);
        if (cell) cell.textContent = String(row[field]);
      }
      for (const [key, value] of Object.entries(row.last)) {
        const cell = tr.querySelector(`[data-key="${CSS.escape(key)}"]`);
        if (cell) cell.textContent = value;
      }
    }
  }, 3000);
}

function liveLineage() {
  const lineage = document.body.dataset.lineage;
  const lastSeq = document.querySelector('[data-field="last_seq"]');
  let drawn = lastSeq.textContent.trim();  // the seq the tree was drawn at
  // A new node: take the tree (and the slider links, for a first artifact) from the page
  // as the server draws it now. DOMParser runs no script, and the page's own CSP holds.
  const redraw = async () => {
    const response = await fetch(location.pathname, { headers: { Accept: "text/html" } });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const selector of ["ul.tree", "p.actions"]) {
      const mine = document.querySelector(selector);
      const theirs = fresh.querySelector(selector);
      if (mine && theirs) mine.replaceWith(document.importNode(theirs, true));
    }
    const newer = fresh.querySelector('[data-field="last_seq"]');  // the tree's own last seq
    if (newer && Number(newer.textContent) > Number(lastSeq.textContent)) {
      lastSeq.textContent = newer.textContent;
    }
  };
  const update = async () => {
    const data = await getJSON(`/api/lineage?l=${encodeURIComponent(lineage)}`);
    lastSeq.textContent = String(data.last_seq);
    document.querySelector('[data-field="status"]').textContent = data.status;
    const scheduled = document.querySelector('[data-field="scheduled"]');
    if (scheduled && data.scheduled) scheduled.textContent = data.scheduled;
    document.querySelector('[data-key="val/loss"]').textContent = data.last["val/loss"];
    if (String(data.last_seq) !== drawn) {
      drawn = String(data.last_seq);
      await redraw();
    }
  };
  update();
  setInterval(update, 3000);
}

// -- curves: a small canvas plot ------------------------------------------------------------

// A series of at most this many points is drawn with a marker at each point too.
const MARKERS_UP_TO = 20;

const COLORS = ["#2a5db0", "#d9541a", "#1c8a4a", "#7a3fb0", "#b0902a", "#1a9bb0", "#b02a6b", "#555"];

function smooth(ys, weight) {
  if (weight <= 0) return ys;
  const out = [];
  let last = null, debias = 0;
  for (const y of ys) {
    last = last === null ? y * (1 - weight) : last * weight + (1 - weight) * y;
    debias = debias * weight + (1 - weight);
    out.push(last / debias);
  }
  return out;
}

// Round tick positions between lo and hi, about `count` of them; `minStep` 1 keeps them
// whole (seqs, or decades on a log axis).
function niceTicks(lo, hi, count, minStep = 0) {
  if (!(hi > lo)) return [lo];
  const step0 = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = Math.max(minStep, [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0));
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

function draw(canvas, series, opts) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 70, R = 20, T = 20, B = 40;
  ctx.clearRect(0, 0, W, H);
  const ty = (y) => (opts.log ? Math.log10(y) : y);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  const prepared = series.map((s) => {
    const ys = smooth(s.y, opts.smooth);
    const pts = [];
    s.x.forEach((x, i) => {
      const y = ys[i];
      if (opts.log && !(y > 0)) return;
      pts.push([x, ty(y)]);
    });
    for (const [x, y] of pts) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
    return pts;
  });
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = "#6b7480";
  if (!isFinite(x0)) { ctx.fillText("no numeric values for this key", L, T + 20); return; }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  ctx.strokeStyle = "#e3e7ec"; ctx.lineWidth = 1;
  const decades = opts.log && y1 - y0 >= 2;  // a log axis over two decades or more: ticks at powers of ten
  ctx.textAlign = "right";  // tick labels end at the axis, leaving the margin's left to its label
  for (const t of niceTicks(y0, y1, 6, decades ? 1 : 0)) {
    ctx.beginPath(); ctx.moveTo(L, py(t)); ctx.lineTo(W - R, py(t)); ctx.stroke();
    const label = opts.log ? Number(Math.pow(10, t).toPrecision(3)).toString() : Number(t.toPrecision(4)).toString();
    ctx.fillText(label, L - 6, py(t) + 4);
  }
  ctx.textAlign = "left";
  // the y axis: the value's key, written upwards along the left edge
  ctx.save();
  ctx.translate(14, T + (H - T - B) / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillText(opts.log ? `${opts.key} (log scale)` : opts.key, 0, 0);
  ctx.restore();
  for (const t of niceTicks(x0, x1, 8, 1)) {
    ctx.beginPath(); ctx.moveTo(px(t), T); ctx.lineTo(px(t), H - B); ctx.stroke();
    ctx.fillText(String(Math.round(t)), px(t) - 8, H - B + 16);
  }
  ctx.fillText("node (seq, stitched through branch points)", W / 2 - 120, H - 6);
  prepared.forEach((pts, k) => {
    ctx.strokeStyle = COLORS[k % COLORS.length]; ctx.lineWidth = 1.6;
    ctx.beginPath();
    pts.forEach(([x, y], i) => (i ? ctx.lineTo(px(x), py(y)) : ctx.moveTo(px(x), py(y))));
    ctx.stroke();
    if (pts.length <= MARKERS_UP_TO) {  // few points: each one marked, so none hides in a line
      ctx.fillStyle = ctx.strokeStyle;
      for (const [x, y] of pts) { ctx.beginPath(); ctx.arc(px(x), py(y), 4, 0, 2 * Math.PI); ctx.fill(); }
    }
  });
}

function curves() {
  const form = document.getElementById("curve-form");
  const canvas = document.getElementById("chart");
  const legend = document.getElementById("legend");
  const logy = document.getElementById("logy");
  const smoothing = document.getElementById("smooth");
  const live = document.getElementById("live");
  let data = { series: [] };
  const chosen = () => Array.from(form.elements.l.selectedOptions).map((o) => o.value);
  // The view (log scale, smoothing) lives in the address too: a reload or a shared link
  // shows the same curves.
  const remember = () => {
    const params = new URLSearchParams(location.search);
    if (logy.checked) params.set("log", "1"); else params.delete("log");
    if (Number(smoothing.value) > 0) params.set("smooth", smoothing.value); else params.delete("smooth");
    history.replaceState(null, "", `${location.pathname}?${params}`);
  };
  const redraw = () => {
    document.getElementById("smooth-value").textContent = smoothing.value;
    const key = data.key || form.elements.key.value;
    canvas.setAttribute("aria-label", `${key} over nodes`);
    draw(canvas, data.series, { log: logy.checked, smooth: Number(smoothing.value), key });
    legend.replaceChildren(...data.series.map((s, k) => {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = COLORS[k % COLORS.length];
      item.append(swatch, `${s.lineage} (${s.x.length} of ${s.total} points)`);
      return item;
    }));
  };
  const load = async () => {
    if (!form.elements.key.value) return;  // a store with no numeric key: nothing to draw
    const params = new URLSearchParams({ key: form.elements.key.value });
    for (const l of chosen()) params.append("l", l);
    data = await getJSON(`/api/series?${params}`);
    redraw();
  };
  logy.addEventListener("change", () => { remember(); redraw(); });
  smoothing.addEventListener("input", () => { remember(); redraw(); });
  load();
  setInterval(() => { if (live.checked) load(); }, 4000);
}

// -- the time slider --------------------------------------------------------------------------

async function slider() {
  const { lineage, name, version } = document.body.dataset;
  if (!name) return;  // no picture to step through: the page says why
  const input = document.getElementById("frame");
  const info = document.getElementById("frame-info");
  const image = document.getElementById("frame-image");
  const none = document.getElementById("frame-none");
  const link = document.getElementById("frame-link");
  let frames = [];
  const fmt = (v) => (v === null || v === undefined ? "-" : typeof v === "number" ? Number(v.toPrecision(5)).toString() : String(v));
  const show = () => {
    const f = frames[Number(input.value)];
    if (!f) { info.textContent = "no node holds this artifact"; return; }
    const of = f.versions.length > 1 ? ` of ${f.versions.map((v) => `v${v}`).join(", ")}` : "";
    info.textContent = `${Number(input.value) + 1}/${frames.length} · ${f.node} · seq ${f.seq} · step ${fmt(f.step)} · val/loss ${fmt(f.val_loss)} · v${f.version}${of}`;
    if (f.image) { image.src = f.image; image.classList.remove("hidden"); none.classList.add("hidden"); }
    else { image.classList.add("hidden"); none.classList.remove("hidden"); link.href = f.page; }
  };
  const load = async () => {
    const params = new URLSearchParams({ l: lineage, name, version });
    const data = await getJSON(`/api/frames?${params}`);
    const atEnd = Number(input.value) >= frames.length - 1;
    frames = data.frames;
    input.max = String(Math.max(0, frames.length - 1));
    if (atEnd) input.value = input.max;
    show();
  };
  input.addEventListener("input", show);
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement && event.target !== input) return;
    if (event.target instanceof HTMLSelectElement) return;
    const step = event.key === "ArrowRight" ? 1 : event.key === "ArrowLeft" ? -1 : 0;
    if (!step) return;
    event.preventDefault();
    input.value = String(Math.min(Number(input.max), Math.max(0, Number(input.value) + step)));
    show();
  });
  await load();
  input.value = "0";
  show();
  setInterval(load, 5000);
}

// -- the features page: one SAE's features node by node, a feature followed -------------------

// The server renders each (node, feature) and follows the feature from one node to the next;
// stepping fetches that page and swaps its #view in (DOMParser runs no script, and the page's
// own CSP holds). Steps run one after another, each from where the last one arrived.
function features() {
  const { lineage, name } = document.body.dataset;
  const input = document.getElementById("frame");
  const info = document.getElementById("frame-info");
  let frames = [];
  let queue = Promise.resolve();
  const view = () => document.getElementById("view");
  const go = async (url) => {
    const response = await fetch(url, { headers: { Accept: "text/html" } });
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    const theirs = fresh.getElementById("view");
    if (!response.ok || !theirs) {
      const error = fresh.querySelector(".error");
      info.textContent = error ? error.textContent : `${url}: ${response.status}`;
      return;
    }
    view().replaceWith(document.importNode(theirs, true));
    input.value = theirs.dataset.index;
    info.textContent = theirs.dataset.info;
    history.replaceState(null, "", theirs.dataset.canonical);
  };
  const enqueue = (target) => {
    queue = queue.then(() => { const url = target(); return url ? go(url) : null; })
      .catch((err) => { info.textContent = String(err); });
  };
  // The page of frame k with the feature shown now, followed there from this node.
  const toFrame = (k) => {
    const here = view().dataset;
    const frame = frames[k];
    if (!frame || frame.node === here.node) return null;
    const params = new URLSearchParams({ l: lineage, name, node: frame.node, from: here.node, feature: here.feature });
    return `/features?${params}`;
  };
  const step = (by) => enqueue(() => {
    const link = document.getElementById(by > 0 ? "step-next" : "step-prev");
    return link ? link.href : toFrame(Number(view().dataset.index) + by);
  });
  const jump = () => enqueue(() => toFrame(Number(input.value)));
  input.addEventListener("input", () => {
    const frame = frames[Number(input.value)];
    if (frame) info.textContent = `${Number(input.value) + 1}/${frames.length} · ${frame.node} · seq ${frame.seq} …`;
  });
  input.addEventListener("change", jump);
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement && event.target !== input) return;
    if (event.target instanceof HTMLSelectElement) return;
    const by = event.key === "ArrowRight" ? 1 : event.key === "ArrowLeft" ? -1 : 0;
    if (!by) return;
    event.preventDefault();
    step(by);
  });
  // The nodes the slider steps through (the slider page's frames); new ones extend it.
  const load = async () => {
    const data = await getJSON(`/api/frames?${new URLSearchParams({ l: lineage, name })}`);
    frames = data.frames;
    input.max = String(Math.max(0, frames.length - 1));
  };
  // A jump needs the frames: steps queued before they arrive wait for them.
  queue = load().catch((err) => { info.textContent = String(err); });
  setInterval(load, 5000);
}

const pages = { runs: liveRuns, lineage: liveLineage, curves, slider, features };
if (pages[page]) pages[page]();
