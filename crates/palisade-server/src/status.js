// The status page's script: reads /status.json every second and redraws.
// Every value goes into the page as text (textContent), never as markup, so a
// lock name such as "<script>" is shown, not run.
"use strict";

const REFRESH_MS = 1000;

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}

function ms(v) {
  if (v === null || v === undefined) return "–";
  return v < 1000 ? v + " ms" : (v / 1000).toFixed(1) + " s";
}

// A recipe's holders in one line: "semaphore 2/3: 5 (slot 0, token 7), …",
// "read/write, 2 readers: …", "election: 9 (value "10.0.0.7", token 12)".
function recipe(l) {
  const who = l.holders.map((h) => {
    const about = [];
    if (l.shape === "semaphore") about.push("slot " + h.slot);
    if (l.shape === "election") about.push("value " + JSON.stringify(h.value));
    about.push("token " + h.token);
    return session(h.session, h.label) + " (" + about.join(", ") + ")";
  }).join(", ");
  const n = l.holders.length;
  const head = l.shape === "semaphore" ? "semaphore " + n + "/" + l.permits
    : l.shape === "read_write"
      ? "read/write, " + (n && l.holders[0].shared ? n + (n === 1 ? " reader" : " readers") : "writer")
      : l.shape;
  return n ? head + ": " + who : head;
}

function session(id, label) {
  return label ? id + " (" + label + ")" : String(id);
}

function fill(id, rows, draw) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const r of rows) draw(body.insertRow(), r);
}

function draw(s) {
  document.getElementById("node").textContent = "— node " + s.node;
  const leader = s.leader === null ? "no leader" : "leader: node " + s.leader;
  document.getElementById("summary").textContent =
    leader + " · term " + s.term + " · " + s.sessions + " sessions · " +
    s.locks_total + " locks · " + s.waiters_total + " waiting · updated " +
    new Date().toLocaleTimeString();
  document.getElementById("stale").textContent = "";
  fill("members", s.members, (row, m) => {
    row.dataset.node = m.id;
    const r = m.report;
    cell(row, m.id + (m.voter ? "" : " (learner)"));
    cell(row, m.addr);
    cell(row, r ? r.role : null, r && r.role === "leader" ? "leader" : "");
    cell(row, r && r.term, "num");
    cell(row, r && r.last_log_index, "num");
    cell(row, r && r.commit_index, "num");
    cell(row, r && r.applied_index, "num");
    cell(row, m.lag, "num");
    cell(row, m.last_ack_ms === null ? null : ms(m.last_ack_ms), "num");
    const health = cell(row, m.health, m.health);
    if (m.error) health.title = m.error;
  });
  const shown = s.locks.length < s.locks_total
    ? "(first " + s.locks.length + " of " + s.locks_total + ")" : "(" + s.locks_total + ")";
  document.getElementById("lockcount").textContent = shown;
  const longest = Math.max(1, ...s.locks.map((l) => l.time_left_ms || 0));
  fill("locks", s.locks, (row, l) => {
    row.dataset.lock = l.name;
    cell(row, l.name);
    if (l.in_lock_delay) cell(row, "in lock-delay", "delay");
    else if (l.shape === "mutex") cell(row, session(l.holder, l.holder_label));
    else cell(row, recipe(l));
    cell(row, l.token, "num");
    cell(row, l.waiters.length ? l.waiters.map((w) => session(w[0], w[1])).join(", ") : "");
    const left = cell(row, ms(l.time_left_ms), "num");
    if (l.time_left_ms !== null) {
      const bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = Math.round(60 * l.time_left_ms / longest) + "px";
      left.appendChild(bar);
    }
  });
  fill("recent", s.recent, (row, e) => {
    cell(row, new Date(e.at_unix_ms).toLocaleTimeString());
    cell(row, e.kind === "expiry" ? "lease expired"
      : "lock-delay " + ms(e.lock_delay_ms), e.kind === "expiry" ? "" : "delay");
    cell(row, e.session);
    cell(row, e.lock);
    cell(row, e.token, "num");
    cell(row, e.index, "num");
  });
}

async function refresh() {
  try {
    const answer = await fetch("/status.json", { cache: "no-store" });
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    draw(await answer.json());
  } catch (e) {
    document.getElementById("stale").textContent =
      "this node did not answer (" + e.message + "); showing the last answer";
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
