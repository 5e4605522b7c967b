/* flowgrpo gallery: line charts drawn as inline SVG (no chart library, nothing from the network).

   lineChart({title, note, series: [{name, xs, ys, lo?, hi?, dots?}], xLabel}) -> <figure>
   xs/ys are arrays of numbers (null = not logged there); lo/hi draw a band (mean ± std);
   dots draws markers instead of a line. Hovering shows the nearest values. spec.marks ([{x, text}]) draws a
   dashed rule at each x: the iterations where the reward-hacking watch raised an alarm. */
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

function svgEl(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}

function formatNumber(v) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) { hi = lo + 1; lo = lo - 1; }
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || 10 * mag;
  const ticks = [];
  for (let k = Math.ceil(lo / step); k * step <= hi + step * 1e-9; k++) ticks.push(k === 0 ? 0 : Number((k * step).toPrecision(12)));
  return ticks;
}

/* At most ~max points per series: the mean of each bucket (keeps long runs light to draw). */
function thin(xs, ys, max) {
  if (xs.length <= max) return [xs, ys];
  const size = Math.ceil(xs.length / max), ox = [], oy = [];
  for (let i = 0; i < xs.length; i += size) {
    let sx = 0, sy = 0, n = 0;
    for (let j = i; j < Math.min(i + size, xs.length); j++) {
      if (ys[j] !== null && xs[j] !== null) { sx += xs[j]; sy += ys[j]; n++; }
    }
    ox.push(n ? sx / n : xs[i]); oy.push(n ? sy / n : null);
  }
  return [ox, oy];
}

