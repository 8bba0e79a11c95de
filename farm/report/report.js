// farm report: the rollout table (sort, filter) and each rollout's detail, built with DOM
// calls (textContent, never innerHTML for run data: diffs and tool output hold any text).
// A rollout's detail blob is parsed only when its row is opened.
(function () {
  "use strict";
  const rows = JSON.parse(document.getElementById("rows").textContent);
  const head = JSON.parse(document.getElementById("head").textContent);
  rows.forEach((r, i) => { r._i = i; });
  const COLS = [["rollout_id", "rollout"], ["task_id", "task"], ["status", "status"], ["reward", "reward"],
    ["turns", "turns"], ["output_tokens", "out tokens"], ["num_samples", "samples"], ["duration_s", "seconds"],
    ["attempt", "attempt"], ["harness", "harness"], ["flags", "flags"], ["reason", "reason"]];
  const NUM = new Set(["reward", "turns", "output_tokens", "num_samples", "duration_s", "attempt"]);
  let sortKey = null, sortDir = 1;

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }
  function fmt(k, v) {
    if (v == null) return "";
    if (k === "duration_s") return v.toFixed(1);
    if (k === "reward") return (Math.round(v * 1000) / 1000).toString();
    if (k === "flags") return v.join(", ");
    return String(v);
  }

  const thead = document.querySelector("#rollouts thead"), tbody = document.querySelector("#rollouts tbody");
  const filter = document.getElementById("filter"), status = document.getElementById("status");
  const flag = document.getElementById("flag");
  const headRow = el("tr");
  for (const [k, label] of COLS) {
    const th = el("th", {"data-k": k, text: label});
    th.addEventListener("click", () => { sortDir = sortKey === k ? -sortDir : 1; sortKey = k; draw(); });
    headRow.append(th);
  }
  thead.append(headRow);

  function draw() {
    const q = filter.value.trim().toLowerCase(), st = status.value, fl = flag.value;
    let shown = rows.filter(r => (!st || r.status === st) &&
      (!fl || (fl === "*" ? r.flags.length > 0 : r.flags.includes(fl))) && (!q ||
      [r.rollout_id, r.task_id, r.status, r.reason, ...r.flags].some(s => (s || "").toLowerCase().includes(q))));
    if (sortKey) {
      shown = shown.slice().sort((a, b) => {
        const x = a[sortKey], y = b[sortKey];
        return (x == null) - (y == null) || (x < y ? -1 : x > y ? 1 : 0) * sortDir;
      });
    }
    for (const th of headRow.children) th.className = th.dataset.k === sortKey ? (sortDir > 0 ? "asc" : "desc") : "";
    const frag = document.createDocumentFragment();
    for (const r of shown) {
      const tr = el("tr", {"data-rollout": r.rollout_id});
      for (const [k] of COLS) {
        tr.append(el("td", {class: (NUM.has(k) ? "num" : "") + (k === "status" ? " st-" + r.status : ""),
          text: fmt(k, r[k])}));
      }
      tr.addEventListener("click", () => { location.hash = "r=" + encodeURIComponent(r.rollout_id); });
      frag.append(tr);
    }
    tbody.replaceChildren(frag);
    document.getElementById("count").textContent = shown.length + " of " + rows.length + " rollouts";
  }
  filter.addEventListener("input", draw);
  status.addEventListener("change", draw);
  flag.addEventListener("change", draw);
  // the flags section's buttons: the rollouts with that flag (any flag: "*"), in the table below
  for (const b of document.querySelectorAll("#flags button.flag")) {
    b.addEventListener("click", () => {
      flag.value = b.dataset.flag;
      draw();
      document.getElementById("rollouts").scrollIntoView();
    });
  }

  function kvTable(obj) {
    const t = el("table", {class: "kv"});
    for (const [k, v] of Object.entries(obj || {})) {
      t.append(el("tr", {}, el("td", {text: k}), el("td", {text: typeof v === "object" ? JSON.stringify(v) : String(v)})));
    }
    return t;
  }
  function diffView(text) {
    const pre = el("pre", {class: "diff"});
    for (const line of text.split("\n")) {
      const cls = line.startsWith("+") && !line.startsWith("+++") ? "add" :
        line.startsWith("-") && !line.startsWith("---") ? "del" : line.startsWith("@@") ? "hunk" : "";
      pre.append(el("span", {class: cls, text: line + "\n"}));
    }
    return pre;
  }
  function testsView(tests) {
    const t = el("table", {class: "tests"});
    t.append(el("tr", {}, el("th", {text: "test"}), el("th", {text: "kind"}), el("th", {text: "status"})));
    for (const [kind, key] of [["FAIL_TO_PASS", "fail_to_pass"], ["PASS_TO_PASS", "pass_to_pass"]]) {
      for (const [name, st] of Object.entries(tests[key] || {})) {
        t.append(el("tr", {}, el("td", {text: name}), el("td", {text: kind}), el("td", {class: st, text: st})));
      }
    }
    return t;
  }
  function errorView(a) {
    if (!a || !a.error) return [];
    return [el("h3", {text: "error (infrastructure)"}), el("pre", {class: "error", text: a.error})];
  }
  function artifactsView(a) {
    if (!a) return [el("h3", {text: "artifacts"}), el("p", {class: "muted", text: "none kept for this rollout"})];
    const ul = el("ul", {class: "artifacts"});
    for (const f of a.files) {
      // farm view serves each file decompressed under its own name; a report file links the .gz on disk
      const name = head.served ? f.name.replace(/\.gz$/, "") : f.name;
      const href = head.artifacts_base + "artifacts/" + encodeURIComponent(a.dir) + "/" + encodeURIComponent(name);
      ul.append(el("li", {}, el("a", {href: href, text: name}), " " + f.bytes.toLocaleString("en") + " bytes" +
        (f.truncated ? " (cut to " + f.kept_bytes.toLocaleString("en") + " by the per-rollout cap)" : "")));
    }
    const note = head.served ? "full logs, every gateway turn" : "full logs, every gateway turn; gzip files: zcat, " +
      "or open the run with farm view to read them here";
    return [el("h3", {text: "artifacts (" + note + ")"}), ul];
  }
  function taskView(ref) {
    if (ref == null) {
      return [el("h3", {text: "task"}), el("p", {class: "muted",
        text: "not recorded (no task.json in the rollout's artifacts, not in the run's task file)"})];
    }
    const t = JSON.parse(document.getElementById("t" + ref).textContent);
    const kv = {task: t.id, kind: t.kind, source: t.source};
    for (const [k, label] of [["image", "image"], ["tests", "tests"], ["test_command", "test command"]]) {
      if (t[k]) kv[label] = t[k];
    }
    return [el("h3", {text: "task"}), kvTable(kv), el("div", {class: "muted", text: "instruction, from " + t.origin}),
      el("pre", {class: "instruction", text: t.instruction})];
  }
  function fidelityView(f) {
    const out = [el("div", {class: "lab", text: "token fidelity: the context the engine saw vs a fresh chat-template render"})];
    const t = el("table", {class: "kv fidelity"});
    for (const [k, v] of f.rows) t.append(el("tr", {}, el("td", {text: k}), el("td", {class: "num", text: String(v)})));
    out.push(t);
    if (f.runs.length) {
      const d = el("table", {class: "fidelity-runs"});
      d.append(el("tr", {}, el("th", {text: "at token"}), el("th", {text: "kind"}), el("th", {text: "engine saw"}),
        el("th", {text: "fresh render"})));
      for (const r of f.runs) {
        d.append(el("tr", {}, el("td", {class: "num", text: String(r.at)}), el("td", {text: r.kind}),
          el("td", {}, el("pre", {text: r.seen})), el("td", {}, el("pre", {text: r.fresh}))));
      }
      out.push(d);
      if (f.more_runs) out.push(el("p", {class: "muted", text: "(" + f.more_runs + " more differences recorded)"}));
    }
    return el("div", {class: "fid"}, ...out);
  }
  function segmentView(seg) {
    const box = el("div", {class: "seg " + seg.kind});
    const label = seg.kind === "output" ? "model output, trained (" + seg.n + " tokens; hover a token for its logprob)" :
      seg.kind === "prompt" ? "prompt (" + seg.n + " tokens)" : "context: tool results, template (" + seg.n + " tokens, not trained)";
    box.append(el("div", {class: "lab", text: label}));
    const pre = el("pre");
    if (seg.tokens) {
      let i = seg.start;
      for (const [text, lp] of seg.tokens) {
        // heat: greener = more confident; a token the engine found unlikely is pale
        const span = el("span", {class: "tr", title: "logprob " + lp + " (response token " + (i++) + ")", text: text});
        span.style.setProperty("--h", (0.08 + 0.3 * Math.exp(lp)).toFixed(3));
        pre.append(span);
      }
    } else if (seg.kind === "output") {
      pre.append(el("span", {class: "tr", title: "mean logprob " + seg.mean_logprob, text: seg.text}));
    } else {
      pre.textContent = seg.text;
    }
    if (seg.kind === "prompt") box.append(el("details", {}, el("summary", {text: "show the prompt"}), pre));
    else box.append(pre);
    return box;
  }

  const detail = document.getElementById("detail"), overview = document.getElementById("overview");
  function open(rid) {
    const r = rows.find(x => x.rollout_id === rid);
    if (!r) { detail.hidden = true; overview.hidden = false; return; }
    const d = JSON.parse(document.getElementById("r" + r._i).textContent);
    const back = el("button", {text: "\u2190 all rollouts"});
    back.addEventListener("click", () => { history.pushState("", "", location.pathname); open(null); });
    const parts = [back, el("h2", {id: "detail-title", text: r.rollout_id}),
      kvTable({task: r.task_id, status: r.status, reason: r.reason, reward: r.reward, attempt: r.attempt,
        harness: r.harness, model: d.model, turns: r.turns, samples: d.samples.length, sandbox: d.sandbox_id,
        flags: r.flags.join(", ") || "none"}),
      ...errorView(d.artifacts),
      ...taskView(d.task),
      el("h3", {text: "tests"}), testsView(d.tests), kvTable(d.tests.verdict),
      el("h3", {text: "diff"}), d.diff ? diffView(d.diff) : el("p", {class: "muted", text: "(empty diff)"}),
      el("h3", {text: "timings (s)"}), kvTable(d.timings)];
    if (d.samples.length) parts.push(el("h3", {text: "drift (session)"}), kvTable(d.samples[0].drift));
    for (const s of d.samples) {
      parts.push(el("h3", {text: "Sample chain " + s.chain_index + " (" + s.chain_kind + (s.final ? ", final" : "") +
        "): " + s.num_turns + " turns, " + s.tokens + " tokens, " + s.trained + " trained, finish " + s.finish_reason}));
      if (s.fidelity) parts.push(fidelityView(s.fidelity));
      for (const seg of s.segments) parts.push(segmentView(seg));
    }
    if (!d.samples.length) parts.push(el("p", {class: "muted", text: "no Samples for this rollout"}));
    parts.push(el("h3", {text: "agent log (tail)"}), el("pre", {text: d.agent_log_tail || ""}));
    parts.push(...artifactsView(d.artifacts));
    detail.replaceChildren(...parts);
    overview.hidden = true;
    detail.hidden = false;
    window.scrollTo(0, 0);
  }
  function route() {
    const m = location.hash.match(/^#r=(.*)$/);
    open(m ? decodeURIComponent(m[1]) : null);
  }
  window.addEventListener("hashchange", route);
  draw();
  route();
})();
