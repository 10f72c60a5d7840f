// NextState run viewer: plain JS, no framework. data/run.js calls NSV.run(run) with the metrics rows and the episode
// index; an episode's steps are loaded when it is opened (NSV.chunk(n, steps) from data/steps/c<n>.js). Every text
// from the run (actions, observations, judge answers) is set with textContent, never parsed as HTML.
"use strict";

const PAGE_SIZE = 50;
const DEFAULT_METRICS = {
  train: ["accuracy", "mean_outcome", "mean_step_score", "dropped_step_fraction", "train/loss", "train/kl",
          "train/clip_frac", "train/grad_norm", "staleness_mean", "steps_per_s", "samples",
          "judge/unanimous_fraction", "judge/invalid_vote_rate", "judge/latency_p50_s", "judge/latency_p95_s",
          "judge/verifiable_agreement", "judge/prompt_tokens", "judge/completion_tokens"],
  eval: ["accuracy", "mean_outcome", "judge/unanimous_fraction", "judge/verifiable_agreement"],
};

// the directive modes' diagnostics, over all families and per family (directive/<family>/...), where a run has them:
// hinted steps (right / wrong), the teacher-student gap, the teacher's top-k on the sampled token, the student's
// entropy and KL on the distilled tokens (rollout/metrics.py directive_metrics, train/backends/data_parallel.py)
const DIRECTIVE_METRIC = new RegExp("^(directive/([^/]+/)?(hint_rate|hint_rate_right|hint_rate_wrong|gap_mean|gap_std|" +
  "distill_steps|topk_sampled_mass|topk_tail)|train/distill/(entropy|kl_mean|kl_std|clamped_frac))$");

// rollout-vs-trainer log-probs, where a run has them: the mismatch on the sampled tokens and the importance ratio's
// spread of every iteration, the parity check after each weight sync and the sync's time (rollout/policy/parity.py)
const LOGPROB_METRIC = /^(logprobs\/(mismatch_max|mismatch_mean|ratio_min|ratio_max|ratio_std)|weight_sync\/parity_max_diff|weight_sync_s)$/;

