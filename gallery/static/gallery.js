/* flowgrpo gallery: the review page of one run (built by gallery/build.py; docs/gallery.md).

   Data arrive as scripts calling galleryLoad(kind, key, payload), so the page also works from
   file://. Every string from the run (prompts, metadata, notes, file names) reaches the page through
   textContent or a DOM property, never through innerHTML: a prompt holding HTML shows as text.
   Views: samples (filter, sort, pages of prompt groups or single samples, trees of tree plans),
   compare (one prompt across steps), charts (metrics.jsonl), review (flags), run (config). */
"use strict";

const LABELS = ["good", "bad", "reward hacked"];
const GROUPS_PER_PAGE = 20, SAMPLES_PER_PAGE = 120, POLL_MS = 5000;
const G = {index: null, steps: {}, metrics: null, prompts: null, flags: {}, served: false, pending: {}, lsKey: ""};
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
        if (!f || !Array.isArray(f.labels) || typeof (f.note || "") !== "string") continue;
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

function tile(s, opts) {
  const f = flagOf(s.key);
  const fig = el("figure", {class: "tile" + (f ? " flagged " + f.labels.map(l => "f-" + l.replace(/\W+/g, "-")).join(" ") : ""),
                            data: {key: s.key}});
  fig.append(el("div", {class: "media"}, media(s, false)));
  const cap = el("figcaption");
  if (opts && opts.prompt) cap.append(el("p", {class: "tile-prompt", text: s.group.prompt}));
  if (opts && opts.step) cap.append(el("p", {class: "muted small", text: s.group.step}));
  cap.append(rewardLine(s));
  cap.append(el("div", {class: "muted small", text: `node ${s.node}` + (s.parent !== null && s.parent >= 0 ? ` ← ${s.parent}` : "") +
                                                     (s.seed !== null && s.seed !== undefined ? ` · seed ${s.seed}` : "")}));
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
      el("p", {class: "muted", text: `${s.group.step} · task ${s.group.task || "–"} · node ${s.node} · parent ${s.parent} · seed ${s.seed}`}),
      rewardLine(s), flagBar(s), meta));
  lb.replaceChildren(panel);
  lb._sample = s;
  lb.onclick = close;
  lb.hidden = false;
}

/* ---------- samples view ---------- */

function passesSample(s) {
  const v = s.rv[S.reward];
  if (S.min !== "" && !(v !== null && v !== undefined && v >= parseFloat(S.min))) return false;
  if (S.max !== "" && !(v !== null && v !== undefined && v <= parseFloat(S.max))) return false;
  if (S.flag) {
    const f = flagOf(s.key);
    if (S.flag === "flagged" && !f) return false;
    if (S.flag === "unflagged" && f) return false;
    if (S.flag.startsWith("label:") && !(f && f.labels.includes(S.flag.slice(6)))) return false;
  }
  return true;
}

const nullsLast = (a, b, dir) => (a === null || a === undefined) ? ((b === null || b === undefined) ? 0 : 1)
  : (b === null || b === undefined) ? -1 : dir * (a - b);

function sampleKey(s) {
  if (S.sort.startsWith("reward")) return s.rv[S.reward];
  if (S.sort.startsWith("adv")) return s.adv;
  return null;
}

function sortSamples(list) {
  const dir = S.sort.endsWith("-asc") ? 1 : -1;
  if (S.sort.startsWith("reward") || S.sort.startsWith("adv")) list.sort((a, b) => nullsLast(sampleKey(a), sampleKey(b), dir));
  return list;
}

function groupKey(g) {
  if (S.sort.startsWith("reward")) return stats(g.shown.map(s => s.rv[S.reward])).mean;
  if (S.sort === "adv-desc") return Math.max(...g.shown.map(s => s.adv === null ? -Infinity : s.adv));
  if (S.sort === "adv-asc") return Math.min(...g.shown.map(s => s.adv === null ? Infinity : s.adv));
  if (S.sort === "spread-desc") return stats(g.shown.map(s => s.rv[S.reward])).std;
  return null;
}

