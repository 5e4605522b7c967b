/* flowgrpo gallery: the review page of one run (built by gallery/build.py; docs/gallery.md).

   Data arrive as scripts calling galleryLoad(kind, key, payload), so the page also works from
   file://. Every string from the run (prompts, metadata, notes, file names) reaches the page through
   textContent or a DOM property, never through innerHTML: a prompt holding HTML shows as text.
   This file: loading, state in the URL hash, flags, sample tiles, the lightbox and the frame; the
   views (samples with trees, compare, charts, review, run) are in views.js, the SVG charts in charts.js. */
"use strict";

const LABELS = ["good", "bad", "reward hacked"];
const GROUPS_PER_PAGE = 20, SAMPLES_PER_PAGE = 120, POLL_MS = window.GALLERY_POLL_MS || 5000;  // served: new steps
const G = {index: null, steps: {}, metrics: null, prompts: null, flags: Object.create(null), served: false, pending: {}, lsKey: ""};
const DEFAULTS = {view: "samples", step: "", q: "", task: "", reward: "", min: "", max: "", sort: "order", flag: "",
                  layout: "groups", page: 1, prompt: "", pq: "", all: "", metric: ""};
const S = Object.assign({}, DEFAULTS);
window.__gallery = {firstRender: null, renders: 0};

/* ---------- loading ---------- */

window.galleryLoad = function (kind, key, payload) {
  const waiter = G.pending[kind + ":" + key];
  if (waiter) { delete G.pending[kind + ":" + key]; waiter.resolve(payload); }
};

function loadScript(kind, key, src) {
  return new Promise((resolve, reject) => {
    G.pending[kind + ":" + key] = {resolve, reject};
    const el = document.createElement("script");
    el.src = src;
    el.onload = () => { el.remove(); const w = G.pending[kind + ":" + key]; if (w) { delete G.pending[kind + ":" + key]; reject(new Error(src + " did not load")); } };
    el.onerror = () => { el.remove(); delete G.pending[kind + ":" + key]; reject(new Error("cannot load " + src)); };
    document.head.appendChild(el);
  });
}

async function loadStep(name) {
  if (G.steps[name]) return G.steps[name];
  const info = G.index.steps.find(s => s.name === name);
  if (!info) throw new Error("no step " + name);
  const data = await loadScript("step", name, info.shard);
  const order = G.index.steps.indexOf(info);
  for (const g of data.groups) {
    g.step = name; g.stepOrder = order; g.iteration = data.iteration; g.kind = data.kind;
    g.statsBy = {};  // reward -> [mean, std, n] over every sample of the group (saved or not), when recorded
    data.reward_names.forEach((r, k) => { g.statsBy[r] = g.stats ? g.stats[k] : null; });
    for (const s of g.samples) {
      s.key = name + "/" + s.id;
      s.group = g;
      s.rv = {};
      data.reward_names.forEach((r, k) => { s.rv[r] = s.r[k]; });
    }
  }
  G.steps[name] = data;
  return data;
}

async function loadIndex(bust) {
  G.index = await loadScript("index", "", "data/index.js" + (bust ? "?t=" + Date.now() : ""));
}

/* ---------- state in the URL hash ---------- */

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  for (const k of Object.keys(DEFAULTS)) {
    S[k] = !p.has(k) ? DEFAULTS[k] : k === "page" ? Math.max(1, parseInt(p.get(k), 10) || 1) : p.get(k);
  }
}

function hashFor(changes) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(Object.assign({}, S, changes))) if (v !== "" && !(k === "page" && v === 1)) p.set(k, v);
  return "#" + p.toString();
}

function writeHash() {
  history.replaceState(null, "", hashFor({}));
}

function setState(changes, keepPage) {
  Object.assign(S, changes);
  if (!keepPage) S.page = 1;
  writeHash();
  render();
}

/* ---------- small DOM helpers (text only: never innerHTML) ---------- */

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "data") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function select(options, value, onChange, label) {
  const s = el("select", {name: label, onchange: () => onChange(s.value)});
  s.setAttribute("aria-label", label);
  for (const o of options) {
    if (o.group) {
      const og = el("optgroup", {label: o.group});
      for (const c of o.options) og.append(el("option", {value: c.value, text: c.text}));
      s.append(og);
    } else s.append(el("option", {value: o.value, text: o.text}));
  }
  s.value = value;
  return s;
}

function field(label, control) {
  return el("label", {class: "field"}, el("span", {text: label}), control);
}