const NSV = {
  data: null,
  chunks: new Map(),   // chunk index -> {episode id: [steps]}
  waiting: new Map(),  // chunk index -> [resolve callbacks]
  filters: {split: "", iteration: "", family: "", status: "", outcome: "", task: ""},
  page: 0,
  allMetrics: false,

  run(data) {
    this.data = data;
    const ep = data.episodes;
    this.n = ep.episode_id.length;
    this.byId = new Map(ep.episode_id.map((id, i) => [id, i]));
    document.getElementById("title").textContent = `NextState run ${data.name}`;
    document.getElementById("counts").textContent =
      `${data.counts.episodes} episodes, ${data.counts.steps} steps, ${data.metrics.length} metrics rows`;
    window.addEventListener("hashchange", () => this.route());
    this.route();
  },

  chunk(index, steps) {
    this.chunks.set(index, steps);
    for (const done of this.waiting.get(index) || []) done();
    this.waiting.delete(index);
  },

  loadChunk(index) {
    if (this.chunks.has(index)) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const first = !this.waiting.has(index);
      this.waiting.set(index, [...(this.waiting.get(index) || []), resolve]);
      if (!first) return;
      const s = document.createElement("script");
      s.src = `data/steps/c${String(index).padStart(5, "0")}.js`;
      s.onerror = () => reject(new Error(`could not load ${s.src}`));
      document.body.appendChild(s);
    });
  },

  // ----- routing: #metrics | #episodes?k=v&... | #episode=<id> | #config -----
  route() {
    const hash = decodeURIComponent(location.hash.slice(1));
    const [tab, query] = hash.split("?");
    let name = tab || "episodes";
    if (name.startsWith("episode=")) {
      this.showEpisode(name.slice("episode=".length));
      name = "episodes";
    } else if (name === "metrics") this.showMetrics();
    else if (name === "config") this.showConfig();
    else {
      const params = new URLSearchParams(query || "");
      for (const k of Object.keys(this.filters)) this.filters[k] = params.get(k) || "";
      this.page = Number(params.get("page") || 0);
      this.showEpisodes();
      name = "episodes";
    }
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.tab === name);
  },

  episodesHash() {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(this.filters)) if (v) params.set(k, v);
    if (this.page) params.set("page", String(this.page));
    const q = params.toString();
    return "#episodes" + (q ? "?" + q : "");
  },

  // ----- metrics -----
  showMetrics() {
    const view = clear();
    const rows = this.data.metrics;
    for (const r of rows.filter(r => r.kind === "resume")) {
      view.append(h("p", {class: "note"}, `Resumed (resume ${r.resume}) at iteration ${r.from_iteration} from ` +
        `${r.checkpoint || "the initial weights"}; set aside under ${r.superseded_dir}: ` +
        Object.entries(r.superseded || {}).map(([f, n]) => `${n} lines of ${f}`).join(", ")));
    }
    for (const r of rows.filter(r => r.kind === "error")) {  // e.g. a weight sync that failed its parity check
      view.append(h("p", {class: "note error"}, `The run stopped at iteration ${r.iteration} (${r.stage}): ` +
        `${r.error}`));
    }
    const toggle = h("label", {}, h("input", {type: "checkbox"}), " every numeric key");
    toggle.firstChild.checked = this.allMetrics;
    toggle.firstChild.onchange = e => { this.allMetrics = e.target.checked; this.showMetrics(); };
    view.append(toggle);
    for (const kind of ["train", "eval"]) {
      const kindRows = rows.filter(r => r.kind === kind && typeof r.iteration === "number");
      if (!kindRows.length) continue;
      const keys = this.allMetrics ? numericKeys(kindRows) : DEFAULT_METRICS[kind].concat(
        numericKeys(kindRows).filter(k => /^judge\/[^/]+\/unanimous_fraction$/.test(k) || DIRECTIVE_METRIC.test(k) ||
                                     LOGPROB_METRIC.test(k)));
      const charts = h("div", {class: "charts"});
      for (const key of keys) {
        const pts = kindRows.filter(r => typeof r[key] === "number").map(r => [r.iteration, r[key]]);
        if (pts.length) charts.append(chart(key, pts));
      }
      view.append(h("h2", {}, `${kind} rows (per iteration)`), charts);
    }
    if (!rows.length) view.append(h("p", {class: "muted"}, "metrics.jsonl has no rows yet."));
  },

  // ----- episodes -----
  matches(i) {
    const e = this.data.episodes, f = this.filters;
    if (f.split && e.split[i] !== f.split) return false;
    if (f.iteration !== "" && String(e.iteration[i]) !== f.iteration) return false;
    if (f.family && e.family[i] !== f.family) return false;
    if (f.status && e.status[i] !== f.status) return false;
    if (f.task && !String(e.task_id[i]).includes(f.task)) return false;
    if (f.outcome) {
      const o = e.outcome[i];
      if (f.outcome === "solved" && !(o > 0)) return false;
      if (f.outcome === "unsolved" && !(o !== null && o <= 0)) return false;
      if (f.outcome === "none" && o !== null) return false;
    }
    return true;
  },

  showEpisodes() {
    const view = clear();
    const e = this.data.episodes;
    const sel = [];
    for (let i = 0; i < this.n; i++) if (this.matches(i)) sel.push(i);
    const pages = Math.max(1, Math.ceil(sel.length / PAGE_SIZE));
    this.page = Math.min(Math.max(0, this.page), pages - 1);
    const filters = h("div", {class: "filters"});
    const add = (key, label, options) => {
      const s = h("select", {"data-filter": key}, h("option", {value: ""}, `all`));
      for (const o of options) s.append(h("option", {value: String(o)}, String(o)));
      s.value = this.filters[key];
      s.onchange = () => { this.filters[key] = s.value; this.page = 0; location.hash = this.episodesHash(); };
      filters.append(h("label", {}, label + " "), s);
    };
    add("split", "split", distinct(e.split));
    add("iteration", "iteration", distinct(e.iteration).sort((a, b) => a - b));
    add("family", "family", distinct(e.family));
    add("status", "status", distinct(e.status));
    add("outcome", "outcome", ["solved", "unsolved", "none"]);
    const task = h("input", {type: "search", placeholder: "task id contains", "data-filter": "task"});
    task.value = this.filters.task;
    task.onchange = () => { this.filters.task = task.value; this.page = 0; location.hash = this.episodesHash(); };
    filters.append(h("label", {}, "task "), task);
    view.append(filters);
    const table = h("table", {id: "episodes"});
    table.append(h("tr", {}, ...["episode", "split", "it", "task", "family", "status", "outcome", "steps",
                                "judge score", "sum R", "attempt"].map(t => h("th", {}, t))));
    for (const i of sel.slice(this.page * PAGE_SIZE, (this.page + 1) * PAGE_SIZE)) {
      const tr = h("tr", {class: "ep", "data-episode": e.episode_id[i]},
        h("td", {}, e.episode_id[i]), h("td", {}, e.split[i]), h("td", {}, e.iteration[i]),
        h("td", {}, e.task_id[i]), h("td", {}, e.family[i] || ""),
        h("td", {class: `status-${e.status[i]}`}, e.status[i]), h("td", {}, fmt(e.outcome[i])),
        h("td", {}, e.num_steps[i]), h("td", {}, fmt(e.score[i])), h("td", {}, fmt(e.reward[i])),
        h("td", {}, e.attempt[i]));
      tr.onclick = () => { location.hash = "#episode=" + encodeURIComponent(e.episode_id[i]); };
      table.append(tr);
    }
    const pager = h("div", {class: "pager"});
    const go = p => { this.page = p; location.hash = this.episodesHash(); };
    const prev = h("button", {id: "prev"}, "previous"), next = h("button", {id: "next"}, "next");
    prev.disabled = this.page === 0; next.disabled = this.page >= pages - 1;
    prev.onclick = () => go(this.page - 1); next.onclick = () => go(this.page + 1);
    pager.append(prev, h("span", {id: "page"}, `page ${this.page + 1} of ${pages} (${sel.length} episodes)`), next);
    view.append(pager, table);
    document.body.dataset.ready = "episodes";
    if (window.NSV_T0 === undefined) window.NSV_T0 = performance.now();  // first page shown
  },

  async showEpisode(id) {
    const view = clear();
    const i = this.byId.get(id);
    if (i === undefined) { view.append(h("p", {}, `no episode ${id}`)); return; }
    const e = this.data.episodes;
    const back = h("a", {href: this.episodesHash()}, "\u2190 episodes");
    view.append(back, h("h2", {}, `Episode ${id}`));
    view.append(h("div", {class: "facts"},
      fact("task", e.task_id[i]), fact("family", e.family[i]), fact("split", e.split[i]),
      fact("iteration", e.iteration[i]), fact("group", e.group_id[i]), fact("status", e.status[i]),
      fact("outcome", fmt(e.outcome[i])), fact("attempt", e.attempt[i]), fact("wall", fmt(e.wall_s[i]) + " s")));
    if (e.reason[i]) view.append(h("pre", {}, e.reason[i]));
    const steps = h("div", {id: "steps"}, h("p", {class: "muted"}, "loading steps\u2026"));
    view.append(steps);
    try {
      await Promise.all((e.chunks[i] || []).map(c => this.loadChunk(c)));
    } catch (err) {
      steps.replaceChildren(h("p", {class: "note"}, String(err)));
      return;
    }
    const list = [];
    for (const c of e.chunks[i] || []) list.push(...((this.chunks.get(c) || {})[id] || []));
    list.sort((a, b) => a.step_index - b.step_index);
    steps.replaceChildren();
    if (!list.length) steps.append(h("p", {class: "muted"}, "no step on record (the episode ended before its first step, or its batch was never scored)"));
    let before = e.screenshot[i];
    for (const s of list) {
      steps.append(stepCard(s, before, this.data.prefix));
      before = s.screenshot || before;
    }
    document.body.dataset.ready = "episode";
  },

  showConfig() {
    const view = clear();
    view.append(h("h2", {}, "config.yaml"), h("pre", {}, this.data.config || "(none)"));
    view.append(h("h2", {}, "run_state.json"), h("pre", {}, JSON.stringify(this.data.state, null, 2)));
    if (Object.keys(this.data.skipped_lines || {}).length)
      view.append(h("p", {class: "note"}, "lines that did not parse (skipped): " + JSON.stringify(this.data.skipped_lines)));
    view.append(h("p", {class: "muted"}, `run directory ${this.data.run_dir}; viewer built ${this.data.built}`));
  },
};
window.NSV = NSV;