function compareGroups(a, b) {
  if (S.sort === "step-desc") return b.stepOrder - a.stepOrder;
  if (S.sort === "prompt") return a.prompt.localeCompare(b.prompt);
  if (S.sort === "order") return a.stepOrder - b.stepOrder;
  return nullsLast(groupKey(a), groupKey(b), S.sort.endsWith("-asc") ? 1 : -1);
}

function isTree(g) {
  const nodes = new Set(g.samples.map(s => s.node)), seen = new Set();
  for (const s of g.samples) {
    if (s.parent === null || s.parent < 0) continue;
    if (nodes.has(s.parent) || seen.has(s.parent)) return true;
    seen.add(s.parent);
  }
  return false;
}

function treeOf(samples) {
  const items = new Map(), roots = [];
  for (const s of samples) if (s.node !== null && !items.has(s.node)) items.set(s.node, {node: s.node, sample: s, children: []});
  for (const s of samples) {
    const item = items.get(s.node) && items.get(s.node).sample === s ? items.get(s.node) : {node: s.node, sample: s, children: []};
    if (s.parent === null || s.parent < 0 || s.parent === s.node) { roots.push(item); continue; }
    if (!items.has(s.parent)) {  // an interior node that is not in the manifest: a placeholder
      const ph = {node: s.parent, sample: null, children: []};
      items.set(s.parent, ph);
      roots.push(ph);
    }
    items.get(s.parent).children.push(item);
  }
  return roots;
}

function leavesUnder(item) {
  return item.children.length ? item.children.flatMap(leavesUnder) : item.sample ? [item.sample] : [];
}

function renderTree(items, shownKeys) {
  const ul = el("ul", {class: "tree"});
  for (const item of items) {
    const leaves = leavesUnder(item).filter(s => shownKeys.has(s.key));
    if (!leaves.length && !(item.sample && shownKeys.has(item.sample.key))) continue;
    const st = stats(leaves.map(s => s.rv[S.reward]));
    const li = el("li");
    if (item.children.length) {
      li.append(el("div", {class: "node-label", text: `node ${item.node}` + (item.sample ? "" : " (not saved)") +
        ` · ${leaves.length} leaves · mean ${S.reward} ${formatNumber(st.mean)}`}));
      if (item.sample && shownKeys.has(item.sample.key)) li.append(el("div", {class: "tiles"}, tile(item.sample)));
      const leafKids = item.children.filter(c => !c.children.length && c.sample && shownKeys.has(c.sample.key));
      if (leafKids.length) li.append(el("div", {class: "tiles"}, ...sortSamples(leafKids.map(c => c.sample)).map(x => tile(x))));
      const inner = item.children.filter(c => c.children.length);
      if (inner.length) li.append(renderTree(inner, shownKeys));
    } else li.append(el("div", {class: "tiles"}, tile(item.sample)));
    ul.append(li);
  }
  return ul;
}

function groupCard(g, allSteps) {
  const st = stats(g.shown.map(s => s.rv[S.reward]));
  const head = el("header", {class: "group-head"},
    el("h3", {class: "prompt", text: g.prompt}),
    el("div", {class: "chips"},
      g.task ? el("span", {class: "chip task", text: g.task}) : null,
      allSteps ? el("span", {class: "chip", text: g.step}) : null,
      el("span", {class: "chip", text: `slot ${g.slot} · group ${g.group}`}),
      el("span", {class: "chip", text: `${g.shown.length}/${g.samples.length} samples · ${S.reward || "reward"} ${formatNumber(st.mean)} ± ${formatNumber(st.std)}`}),
      el("button", {type: "button", class: "link", text: "compare across steps",
                    onclick: () => setState({view: "compare", prompt: g.prompt})})));
  const card = el("section", {class: "group", data: {step: g.step}}, head);
  const meta = el("details", {class: "meta"}, el("summary", {text: "metadata"}),
                  el("pre", {text: JSON.stringify(g.metadata, null, 1)}));
  card.append(meta);
  if (isTree(g)) {
    card.classList.add("is-tree");
    card.append(renderTree(treeOf(g.samples), new Set(g.shown.map(s => s.key))));
  } else card.append(el("div", {class: "tiles"}, ...sortSamples(g.shown.slice()).map(s => tile(s))));
  return card;
}

