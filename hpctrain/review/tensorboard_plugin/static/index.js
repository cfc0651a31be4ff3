// The hpctrain tab: the sweep's runs, queue, failures and search history, re-read every 2 s.
// Plain JavaScript, no dependencies: TensorBoard loads this module in an iframe and calls render().

const POLL_MS = 2000;
const PAGE_ROWS = 500;  // rows drawn at a time: a 10,000-run sweep is 20 pages, not 10,000 rows redrawn every 2 s
let page = 0;
const MAX_FAILED_SHOWN = 100;  // failed runs drawn with their error; the count says how many more
const STATE_COLOURS = {
  queued: "#b58900", running: "#268bd2", requeued: "#d33682", retrying: "#d33682", completed: "#2e7d32",
  pruned: "#3949ab", failed: "#c62828", timeout: "#e53935", hung: "#ad1457", cancelled: "#757575",
};
const CSS = `
  body { font: 13px/1.4 Roboto, sans-serif; margin: 16px; color: #212121; }
  h2 { font-size: 15px; margin: 18px 0 6px; }
  table { border-collapse: collapse; }
  th, td { padding: 2px 8px; text-align: left; border-bottom: 1px solid #eee; white-space: nowrap; }
  th { position: sticky; top: 0; background: #fafafa; }
  td.n { text-align: right; font-variant-numeric: tabular-nums; }
  .state { font-weight: 500; }
  .problems { color: #c62828; } .warnings { color: #8d6e00; }
  pre { background: #f5f5f5; padding: 6px; margin: 4px 0 10px; max-height: 240px; overflow: auto; }
  .meta { color: #616161; }
  .stale { color: #c62828; }
  .errline { color: #c62828; font-family: monospace; }
  .straggler { color: #8d6e00; }
`;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

function num(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value !== "number") return esc(value);
  return Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-3) ? value.toExponential(3) : String(+value.toPrecision(5));
}

function progress(run) {
  if (run.step === null || run.step === undefined) return run.max_steps ? `-/${run.max_steps}` : "-";
  return run.max_steps ? `${run.step}/${run.max_steps}` : String(run.step);
}

function stateCell(state) {
  return `<span class="state" style="color:${STATE_COLOURS[state] || "inherit"}">${esc(state)}</span>`;
}

function header(data, stale) {
  const counts = Object.entries(data.counts || {}).map(([s, n]) => `${n} ${stateCell(s)}`).join(", ");
  const objective = data.objective ? ` &middot; objective ${esc(data.objective.metric)} (${esc(data.objective.mode)})` : "";
  const when = new Date().toLocaleTimeString();
  return `<div class="meta" id="sweep">sweep <b>${esc(data.sweep_dir)}</b> (${esc(data.launcher || "?")})${objective}</div>
    <div id="counts">${(data.runs || []).length} runs${counts ? ": " + counts : ""}</div>
    ${data.cost && data.cost.line ? `<div id="cost">${esc(data.cost.line)}${data.cost.redone ? `<div id="redone">${esc(data.cost.redone)}</div>` : ""}</div>` : ""}
    <div class="meta ${stale ? "stale" : ""}" id="updated">${stale ? esc(stale) : "updated " + esc(when) + ", every 2 s"}</div>`;
}

function lines(cls, id, items) {
  if (!items || !items.length) return "";
  return `<div class="${cls}" id="${id}">${items.map((p) => `<div>${esc(p)}</div>`).join("")}</div>`;
}