function lineChart(spec) {
  const W = 560, H = 230, L = 58, R = 12, T = 12, B = 34;
  const fig = document.createElement("figure");
  fig.className = "chart";
  const cap = document.createElement("figcaption");
  cap.textContent = spec.title;
  fig.appendChild(cap);
  const series = spec.series.filter(s => s.ys.some(v => v !== null && v !== undefined));
  if (!series.length) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = "no values logged";
    fig.appendChild(p);
    return fig;
  }
  let xmin = Infinity, xmax = -Infinity, ymin = Infinity, ymax = -Infinity;
  for (const s of series) {
    s.ys.forEach((y, i) => {
      const x = s.xs[i];
      if (y === null || y === undefined || x === null) return;
      xmin = Math.min(xmin, x); xmax = Math.max(xmax, x);
      ymin = Math.min(ymin, y, s.lo && s.lo[i] !== null ? s.lo[i] : y);
      ymax = Math.max(ymax, y, s.hi && s.hi[i] !== null ? s.hi[i] : y);
    });
  }
  if (xmax === xmin) { xmin -= 1; xmax += 1; }
  if (ymax === ymin) { ymin -= Math.abs(ymin) * 0.1 || 1; ymax += Math.abs(ymax) * 0.1 || 1; }
  const pad = (ymax - ymin) * 0.05;
  ymin -= pad; ymax += pad;
  const sx = x => L + (x - xmin) / (xmax - xmin) * (W - L - R);
  const sy = y => T + (1 - (y - ymin) / (ymax - ymin)) * (H - T - B);
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img"});
  svgEl("title", {}, svg).textContent = spec.title;
  const yTicks = niceTicks(ymin, ymax, 5), xTicks = niceTicks(xmin, xmax, 6);
  for (const t of yTicks) {
    if (t < ymin || t > ymax) continue;
    svgEl("line", {x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid"}, svg);
    svgEl("text", {x: L - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick"}, svg).textContent = formatNumber(t);
  }
  for (const t of xTicks) {
    if (t < xmin || t > xmax) continue;
    svgEl("text", {x: sx(t), y: H - B + 16, "text-anchor": "middle", class: "tick"}, svg).textContent = formatNumber(t);
  }
  svgEl("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis-label"}, svg).textContent =
    spec.xLabel || "iteration";
  svgEl("rect", {x: L, y: T, width: W - L - R, height: H - T - B, class: "frame"}, svg);
  // marks: iterations where the reward-hacking watch raised an alarm, a dashed rule each with its text on hover
  for (const m of spec.marks || []) {
    if (m.x < xmin || m.x > xmax) continue;
    const g = svgEl("g", {class: "alarm", "data-x": m.x}, svg);
    svgEl("title", {}, g).textContent = m.text;
    svgEl("line", {x1: sx(m.x), x2: sx(m.x), y1: T, y2: H - B}, g);
    svgEl("text", {x: sx(m.x) + 3, y: T + 10, class: "alarm-label"}, g).textContent = "!";
  }

  series.forEach((s, k) => {
    const color = s.color || CHART_COLORS[k % CHART_COLORS.length];
    if (s.lo && s.hi) {  // band: upper edge forward, lower edge back, per unbroken run
      const [bx, bh] = thin(s.xs, s.hi, 800), [, bl] = thin(s.xs, s.lo, 800);
      let upper = [], lower = [];
      const flush = () => {
        if (upper.length > 1) svgEl("path", {d: "M" + upper.concat(lower.reverse()).join("L") + "Z", fill: color, "fill-opacity": 0.12, stroke: "none"}, svg);
        upper = []; lower = [];
      };
      bx.forEach((x, i) => {
        if (bh[i] === null || bl[i] === null || x === null) return flush();
        upper.push(`${sx(x).toFixed(1)},${sy(bh[i]).toFixed(1)}`);
        lower.push(`${sx(x).toFixed(1)},${sy(bl[i]).toFixed(1)}`);
      });
      flush();
    }
    const [xs, ys] = s.dots ? [s.xs, s.ys] : thin(s.xs, s.ys, 800);
    if (s.dots) {
      xs.forEach((x, i) => {
        if (ys[i] !== null && x !== null) svgEl("circle", {cx: sx(x), cy: sy(ys[i]), r: 3.5, fill: color}, svg);
      });
    } else {
      // metrics logged every k iterations (evaluations) are null in between: the line joins them
      let d = "";
      xs.forEach((x, i) => {
        if (ys[i] === null || x === null) return;
        d += (d ? "L" : "M") + sx(x).toFixed(1) + "," + sy(ys[i]).toFixed(1);
      });
      svgEl("path", {d, fill: "none", stroke: color, "stroke-width": 1.6}, svg);
      if (ys.filter(v => v !== null).length <= 60) {  // few values: mark each one
        xs.forEach((x, i) => { if (ys[i] !== null && x !== null) svgEl("circle", {cx: sx(x), cy: sy(ys[i]), r: 2.5, fill: color}, svg); });
      }
    }
    s.color = color;
  });

  // hover: a rule at the nearest logged x and each series' value there
  const rule = svgEl("line", {y1: T, y2: H - B, class: "rule", visibility: "hidden"}, svg);
  const label = svgEl("text", {x: L + 6, y: T + 14, class: "hover-label"}, svg);
  svg.addEventListener("mousemove", ev => {
    const box = svg.getBoundingClientRect();
    const x = xmin + ((ev.clientX - box.left) / box.width * W - L) / (W - L - R) * (xmax - xmin);
    let best = null;
    for (const s of series) s.xs.forEach((v, i) => {
      if (s.ys[i] !== null && v !== null && (best === null || Math.abs(v - x) < Math.abs(best - x))) best = v;
    });
    if (best === null) return;
    rule.setAttribute("x1", sx(best)); rule.setAttribute("x2", sx(best)); rule.setAttribute("visibility", "visible");
    const parts = series.map(s => {
      const i = s.xs.indexOf(best);
      return i >= 0 && s.ys[i] !== null ? `${s.name} ${formatNumber(s.ys[i])}` : null;
    }).filter(Boolean);
    label.textContent = `${spec.xLabel || "iteration"} ${formatNumber(best)}: ` + parts.join(", ");
  });
  svg.addEventListener("mouseleave", () => { rule.setAttribute("visibility", "hidden"); label.textContent = ""; });
  fig.appendChild(svg);

  const legend = document.createElement("div");
  legend.className = "legend";
  for (const s of series) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = s.color;
    item.append(swatch, document.createTextNode(s.name));
    legend.appendChild(item);
  }
  if ((spec.marks || []).length) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.className = "alarm-swatch";
    item.append(swatch, document.createTextNode(`reward-hacking alarm (${spec.marks.length})`));
    legend.appendChild(item);
  }
  fig.appendChild(legend);
  if (spec.note) {
    const p = document.createElement("p");
    p.className = "muted small";
    p.textContent = spec.note;
    fig.appendChild(p);
  }
  return fig;
}