function pager(total, perPage) {
  const pages = Math.max(1, Math.ceil(total / perPage));
  if (S.page > pages) S.page = pages;
  const go = p => () => { S.page = p; writeHash(); render(); window.scrollTo(0, 0); };
  return el("div", {class: "pager"},
    el("button", {type: "button", text: "« first", disabled: S.page <= 1, onclick: go(1)}),
    el("button", {type: "button", text: "‹ prev", class: "prev", disabled: S.page <= 1, onclick: go(S.page - 1)}),
    el("span", {class: "page-of", text: `page ${S.page} of ${pages}`}),
    el("button", {type: "button", text: "next ›", class: "next", disabled: S.page >= pages, onclick: go(S.page + 1)}),
    el("button", {type: "button", text: "last »", disabled: S.page >= pages, onclick: go(pages)}));
}

function samplesControls() {
  const steps = G.index.steps;
  const stepOptions = [{value: "*", text: `all steps (${G.index.num_samples})`}];
  for (const kind of ["train", "eval"]) {
    const list = steps.filter(s => s.kind === kind);
    if (list.length) stepOptions.push({group: kind === "train" ? "training steps" : "evaluation steps",
                                      options: list.slice().reverse().map(s => ({value: s.name, text: stepLabel(s)}))});
  }
  const q = el("input", {type: "search", value: S.q, placeholder: "prompt contains…", class: "q"});
  q.addEventListener("input", () => { clearTimeout(q.timer); q.timer = setTimeout(() => setState({q: q.value}), 250); });
  const num = (key, ph) => {
    const i = el("input", {type: "number", step: "any", value: S[key], placeholder: ph, class: key});
    i.addEventListener("change", () => setState({[key]: i.value}));
    return i;
  };
  const rewards = G.index.reward_names.map(r => ({value: r, text: r}));
  return el("div", {class: "controls"},
    field("step", select(stepOptions, S.step, v => setState({step: v}), "step")),
    field("search", q),
    field("task", select([{value: "", text: "all tasks"}].concat(G.index.tasks.map(t => ({value: t, text: t}))), S.task,
                         v => setState({task: v}), "task")),
    field("reward", select(rewards.length ? rewards : [{value: "", text: "none"}], S.reward, v => setState({reward: v}), "reward")),
    field("min", num("min", "min")), field("max", num("max", "max")),
    field("sort", select([
      {value: "order", text: "as sampled"}, {value: "step-desc", text: "newest step first"},
      {value: "reward-desc", text: "reward ↓"}, {value: "reward-asc", text: "reward ↑"},
      {value: "adv-desc", text: "advantage ↓"}, {value: "adv-asc", text: "advantage ↑"},
      {value: "spread-desc", text: "reward spread in group ↓"}, {value: "prompt", text: "prompt A–Z"}],
      S.sort, v => setState({sort: v}), "sort")),
    field("flags", select([{value: "", text: "any"}, {value: "flagged", text: "flagged"}, {value: "unflagged", text: "not flagged"}]
      .concat(LABELS.map(l => ({value: "label:" + l, text: l}))), S.flag, v => setState({flag: v}), "flags")),
    field("show", select([{value: "groups", text: "prompt groups"}, {value: "samples", text: "single samples"}], S.layout,
                         v => setState({layout: v}), "layout")));
}