function stepCard(s, before, prefix) {
  const card = h("div", {class: "step", "data-step": s.step_index});
  card.append(h("h3", {}, `Step ${s.step_index}`));
  const j = s.judge || null;
  card.append(h("div", {class: "facts"},
    fact("R_t", fmt(s.reward)), fact("advantage", s.advantage === null ? "none (no gradient)" : fmt(s.advantage)),
    fact("weight version", s.weight_version), fact("tokens", `${s.prompt_tokens} prompt / ${s.output_tokens} output`),
    fact("finish", s.finish_reason), fact("status", s.status),
    s.outcome !== null && s.outcome !== undefined ? fact("outcome", fmt(s.outcome)) : null));
  const gap = s.teacher_gap, top = s.teacher_topk_summary;
  if (s.advantage_mode || gap || top) card.append(h("div", {class: "facts directive"},
    s.advantage_mode ? fact("advantage rule", s.advantage_mode) : null,
    gap ? fact("teacher gap", `mean ${fmt(gap.mean)} [${fmt(gap.min)}, ${fmt(gap.max)}] over ${gap.tokens} tokens`) : null,
    s.distill_weight !== null && s.distill_weight !== undefined ? fact("distill weight", fmt(s.distill_weight)) : null,
    top ? fact("teacher top-k", `sampled token's mass ${fmt(top.sampled_mass)}, in top-k ${fmt(top.sampled_in_topk)}, ` +
      `tail ${fmt(top.tail)}`) : null));
  card.append(h("div", {class: "label"}, "action"), h("pre", {class: "action"}, s.action));
  if (s.screenshot || before) {
    const shots = h("div", {class: "shots"});
    if (before) shots.append(shot(prefix + before, "before"));
    if (s.screenshot) shots.append(shot(prefix + s.screenshot, "after (next state)"));
    card.append(shots);
  }
  const ns = s.next_state || {};
  card.append(h("div", {class: "label"}, `next state (${ns.role || "?"})`), h("pre", {class: "next-state"}, ns.content || ""));
  card.append(h("details", {}, h("summary", {}, "signals"), h("pre", {}, JSON.stringify(s.signals, null, 2))));
  if (j) {
    const votes = h("span", {class: "votes"},
      ...(j.votes || []).map(v => h("span", {class: `vote v${v === null ? "null" : v}`}, v === null ? "invalid" : (v > 0 ? "+" + v : String(v)))));
    card.append(h("div", {class: "label"}, "judge"), h("div", {class: "facts"},
      fact("score", fmt(j.score)), h("span", {}, "votes ", votes),
      j.cached ? fact("cached", "yes") : (j.latency_s > 0 ? fact("latency", fmt(j.latency_s) + " s") : null),
      (j.prompt_tokens || j.completion_tokens) ? fact("judge tokens", `${j.prompt_tokens} in / ${j.completion_tokens} out`) : null));
    if (j.hint) card.append(h("div", {class: "label"}, "hint"), h("pre", {class: "hint"}, j.hint));
    const raws = h("details", {class: "raw"}, h("summary", {}, `raw answers (${(j.raw || []).length})`));
    (j.raw || []).forEach((r, k) => raws.append(h("div", {class: "label"}, `vote ${k + 1}`), h("pre", {}, r)));
    card.append(raws);
  } else {
    card.append(h("div", {class: "label muted"}, "not judged"));
  }
  return card;
}

