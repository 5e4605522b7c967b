/* flowgrpo gallery: the views (samples with trees, compare, charts, review, run); each renders into
   a detached element that gallery.js swaps in. Loaded before gallery.js, which holds the state (S),
   the data (G), the DOM helpers and the sample tiles. */
"use strict";

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
      li.append(el("div", {class: "node-label", title: NODE_HELP, text: `tree node ${item.node}` + (item.sample ? "" : " (not saved)") +
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

/* The group's true size and the reward statistics its advantages were computed from (over every sample,
   saved or not), when the manifest records them; else the saved samples' own, labelled as such. */
function groupChips(g) {
  const saved = g.samples.length, shown = g.shown.length, size = g.size === undefined ? null : g.size;
  const reward = S.reward || "reward", whole = g.statsBy ? g.statsBy[S.reward] : null;
  const filtered = shown < saved ? ` · ${shown} shown` : "";
  const own = stats(g.shown.map(s => s.rv[S.reward]));
  if (size === 1 && saved === 1) return [el("span", {class: "chip count", text: "1 sample"}),
                                         el("span", {class: "chip stats", text: `${reward} ${formatNumber(own.mean)}`})];
  const count = el("span", {class: "chip count", text: size === null ? `${saved} sample${saved === 1 ? "" : "s"}${filtered}` : `group of ${size} · ${saved} saved${filtered}`,
    title: size === null ? "this manifest does not record the group's size: these are the saved samples"
      : `the group has ${size} samples; its advantages were computed over all ${size}; the run saved ${saved}`});
  if (!whole || whole[0] === null) {
    return [count, el("span", {class: "chip stats", text: `${reward} ${formatNumber(own.mean)} ± ${formatNumber(own.std)} over the ${shown} shown`,
      title: "mean ± population std of the shown samples only (the manifest does not record the whole group's)"})];
  }
  const [mean, std, n] = whole;
  const over = n === size ? `all ${size}` : `${n} of ${size} (NaN left out)`;
  return [count, el("span", {class: "chip stats", text: `${reward} ${formatNumber(mean)} ± ${formatNumber(std)} over ${over}`,
    title: `mean ± population std of ${reward} over every sample of the group, saved or not: with one reward and ` +
           `advantage.std=group, the baseline and scale of its advantages, A = (r − mean)/(std + eps). ` +
           `The ${shown} shown: ${formatNumber(own.mean)} ± ${formatNumber(own.std)}.`})];
}

/* Samples of a prompt that start from one x_T (a plan's initial_noise="shared") differ by their SDE step noise. */
function sharedNoiseChip(g) {
  const seeds = new Set(g.samples.map(s => s.seed));
  if (g.samples.length < 2 || seeds.size !== 1 || g.samples[0].seed === null || g.samples[0].seed === undefined) return null;
  return el("span", {class: "chip shared-noise", text: "one starting noise",
    title: `every sample of this group starts from the same x_T (noise seed ${g.samples[0].seed}); ` +
           "they differ by the noise of their SDE steps, drawn per tree node"});
}

/* The prompt's condition images (an edit's source), as tiles in front of its samples: source beside result. */
function sourceTiles(g) {
  return (g.sources || []).filter(Boolean).map((src, i, all) => el("figure", {class: "tile source"},
    el("div", {class: "media"}, el("img", {src, alt: "source image", loading: "lazy"})),
    el("figcaption", {}, el("p", {class: "muted small", text: all.length > 1 ? `source ${i + 1}` : "source"}))));
}

function groupCard(g, allSteps) {
  const head = el("header", {class: "group-head"},
    el("h3", {class: "prompt", text: g.prompt}),
    el("div", {class: "chips"},
      g.task ? el("span", {class: "chip task", text: g.task}) : null,
      allSteps ? el("span", {class: "chip", text: g.step}) : null,
      el("span", {class: "chip", text: `slot ${g.slot} · group ${g.group}`}),
      ...groupChips(g), sharedNoiseChip(g),
      el("button", {type: "button", class: "link", text: "compare across steps",
                    onclick: () => setState({view: "compare", prompt: g.prompt})})));
  const card = el("section", {class: "group", data: {step: g.step}}, head);
  const meta = el("details", {class: "meta"}, el("summary", {text: "metadata"}),
                  el("pre", {text: JSON.stringify(g.metadata, null, 1)}));
  card.append(meta);
  if (isTree(g)) {
    card.classList.add("is-tree");
    card.append(renderTree(treeOf(g.samples), new Set(g.shown.map(s => s.key))));
  } else card.append(el("div", {class: "tiles"}, ...sourceTiles(g), ...sortSamples(g.shown.slice()).map(s => tile(s))));
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
  const out = [samplesControls(), el("p", {class: "muted small id-legend", text:
    "tree node: a state in the prompt's sampling tree (roots are starting noises; each denoising step makes a child, " +
    "several where the tree branches; a saved sample is a leaf) · noise seed: the seed of a sample's starting noise · " +
    "group of N: every sample its advantages were computed over, saved or not"})];
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
      const groups = G.steps[name].groups.filter(g => g.prompt === entry.prompt);
      const samples = groups.flatMap(g => g.samples);
      const info = G.index.steps.find(s => s.name === name);
      const st = stats(samples.map(s => s.rv[S.reward]));
      right.append(el("section", {class: "compare-row", data: {step: name}},
        el("h3", {text: `${stepLabel(info)} · ${S.reward} ${formatNumber(st.mean)} ± ${formatNumber(st.std)}`}),
        el("div", {class: "tiles"}, ...(groups.length ? sourceTiles(groups[0]) : []),
           ...sortSamples(samples.slice()).map(s => tile(s)))));
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
  const alarms = series["watch/alarms"] || [];  // the reward-hacking watch (docs/hacking.md): a rule per alarm
  const marks = xs.map((x, i) => alarms[i] ? {x, text: `iteration ${x}: the reward-hacking watch raised ${alarms[i]} ` +
    `alarm(s): a guard moved against the rising training reward (the run's console and log name it)`} : null).filter(Boolean);
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
    rewardCharts.append(lineChart({title: `reward: ${r}`, series: sr, marks}));
  }
  out.push(el("h2", {text: "Rewards"}), rewardCharts);

  const held = heldOutKey(series);
  if (held) {
    const proxyName = names.find(r => rk.has(r));
    const proxy = proxyName ? series[rk.get(proxyName).mean] : null;
    const panel = el("div", {class: "charts"});
    const sr = [{name: `held-out: ${held}`, xs, ys: series[held], dots: false}];
    if (proxy) sr.unshift({name: `proxy: ${proxyName} (training)`, xs, ys: proxy});
    panel.append(lineChart({title: "proxy vs held-out reward", series: sr, marks}));
    if (proxy) {  // gap at each evaluation: mean proxy since the previous evaluation minus held-out
      const gx = [], gy = [];
      let since = [];
      xs.forEach((x, i) => {
        if (proxy[i] !== null) since.push(proxy[i]);
        if (series[held][i] !== null && since.length) { gx.push(x); gy.push(stats(since).mean - series[held][i]); since = []; }
      });
      panel.append(lineChart({title: "gap: proxy − held-out", series: [{name: "gap", xs: gx, ys: gy}], marks,
        note: "A gap that widens while the proxy reward rises is the usual sign of reward hacking: look at the top-reward samples of the latest steps."}));
    }
    const tasks = Object.keys(series).filter(k => /^eval\/(per_task|task)\//.test(k));
    if (tasks.length) panel.append(lineChart({title: "held-out reward per task",
      series: tasks.map(k => ({name: k.replace(/^eval\/(per_task|task)\//, ""), xs, ys: series[k]}))}));
    out.push(el("h2", {text: "Proxy vs held-out"}), panel);
  }

  const guards = Object.keys(series).filter(k => /^guard\/[^/]+$/.test(k) && !/_(change|se)$/.test(k));
  if (guards.length) {  // the watch's guards on the held-out samples, with their alarms
    const panel = el("div", {class: "charts"});
    for (const k of guards) panel.append(lineChart({title: k, series: [{name: k, xs, ys: series[k]}], marks}));
    out.push(el("h2", {text: "Reward-hacking guards"}), panel);
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
