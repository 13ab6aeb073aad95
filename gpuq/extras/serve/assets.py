"""The status page itself: one HTML document with its style and script inline, and the
Content-Security-Policy that lets only those two run (by their SHA-256, so nothing a job's name
could smuggle into the document would run even if it got in: it cannot, the script writes data
with `textContent` only).

The script polls /status.json every POLL_MS and rebuilds the tables; when the server or the
queue cannot be read it keeps the last data and says so above them.
"""

from __future__ import annotations

import base64
import hashlib

POLL_MS = 3000

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; background: #fafafa; }
h1 { font-size: 1.3em; margin: 0 0 .2em; }
h2 { font-size: 1.05em; margin: 1.2em 0 .3em; letter-spacing: .05em; }
table { border-collapse: collapse; background: #fff; }
th, td { text-align: left; padding: .2em .8em .2em 0; border-bottom: 1px solid #e4e4e4; vertical-align: top; }
th { font-weight: 600; color: #555; }
td.num { font-variant-numeric: tabular-nums; }
.host { margin: .6em 0 .2em; font-weight: 600; }
.host.down { color: #b00; }
.bar { display: inline-block; width: 6em; height: .7em; background: #e8e8e8; margin-right: .4em; }
.bar > span { display: block; height: 100%; background: #3a7; }
.bar.mem > span { background: #37a; }
#problem { display: none; background: #fee; border: 1px solid #c66; padding: .4em .8em; margin: .5em 0; }
#problem.shown { display: block; }
.muted { color: #777; }
"""

SCRIPT = """
"use strict";
const POLL_MS = POLL_MS_VALUE;
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
function bar(td, pct, cls) {
  const outer = document.createElement("span");
  outer.className = "bar " + cls;
  const inner = document.createElement("span");
  inner.style.width = Math.max(0, Math.min(100, Number(pct) || 0)) + "%";
  outer.appendChild(inner);
  td.insertBefore(outer, td.firstChild);
}
function fill(id, rows, columns, empty) {
  const body = document.querySelector("#" + id + " tbody");
  const fresh = document.createElement("tbody");
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.id = String(r.id);
    for (const c of columns) cell(tr, typeof c === "function" ? c(r) : r[c]);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
  document.getElementById(id + "-empty").textContent = rows.length ? "" : empty;
}
function clock(t) {
  return typeof t === "number" ? new Date(t * 1000).toLocaleTimeString() : "-";
}
function hosts(list) {
  const box = document.getElementById("hosts");
  const fresh = document.createElement("div");
  fresh.id = "hosts";
  for (const h of list) {
    const head = document.createElement("div");
    head.className = "host" + (h.alive ? "" : " down");
    head.dataset.host = String(h.host);
    head.textContent = h.host + "  " + h.state + " (seen " + h.seen + " ago)";
    fresh.appendChild(head);
    const table = document.createElement("table");
    table.className = "gpus";
    const hr = document.createElement("tr");
    for (const t of ["GPU", "NAME", "UTIL", "MEM USED/TOTAL", "JOBS"]) {
      const th = document.createElement("th"); th.textContent = t; hr.appendChild(th);
    }
    table.appendChild(hr);
    for (const g of h.gpus) {
      const tr = document.createElement("tr");
      tr.className = "gpu";
      cell(tr, g.index, "num");
      cell(tr, g.name);
      bar(cell(tr, g.util, "num util"), g.util_pct, "util");
      const mem = cell(tr, g.mem, "num mem");
      bar(mem, g.mem_total_mib ? 100 * g.mem_used_mib / g.mem_total_mib : 0, "mem");
      cell(tr, g.jobs);
      table.appendChild(tr);
    }
    fresh.appendChild(table);
  }
  if (!list.length) fresh.textContent = "none: no worker has run yet";
  box.replaceWith(fresh);
}
function show(data) {
  hosts(data.hosts);
  fill("running", data.running, ["id", "user", "name", "where", "elapsed"], "none");
  fill("pending", data.pending,
       ["position", "id", "user", "name", "ask", "waiting", "start_by", "reason"], "none");
  document.getElementById("pending-total").textContent =
    data.pending_total > data.pending.length ? "(first " + data.pending.length + " of " + data.pending_total + ")"
                                             : "(" + data.pending_total + ")";
  fill("finished", data.finished,
       ["id", "state", "exit", "duration", "where", r => clock(r.ended_at), "note"], "none yet");
}
function problem(text) {
  const p = document.getElementById("problem");
  p.textContent = text || "";
  p.className = text ? "shown" : "";
}
async function poll() {
  try {
    const answer = await fetch("/status.json", {cache: "no-store"});
    if (!answer.ok) throw new Error("the server answered " + answer.status);
    const doc = await answer.json();
    if (doc.data) {
      show(doc.data);
      document.getElementById("updated").textContent = clock(doc.data.now);
    }
    problem(doc.error ? "The queue cannot be read (" + doc.error + "); showing the last data read." : "");
  } catch (e) {
    problem("The page cannot reach gpuq serve (" + e.message + "); showing the last data read.");
  }
  setTimeout(poll, POLL_MS);
}
poll();
""".replace("POLL_MS_VALUE", str(POLL_MS))

HTML = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpuq status</title>
<style>{STYLE}</style>
</head>
<body>
<h1>gpuq status</h1>
<div class="muted">last updated <span id="updated">-</span>, every {POLL_MS // 1000} s</div>
<div id="problem" role="alert"></div>
<h2>HOSTS</h2>
<div id="hosts"></div>
<h2>RUNNING</h2>
<table id="running"><thead><tr><th>ID</th><th>USER</th><th>NAME</th><th>WHERE</th><th>ELAPSED</th></tr></thead>
<tbody></tbody></table>
<div id="running-empty" class="muted"></div>
<h2>PENDING <span id="pending-total" class="muted"></span></h2>
<table id="pending"><thead><tr><th>#</th><th>ID</th><th>USER</th><th>NAME</th><th>ASK</th><th>WAITING</th>
<th>START BY</th><th>REASON</th></tr></thead>
<tbody></tbody></table>
<div id="pending-empty" class="muted"></div>
<h2>RECENT ENDS</h2>
<table id="finished"><thead><tr><th>ID</th><th>STATE</th><th>EXIT</th><th>DURATION</th><th>WHERE</th><th>ENDED</th>
<th>NOTE</th></tr></thead>
<tbody></tbody></table>
<div id="finished-empty" class="muted"></div>
<script>{SCRIPT}</script>
</body>
</html>
""".encode()


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Only the page's own style and script run; the script may fetch only from this server; no
# frame, form, plugin or <base> (an injected element could do nothing even if one got in).
CSP = (
    f"default-src 'self'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; "
    "img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