function shot(src, caption) {
  const img = h("img", {src, alt: caption, loading: "lazy"});
  img.onclick = () => img.classList.toggle("big");
  return h("figure", {}, img, h("figcaption", {}, caption));
}

function chart(name, pts) {
  const W = 280, H = 120, P = 26;
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = x => P + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - P - 8);
  const sy = y => H - 16 - (y1 === y0 ? 0.5 : (y - y0) / (y1 - y0)) * (H - 28);
  const svg = svgEl("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`});
  svg.append(svgEl("polyline", {points: pts.map(p => `${sx(p[0])},${sy(p[1])}`).join(" ")}));
  for (const p of pts) {
    const c = svgEl("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5});
    c.append(svgEl("title", {}, `iteration ${p[0]}: ${fmt(p[1])}`));
    svg.append(c);
  }
  svg.append(svgEl("text", {x: 2, y: 12}, fmt(y1)), svgEl("text", {x: 2, y: H - 18}, fmt(y0)),
             svgEl("text", {x: P, y: H - 3}, String(x0)), svgEl("text", {x: W - 20, y: H - 3}, String(x1)));
  return h("div", {class: "chart", "data-metric": name}, h("div", {class: "name"}, name), svg);
}

function numericKeys(rows) {
  const keys = new Set();
  for (const r of rows) for (const [k, v] of Object.entries(r)) if (typeof v === "number" && k !== "iteration") keys.add(k);
  return [...keys].sort();
}

function distinct(values) { return [...new Set(values.filter(v => v !== null && v !== undefined && v !== ""))].sort(); }

function fmt(x) {
  if (x === null || x === undefined) return "-";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return Math.abs(x) >= 100 ? x.toFixed(1) : x.toFixed(3);
}

function fact(name, value) { return h("span", {}, name + " ", h("b", {}, value === null || value === undefined ? "-" : String(value))); }

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

function svgEl(tag, attrs, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function clear() {
  const view = document.getElementById("view");
  view.replaceChildren();
  delete document.body.dataset.ready;
  window.scrollTo(0, 0);
  return view;
}