async function renderSamples(app) {
  const names = S.step === "*" ? G.index.steps.map(s => s.name) : [S.step];
  if (names.length > 1 && names.some(n => !G.steps[n])) app.append(el("p", {class: "muted", text: `loading ${names.length} steps…`}));
  await Promise.all(names.map(loadStep));
  const q = S.q.trim().toLowerCase();
  const groups = [];
  for (const n of names) for (const g of G.steps[n].groups) {
    if (S.task && g.task !== S.task) continue;
    if (q && !g.prompt.toLowerCase().includes(q)) continue;
    g.shown = g.samples.filter(passesSample);
    if (g.shown.length) groups.push(g);
  }
  const total = groups.reduce((a, g) => a + g.shown.length, 0);
  const out = [samplesControls()];
  if (S.layout === "samples") {
    const list = groups.flatMap(g => g.shown);
    if (S.sort === "step-desc") list.sort((a, b) => b.group.stepOrder - a.group.stepOrder);
    else if (S.sort === "prompt") list.sort((a, b) => a.group.prompt.localeCompare(b.group.prompt));
    else if (S.sort === "spread-desc") { groups.forEach(g => { g._spread = stats(g.shown.map(s => s.rv[S.reward])).std; });
                                         list.sort((a, b) => nullsLast(a.group._spread, b.group._spread, -1)); }
    else sortSamples(list);
    const pg = pager(list.length, SAMPLES_PER_PAGE), start = (S.page - 1) * SAMPLES_PER_PAGE;
    out.push(el("p", {class: "summary", text: `${total} samples in ${groups.length} groups`}), pg);
    out.push(el("div", {class: "tiles flat"}, ...list.slice(start, start + SAMPLES_PER_PAGE).map(s => tile(s, {prompt: true, step: names.length > 1}))));
    out.push(pager(list.length, SAMPLES_PER_PAGE));
  } else {
    groups.sort(compareGroups);
    const pg = pager(groups.length, GROUPS_PER_PAGE), start = (S.page - 1) * GROUPS_PER_PAGE;
    out.push(el("p", {class: "summary", text: `${total} samples in ${groups.length} groups`}), pg);
    out.push(...groups.slice(start, start + GROUPS_PER_PAGE).map(g => groupCard(g, names.length > 1)));
    out.push(pager(groups.length, GROUPS_PER_PAGE));
  }
  if (!groups.length) out.push(el("p", {class: "empty", text: G.index.steps.length ? "no samples match" : "no samples written yet"}));
  app.replaceChildren(...out);
}

/* ---------- compare view: one prompt across steps ---------- */

async function renderCompare(app) {
  if (!G.prompts) G.prompts = await loadScript("prompts", "", "data/prompts.js?v=" + G.index.steps.length);
  const pq = el("input", {type: "search", value: S.pq, placeholder: "find a prompt…", class: "pq"});
  pq.addEventListener("input", () => { clearTimeout(pq.timer); pq.timer = setTimeout(() => setState({pq: pq.value}), 250); });
  const needle = S.pq.trim().toLowerCase();
  const matches = G.prompts.filter(p => !needle || p.prompt.toLowerCase().includes(needle));
  if (!S.prompt && matches.length) S.prompt = matches[0].prompt;
  const list = el("ol", {class: "prompt-list"});
  for (const p of matches.slice(0, 200)) {
    list.append(el("li", {class: p.prompt === S.prompt ? "sel" : ""},
      el("a", {href: hashFor({prompt: p.prompt}), text: p.prompt}),
      el("span", {class: "muted small", text: ` · ${p.steps.length} step${p.steps.length === 1 ? "" : "s"}`})));
  }
  if (matches.length > 200) list.append(el("li", {class: "muted", text: `… ${matches.length - 200} more: refine the search`}));
  const entry = G.prompts.find(p => p.prompt === S.prompt);
  const both = el("input", {type: "checkbox", checked: S.all !== "1", onchange: () => setState({all: both.checked ? "" : "1"})});
  const right = el("div", {class: "compare-main"},
    el("label", {class: "field inline"}, both, el("span", {text: "base vs now only (first and last step with this prompt)"})));
  if (entry) {
    right.prepend(el("h2", {class: "prompt", text: entry.prompt}));
    if (entry.steps.length === 1) right.append(el("p", {class: "muted", text: "sampled in one step so far"}));
    let steps = entry.steps;
    if (S.all !== "1" && steps.length > 2) steps = [steps[0], steps[steps.length - 1]];
    await Promise.all(steps.map(loadStep));
    for (const name of steps) {
      const samples = G.steps[name].groups.filter(g => g.prompt === entry.prompt).flatMap(g => g.samples);
      const info = G.index.steps.find(s => s.name === name);
      const st = stats(samples.map(s => s.rv[S.reward]));
      right.append(el("section", {class: "compare-row", data: {step: name}},
        el("h3", {text: `${stepLabel(info)} · ${S.reward} ${formatNumber(st.mean)} ± ${formatNumber(st.std)}`}),
        el("div", {class: "tiles"}, ...sortSamples(samples.slice()).map(s => tile(s)))));
    }
  } else right.append(el("p", {class: "empty", text: "no prompt selected"}));
  app.replaceChildren(el("div", {class: "compare"}, el("aside", {}, field("prompt", pq), list), right));
}