function runsTable(data) {
  const search = data.search !== null && data.search !== undefined;
  const staged = (data.runs || []).some((r) => r.stage || r.parent !== null && r.parent !== undefined);
  const objectiveName = data.objective ? esc(data.objective.metric) : "objective";
  const head = `<tr><th>${search ? "trial" : "#"}</th><th>${esc((data.swept || []).join(", ") || "overrides")}</th>
    <th>state</th><th>progress</th><th>${objectiveName}</th>${staged ? "<th>rung / interval</th>" : ""}<th>restarts</th>
    <th>elapsed</th><th>GPU-h</th><th>GPU util</th><th>log</th><th>note</th></tr>`;
  const all = data.runs || [];
  const pages = Math.max(1, Math.ceil(all.length / PAGE_ROWS));
  page = Math.min(page, pages - 1);
  const first = page * PAGE_ROWS;
  const shown = all.slice(first, first + PAGE_ROWS);
  const pager = pages > 1 ? `<div id="pager" class="meta">rows ${first + 1}-${first + shown.length} of ${all.length}
    <button data-page="${page - 1}" ${page === 0 ? "disabled" : ""}>&lsaquo; previous</button>
    <button data-page="${page + 1}" ${page === pages - 1 ? "disabled" : ""}>next &rsaquo;</button></div>` : "";
  const rows = shown.map((r) => `<tr data-idx="${r.idx}" data-state="${esc(r.state)}">
    <td class="n">${r.idx}</td><td>${esc(r.label)}</td><td>${stateCell(r.state)}</td><td class="n">${esc(progress(r))}</td>
    <td class="n objective">${num(r.objective)}${r.objective_step !== null && r.objective_step !== undefined ? ` <span class="meta">@ ${r.objective_step}</span>` : ""}</td>
    ${staged ? `<td class="stage">${esc(r.stage || "")}${r.parent !== null && r.parent !== undefined ? ` (from #${r.parent})` : ""}</td>` : ""}
    <td class="n">${r.restarts}</td><td class="n">${esc(r.elapsed)}</td>
    <td class="n">${r.estimated && r.gpu_hours !== null ? "~" : ""}${num(r.gpu_hours)}</td><td class="n">${num(r.gpu_util)}</td>
    <td>${r.log ? `<a class="log" href="./log?idx=${r.idx}" target="_blank" title="${esc(r.log)}">tail</a>` : "-"}</td><td>${esc(r.note)}${r.straggler ? `${r.note ? "; " : ""}<span class="straggler">${esc(r.straggler)}</span>` : ""}</td></tr>`);
  return `<h2>Runs</h2>${pager}<table id="runs" data-total="${all.length}" data-page="${page}">${head}${rows.join("")}</table>`;
}

function queueTable(data) {
  const queue = data.queue || [];
  if (!queue.length) return `<h2>Queue</h2><div id="queue" class="meta">nothing waiting</div>`;
  const more = data.queue_total > queue.length ? `<div class="meta">... and ${data.queue_total - queue.length} more</div>` : "";
  const rows = queue.map((q) => `<tr><td class="n">${q.idx}</td><td>${esc(q.label)}</td><td>${stateCell(q.state)}</td>
    <td>${esc(q.job_id || "-")}</td><td>${esc(q.reason || "-")}</td></tr>`);
  return `<h2>Queue (${data.queue_total})</h2><table id="queue"><tr><th>#</th><th>run</th><th>state</th><th>job</th>
    <th>reason</th></tr>${rows.join("")}</table>${more}`;
}

function failures(data) {
  const failed = data.failed || [];
  if (!failed.length) return "";
  const more = failed.length > MAX_FAILED_SHOWN
    ? `<div class="meta">... and ${failed.length - MAX_FAILED_SHOWN} more failed runs (report.md lists every error)</div>` : "";
  const items = failed.slice(0, MAX_FAILED_SHOWN).map((f) => `<div class="failed" data-idx="${f.idx}"><b>#${f.idx} ${esc(f.label)}</b>
    ${stateCell(f.state)} <span class="errline">${esc(lastLine(f.error))}</span><pre class="error">${esc(f.error || "(no error recorded)")}</pre>
    ${f.tail && f.tail.length ? `<details><summary>log tail: ${esc(f.log)}</summary><pre class="tail">${esc(f.tail.join("\n"))}</pre></details>` : ""}
    </div>`);
  return `<h2>Failed runs (${failed.length})</h2><div id="failed">${items.join("")}</div>${more}`;
}

function stragglers(data) {
  const found = data.stragglers || [];
  if (!found.length) return "";
  const items = found.map((s) => `<div class="straggler" data-idx="${s.idx}"><b>#${s.idx} ${esc(s.label)}</b> ${stateCell(s.state)}
    ${esc(s.line)}</div>`);
  return `<h2>Stragglers (${found.length})</h2><div id="stragglers">${items.join("")}</div>`;
}

function lastLine(text) {
  const found = String(text || "").split("\n").filter((l) => l.trim());
  return found.length ? found[found.length - 1].trim() : "";
}