function stats(values) {
  const v = values.filter(x => x !== null && x !== undefined);
  if (!v.length) return {n: 0, mean: null, std: null};
  const mean = v.reduce((a, b) => a + b, 0) / v.length;
  const std = Math.sqrt(v.reduce((a, b) => a + (b - mean) * (b - mean), 0) / v.length);
  return {n: v.length, mean, std};
}

function stepLabel(info) {
  return `${info.name} (${info.kind}${info.iteration !== null ? ", it " + info.iteration : ""}, ${info.samples})`;
}

function toast(text, bad) {
  const n = document.getElementById("notice");
  n.replaceChildren(el("span", {text}));
  n.className = "notice" + (bad ? " bad" : "");
  n.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { n.hidden = true; }, bad ? 8000 : 3000);
}

/* ---------- flags ---------- */

function flagOf(key) { return G.flags[key] || null; }

/* Flags keyed by sample key, in an object without a prototype: a key read from a file is only a key. */
function flagMap(obj) {
  const map = Object.create(null);
  if (obj && typeof obj === "object") for (const [k, f] of Object.entries(obj)) if (f && Array.isArray(f.labels)) map[k] = f;
  return map;
}

async function setFlag(sample, labels, note) {
  const body = {key: sample.key, labels, note, step: sample.group.step, prompt: sample.group.prompt.slice(0, 2000)};
  const before = G.flags[sample.key];
  const keep = labels.length || note.trim();
  if (keep) G.flags[sample.key] = {labels, note, step: body.step, prompt: body.prompt, updated: new Date().toISOString()};
  else delete G.flags[sample.key];
  if (G.served) {
    try {
      const r = await fetch("api/flags", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
      const answer = await r.json();
      if (!r.ok) throw new Error(answer.error || r.statusText);
      if (answer.flag) G.flags[sample.key] = answer.flag; else delete G.flags[sample.key];
    } catch (e) {
      if (before) G.flags[sample.key] = before; else delete G.flags[sample.key];
      toast("flag not saved: " + e.message, true);
    }
  } else {
    const local = JSON.parse(localStorage.getItem(G.lsKey) || "{}");
    local[sample.key] = keep ? G.flags[sample.key] : {deleted: true};
    localStorage.setItem(G.lsKey, JSON.stringify(local));
  }
  updateFlagCount();
  refreshTiles(sample.key);
}

function updateFlagCount() {
  document.getElementById("flag-count").textContent = Object.keys(G.flags).length || "";
}

function exportFlags() {
  const payload = {version: 1, run: G.index.run, exported: new Date().toISOString(), flags: G.flags};
  const url = URL.createObjectURL(new Blob([JSON.stringify(payload, null, 1)], {type: "application/json"}));
  const a = el("a", {href: url, download: `flags-${G.index.run}.json`});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function importFlags(file) {
  const reader = new FileReader();
  reader.onload = () => {
    try {
      const flags = JSON.parse(reader.result).flags;
      if (!flags || typeof flags !== "object") throw new Error("no \"flags\" object");
      const local = JSON.parse(localStorage.getItem(G.lsKey) || "{}");
      for (const [k, f] of Object.entries(flags)) {
        if (k === "__proto__" || !f || !Array.isArray(f.labels) || typeof (f.note || "") !== "string") continue;
        const clean = {labels: f.labels.filter(x => typeof x === "string").slice(0, 8), note: String(f.note || ""),
                       step: String(f.step || ""), prompt: String(f.prompt || ""), updated: String(f.updated || "")};
        G.flags[k] = local[k] = clean;
      }
      localStorage.setItem(G.lsKey, JSON.stringify(local));
      updateFlagCount();
      render();
    } catch (e) { toast("import failed: " + e.message, true); }
  };
  reader.readAsText(file);
}

/* ---------- one sample ---------- */

function media(s, big) {
  if (s.kind === "video") {
    const v = el("video", {src: s.src, muted: true, loop: true, playsInline: true, controls: true,
                           preload: s.poster || s.thumb ? "none" : "metadata"});
    v.muted = true;
    v.autoplay = !!big;
    if (s.poster || s.thumb) v.poster = s.poster || s.thumb;
    if (!big) { v.addEventListener("mouseenter", () => v.play().catch(() => {})); v.addEventListener("mouseleave", () => v.pause()); }
    return v;
  }
  if (s.kind === "image") {
    const img = el("img", {src: big ? s.src : s.thumb || s.src, alt: "sample " + s.id, loading: big ? "eager" : "lazy",
                           decoding: "async"});
    if (!big) img.addEventListener("click", () => openLightbox(s));
    if (s.w && s.h) { img.width = s.w; img.height = s.h; }
    if (s.w && s.w <= 128) img.classList.add("pixel");
    return img;
  }
  if (s.kind === "file") return el("a", {href: s.src, text: "open file", class: "missing"});
  return el("div", {class: "missing", text: "no file (node " + s.node + ")"});
}

function rewardLine(s) {
  const line = el("div", {class: "rewards"});
  for (const [name, v] of Object.entries(s.rv)) {
    line.append(el("span", {class: name === S.reward ? "r sel" : "r", title: name},
                   el("b", {text: name}), " " + formatNumber(v)));
  }
  line.append(el("span", {class: "r adv", title: "advantage"}, el("b", {text: "adv"}), " " +
                 (s.adv === null ? "–" : (s.adv > 0 ? "+" : "") + formatNumber(s.adv))));
  return line;
}

function flagBar(s) {
  const f = flagOf(s.key), labels = f ? f.labels : [];
  const bar = el("div", {class: "flags"});
  for (const label of LABELS) {
    const on = labels.includes(label);
    bar.append(el("button", {type: "button", class: "flag" + (on ? " on" : ""), text: label, title: "flag as " + label,
      data: {label}, onclick: () => setFlag(s, on ? labels.filter(x => x !== label) : labels.concat([label]), f ? f.note : "")}));
  }
  bar.append(el("button", {type: "button", class: "flag note-btn" + (f && f.note ? " on" : ""), text: "note",
    title: "add a note", onclick: () => editNote(bar, s)}));
  if (f && f.note) bar.append(el("p", {class: "note", text: f.note}));
  return bar;
}

function editNote(bar, s) {
  const f = flagOf(s.key);
  const area = el("textarea", {value: f ? f.note : "", maxLength: 4000, rows: 3, placeholder: "note"});
  const save = el("button", {type: "button", text: "save", class: "save-note",
    onclick: () => setFlag(s, f ? f.labels : [], area.value)});
  const cancel = el("button", {type: "button", text: "cancel", onclick: () => refreshTiles(s.key)});
  bar.replaceChildren(area, save, cancel);
  area.focus();
}

const NODE_HELP = "tree node: a state in this prompt's sampling tree. Roots are starting noises (x_T); every " +
  "denoising step makes a child node (several where the tree branches), and a finished sample is a leaf. " +
  "'from node' is the node its last step started from.";
const SEED_HELP = "noise seed: the seed of the generator (torch.Generator().manual_seed) that drew this sample's " +
  "starting noise x_T; SDE steps add noise seeded by the run seed, iteration, prompt slot and node.";
const RUN_SEED_HELP = "the run's seed: this manifest does not record the sample's own noise seed";

/* "tree node 80, from node 72" and "noise seed N" (or the run seed, labelled as such), with their explanations. */
function idLine(s, cls) {
  const line = el("div", {class: cls + " ids"});
  const eval1 = s.group.kind === "eval" && (s.parent === null || s.parent < 0);  // an evaluation sample: no tree
  if (s.node !== null && s.node !== undefined && !eval1) {
    line.append(el("span", {class: "node", title: NODE_HELP,
      text: `tree node ${s.node}` + (s.parent !== null && s.parent >= 0 ? `, from node ${s.parent}` : " (a root)")}));
  }
  const seed = s.seed !== null && s.seed !== undefined ? el("span", {class: "seed", title: SEED_HELP, text: `noise seed ${s.seed}`})
    : s.group.run_seed ? el("span", {class: "seed", title: RUN_SEED_HELP, text: `run seed ${s.group.run_seed}`}) : null;
  if (seed) line.append(line.childNodes.length ? " · " : "", seed);
  return line;
}

function tile(s, opts) {
  const f = flagOf(s.key);
  const fig = el("figure", {class: "tile" + (f ? " flagged " + f.labels.map(l => "f-" + l.replace(/\W+/g, "-")).join(" ") : ""),
                            data: {key: s.key}});
  fig.append(el("div", {class: "media"}, media(s, false)));
  const cap = el("figcaption");
  if (opts && opts.prompt) cap.append(el("p", {class: "tile-prompt", text: s.group.prompt}));
  if (opts && opts.step) cap.append(el("p", {class: "muted small", text: s.group.step}));
  cap.append(rewardLine(s));
  cap.append(idLine(s, "muted small"));
  cap.append(flagBar(s));
  fig.append(cap);
  fig._sample = s;
  fig._opts = opts;
  return fig;
}

function refreshTiles(key) {
  for (const old of document.querySelectorAll(".tile")) {
    if (old.dataset.key === key) old.replaceWith(tile(old._sample, old._opts));
  }
  const lb = document.getElementById("lightbox");
  if (!lb.hidden && lb._sample && lb._sample.key === key) openLightbox(lb._sample);
}

function openLightbox(s) {
  const lb = document.getElementById("lightbox");
  const close = () => { lb.hidden = true; lb.replaceChildren(); };
  const meta = el("pre", {class: "meta", text: JSON.stringify(s.group.metadata, null, 1)});
  const panel = el("div", {class: "panel", onclick: ev => ev.stopPropagation()},
    el("button", {type: "button", class: "close", text: "close ✕", onclick: close}),
    el("div", {class: "big"}, media(s, true)),
    el("div", {class: "details"},
      el("p", {class: "prompt", text: s.group.prompt}),
      el("p", {class: "muted", text: `${s.group.step} · task ${s.group.task || "–"}`}), idLine(s, "muted"),
      rewardLine(s), flagBar(s), meta));
  lb.replaceChildren(panel);
  lb._sample = s;
  lb.onclick = close;
  lb.hidden = false;
}

/* ---------- frame ---------- */

let renderSeq = 0;
async function render() {
  const seq = ++renderSeq, app = document.getElementById("app");
  app.dataset.state = "loading";
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === S.view);
  if (!S.step || (S.step !== "*" && !G.index.steps.some(s => s.name === S.step))) {
    const train = G.index.steps.filter(s => s.kind === "train");
    S.step = (train.length ? train[train.length - 1] : G.index.steps[G.index.steps.length - 1] || {name: "*"}).name;
  }
  if (!S.reward || !G.index.reward_names.includes(S.reward)) S.reward = G.index.reward_names[0] || "";
  const views = {samples: renderSamples, compare: renderCompare, charts: renderCharts, review: renderReview, run: renderRun};
  const target = document.createElement("div");
  try {
    await (views[S.view] || renderSamples)(target);
  } catch (e) {
    target.replaceChildren(el("p", {class: "empty bad", text: "could not show this view: " + e.message}));
  }
  if (seq !== renderSeq) return;  // a newer render started meanwhile
  app.replaceChildren(...target.childNodes);
  app.dataset.state = "ready";
  window.__gallery.renders++;
  if (window.__gallery.firstRender === null) window.__gallery.firstRender = performance.now();
}

async function poll() {
  const known = G.index.steps.map(s => s.shard).join("|");
  try { await loadIndex(true); } catch (e) { return; }
  document.getElementById("run-name").textContent = `${G.index.run} · ${G.index.steps.length} steps · ${G.index.num_samples} samples`;
  if (G.index.steps.map(s => s.shard).join("|") === known) return;
  for (const s of G.index.steps) if (G.steps[s.name] && !known.includes(s.shard)) delete G.steps[s.name];
  G.metrics = null; G.prompts = null;
  const latest = G.index.steps[G.index.steps.length - 1];
  toast(`new samples: ${latest ? latest.name : ""}`);
  if (S.view !== "review" && !document.querySelector("#app textarea")) render();
}

async function main() {
  try {
    await loadIndex(false);
  } catch (e) {
    document.getElementById("app").replaceChildren(el("p", {class: "empty bad", text: "data/index.js is missing: run python -m gallery RUN_DIR"}));
    return;
  }
  G.lsKey = "flowgrpo-gallery:" + G.index.run_path;
  if (location.protocol === "http:" || location.protocol === "https:") {
    try {
      const r = await fetch("api/flags", {cache: "no-store"});
      if (r.ok) { G.flags = flagMap((await r.json()).flags); G.served = true; }
    } catch (e) { /* a plain static server: flags stay in this browser */ }
  }
  if (!G.served) {
    try { G.flags = flagMap(await loadScript("flags", "", "data/flags.js?v=" + Date.now())); } catch (e) { G.flags = flagMap(); }
    const local = JSON.parse(localStorage.getItem(G.lsKey) || "{}");
    for (const [k, f] of Object.entries(local)) { if (f && f.deleted) delete G.flags[k]; else if (f && Array.isArray(f.labels)) G.flags[k] = f; }
  }
  document.getElementById("run-name").textContent = `${G.index.run} · ${G.index.steps.length} steps · ${G.index.num_samples} samples`;
  document.getElementById("mode").textContent = G.served ? "served: flags save to the run directory" : "static: flags stay in this browser (export them)";
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => setState({view: b.dataset.view}, true));
  document.addEventListener("keydown", ev => {
    if (ev.key === "Escape") { const lb = document.getElementById("lightbox"); lb.hidden = true; lb.replaceChildren(); }
  });
  window.addEventListener("hashchange", () => { readHash(); render(); });
  readHash();
  updateFlagCount();
  await render();
  if (G.served) setInterval(poll, POLL_MS);
}

main();