/* ---------- charts view ---------- */

function rewardKeys(series) {
  const found = new Map();
  for (const k of Object.keys(series)) {
    const m = k.match(/^reward\/(.+?)(?:_mean|\/mean)$/);
    if (m) found.set(m[1], {mean: k, std: series[`reward/${m[1]}_std`] ? `reward/${m[1]}_std` : `reward/${m[1]}/std`});
  }
  return found;
}

function heldOutKey(series) {
  if (series["eval/mean_score"]) return "eval/mean_score";
  if (series["eval/strict_accuracy"]) return "eval/strict_accuracy";
  return Object.keys(series).find(k => k.startsWith("eval/") && !/per_task|task\/|num_|seconds|guidance/.test(k)) || null;
}

async function renderCharts(app) {
  if (!G.metrics) G.metrics = await loadScript("metrics", "", "data/metrics.js?v=" + encodeURIComponent(G.index.metrics_version));
  const {iteration: xs, series} = G.metrics;
  const out = [];
  const rk = rewardKeys(series);
  const names = Array.from(new Set(G.index.reward_names.concat(Array.from(rk.keys()))));
  const rewardCharts = el("div", {class: "charts"});
  for (const r of names) {
    const sr = [];
    const keys = rk.get(r);
    if (keys) {
      const mean = series[keys.mean], std = series[keys.std];
      sr.push({name: `${r} (training batch mean${std ? " ± std" : ""})`, xs, ys: mean,
               lo: std ? mean.map((m, i) => m === null || std[i] === null ? null : m - std[i]) : null,
               hi: std ? mean.map((m, i) => m === null || std[i] === null ? null : m + std[i]) : null});
    }
    for (const kind of ["train", "eval"]) {
      const steps = G.index.steps.filter(s => s.kind === kind && s.iteration !== null && s.reward_means[r] !== undefined);
      if (steps.length) sr.push({name: `${r} (saved ${kind} samples)`, xs: steps.map(s => s.iteration),
                                 ys: steps.map(s => s.reward_means[r]), dots: true});
    }
    rewardCharts.append(lineChart({title: `reward: ${r}`, series: sr}));
  }
  out.push(el("h2", {text: "Rewards"}), rewardCharts);

  const held = heldOutKey(series);
  if (held) {
    const proxyName = names.find(r => rk.has(r));
    const proxy = proxyName ? series[rk.get(proxyName).mean] : null;
    const panel = el("div", {class: "charts"});
    const sr = [{name: `held-out: ${held}`, xs, ys: series[held], dots: false}];
    if (proxy) sr.unshift({name: `proxy: ${proxyName} (training)`, xs, ys: proxy});
    panel.append(lineChart({title: "proxy vs held-out reward", series: sr}));
    if (proxy) {  // gap at each evaluation: mean proxy since the previous evaluation minus held-out
      const gx = [], gy = [];
      let since = [];
      xs.forEach((x, i) => {
        if (proxy[i] !== null) since.push(proxy[i]);
        if (series[held][i] !== null && since.length) { gx.push(x); gy.push(stats(since).mean - series[held][i]); since = []; }
      });
      panel.append(lineChart({title: "gap: proxy − held-out", series: [{name: "gap", xs: gx, ys: gy}],
        note: "A gap that widens while the proxy reward rises is the usual sign of reward hacking: look at the top-reward samples of the latest steps."}));
    }
    const tasks = Object.keys(series).filter(k => /^eval\/(per_task|task)\//.test(k));
    if (tasks.length) panel.append(lineChart({title: "held-out reward per task",
      series: tasks.map(k => ({name: k.replace(/^eval\/(per_task|task)\//, ""), xs, ys: series[k]}))}));
    out.push(el("h2", {text: "Proxy vs held-out"}), panel);
  }

  const wanted = ["loss", "approx_kl", "kl", "kl_ref", "grad_norm", "lr", "advantage/abs_mean", "advantage/std",
                  "clip_frac_high", "clip_frac_low", "max_abs_ratio_minus_1_epoch0", "zero_std_group_fraction",
                  "nan_reward_fraction", "time/iteration"];
  const train = el("div", {class: "charts"});
  for (const k of wanted.filter(k => series[k])) train.append(lineChart({title: k, series: [{name: k, xs, ys: series[k]}]}));
  out.push(el("h2", {text: "Training"}), train);

  const keys = Object.keys(series).sort();
  if (keys.length) {
    if (!S.metric || !series[S.metric]) S.metric = keys[0];
    out.push(el("h2", {text: "Any metric"}),
             field("metric", select(keys.map(k => ({value: k, text: k})), S.metric, v => setState({metric: v}, true), "metric")),
             el("div", {class: "charts"}, lineChart({title: S.metric, series: [{name: S.metric, xs, ys: series[S.metric]}]})));
  } else out.push(el("p", {class: "empty", text: "metrics.jsonl has no values yet"}));
  app.replaceChildren(...out);
}

/* ---------- review view ---------- */

async function renderReview(app) {
  const keys = Object.keys(G.flags).sort();
  const counts = {};
  for (const k of keys) for (const l of G.flags[k].labels) counts[l] = (counts[l] || 0) + 1;
  const file = el("input", {type: "file", accept: "application/json,.json", class: "import",
                            onchange: () => file.files[0] && importFlags(file.files[0])});
  const out = [
    el("p", {text: G.served ? `Flags are saved to ${G.index.run_path}/review/flags.json as you click.`
                            : "Static site: flags are kept in this browser. Export them to save them (as review/flags.json in the run directory)."}),
    el("div", {class: "controls"},
      el("button", {type: "button", class: "export", text: `export ${keys.length} flags (JSON)`, onclick: exportFlags}),
      G.served ? null : field("import", file)),
    el("p", {class: "summary", text: keys.length ? Object.entries(counts).map(([l, n]) => `${l}: ${n}`).join(" · ") || `${keys.length} notes`
                                                 : "no flags yet: use the buttons under each sample"})];
  const steps = Array.from(new Set(keys.map(k => G.flags[k].step).filter(s => G.index.steps.some(x => x.name === s))));
  await Promise.all(steps.map(loadStep));
  const byKey = new Map();
  for (const s of steps) for (const g of G.steps[s].groups) for (const x of g.samples) byKey.set(x.key, x);
  const tiles = keys.map(k => byKey.get(k)).filter(Boolean).map(s => tile(s, {prompt: true, step: true}));
  out.push(el("div", {class: "tiles flat"}, ...tiles));
  const missing = keys.filter(k => !byKey.has(k));
  if (missing.length) {
    out.push(el("h3", {text: "flags of samples not in this build"}));
    out.push(el("ul", {}, ...missing.map(k => el("li", {text: `${k}: ${G.flags[k].labels.join(", ")} ${G.flags[k].note}`}))));
  }
  app.replaceChildren(...out);
}

function renderRun(app) {
  const i = G.index;
  app.replaceChildren(
    el("p", {text: `${i.run_path} · ${i.steps.length} steps · ${i.num_samples} samples · built ${i.built}`}),
    el("h2", {text: "config.yaml"}), el("pre", {class: "config", text: i.config || "(no config.yaml)"}));
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
      if (r.ok) { G.flags = (await r.json()).flags || {}; G.served = true; }
    } catch (e) { /* a plain static server: flags stay in this browser */ }
  }
  if (!G.served) {
    try { G.flags = await loadScript("flags", "", "data/flags.js?v=" + Date.now()); } catch (e) { G.flags = {}; }
    const local = JSON.parse(localStorage.getItem(G.lsKey) || "{}");
    for (const [k, f] of Object.entries(local)) { if (f.deleted) delete G.flags[k]; else G.flags[k] = f; }
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