function historySvg(search) {
  const points = (search.history || []).filter((p) => typeof p[1] === "number");
  if (!points.length) return `<h2>Optimisation history</h2><div class="meta">no trial has an objective yet</div>`;
  const W = 560, H = 220, pad = 36;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1;
  const scale = yScale(ys);
  const y0 = scale.lo, y1 = scale.hi, f = scale.f;
  const sx = (x) => pad + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - 2 * pad);
  const sy = (y) => {
    const t = y1 === y0 ? (y > y1 ? 1 : y < y0 ? 0 : 0.5)
      : (f(Math.min(Math.max(y, y0), y1)) - f(y0)) / (f(y1) - f(y0));  // outliers at the edge
    return H - pad - t * (H - 2 * pad);
  };
  const better = search.mode === "max" ? (a, b) => a > b : (a, b) => a < b;
  let best = null;
  const step = [];
  for (const [n, v, s] of [...points].sort((a, b) => a[0] - b[0])) {
    if (s === "pruned") continue;
    if (best !== null && step.length) step.push(`${sx(n).toFixed(1)},${sy(best).toFixed(1)}`);  // flat until improved
    if (best === null || better(v, best)) best = v;
    step.push(`${sx(n).toFixed(1)},${sy(best).toFixed(1)}`);
  }
  if (best !== null) step.push(`${(W - pad).toFixed(1)},${sy(best).toFixed(1)}`);  // on to the last trial
  const dots = points.map(([n, v, s]) => `<circle cx="${sx(n).toFixed(1)}" cy="${sy(v).toFixed(1)}" r="3"
    fill="${s === "pruned" ? "none" : "#1e88e5"}" stroke="${s === "pruned" ? "#9e9e9e" : "#1e88e5"}"><title>#${n}: ${num(v)} (${esc(s)})</title></circle>`);
  return `<h2>Optimisation history (${points.length} trials, ${esc(search.mode)} ${esc(search.metric)})</h2>
    <svg id="history" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">
    <line x1="${pad}" y1="${H - pad}" x2="${W - pad}" y2="${H - pad}" stroke="#bbb"/><line x1="${pad}" y1="${pad}" x2="${pad}" y2="${H - pad}" stroke="#bbb"/>
    <text x="${pad}" y="${H - 10}" font-size="10">trial ${x0}</text><text x="${W - pad}" y="${H - 10}" font-size="10" text-anchor="end">${x1}</text>
    <text x="4" y="${pad}" font-size="10">${num(y1)}</text><text x="4" y="${H - pad}" font-size="10">${num(y0)}</text>
    <polyline id="best-so-far" points="${step.join(" ")}" fill="none" stroke="#e53935" stroke-width="1.5"/>${dots.join("")}</svg>
    <div class="meta" id="history-scale" data-scale="${scale.name}">dots: trials (hollow: pruned); red: best so far; ${esc(scale.says)}</div>`;
}

// The history's y axis: the inliers' range (within 5 scaled median absolute deviations of the median) when
// some values lie beyond it, an outlier drawn on the edge instead of flattening the rest; else log when every
// value is positive and they span more than 20x; else linear.
function yScale(ys) {
  const sorted = [...ys].sort((a, b) => a - b);
  const lo = sorted[0], hi = sorted[sorted.length - 1];
  const median = (v) => (v[Math.floor((v.length - 1) / 2)] + v[Math.ceil((v.length - 1) / 2)]) / 2;
  const mid = median(sorted);
  const mad = 1.4826 * median(sorted.map((y) => Math.abs(y - mid)).sort((a, b) => a - b));
  const inliers = mad > 0 ? sorted.filter((y) => Math.abs(y - mid) <= 5 * mad) : sorted;
  if (sorted.length >= 3 && inliers.length < sorted.length) {
    return { lo: inliers[0], hi: inliers[inliers.length - 1], f: (y) => y, name: "clipped",
             says: `${sorted.length - inliers.length} outlier(s) drawn on the edge` };
  }
  if (lo > 0 && hi / lo > 20) return { lo, hi, f: Math.log10, name: "log", says: "log scale" };
  return { lo, hi, f: (y) => y, name: "linear", says: "linear scale" };
}

export async function render() {
  const style = document.createElement("style");
  style.textContent = CSS;
  document.head.appendChild(style);
  const root = document.createElement("div");
  root.id = "hpctrain";
  root.textContent = "reading the sweep...";
  document.body.appendChild(root);
  let last = null;
  root.addEventListener("click", (event) => {
    const target = event.target.closest("button[data-page]");
    if (!target || !last) return;
    page = Number(target.dataset.page);
    draw(last);
  });
  const draw = (data, stale) => {
    const parts = [header(data, stale), lines("problems", "problems", data.problems), lines("warnings", "warnings", data.warnings)];
    if (data.runs && data.runs.length) {
      parts.push(queueTable(data), failures(data), stragglers(data));
      if (data.search) parts.push(historySvg(data.search));
      parts.push(runsTable(data));
    }
    const t0 = performance.now();
    root.innerHTML = parts.join("");
    root.dataset.drawMs = String(Math.round(performance.now() - t0));  // read by benchmarks/tab_10000.py
    root.dataset.updated = String(Date.now());
  };
  const poll = async () => {
    try {
      const t0 = performance.now();
      const response = await fetch("./data", { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      last = await response.json();
      root.dataset.fetchMs = String(Math.round(performance.now() - t0));
      draw(last);
    } catch (err) {
      draw(last || { problems: [] }, `could not refresh (${err.message}); showing the last answer`);
    }
    setTimeout(poll, POLL_MS);
  };
  await poll();
}
