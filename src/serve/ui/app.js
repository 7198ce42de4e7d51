// broca's web view: reads the management surface (the sign-in's cookie goes with every
// request) and follows a session's subscription. It only reads; every text it shows is set as
// text, never parsed as markup.
"use strict";

const $ = (id) => document.getElementById(id);

/** An element with a class and children (strings become text). */
function el(tag, cls, ...children) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
  }
  return e;
}

function when(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

function notice(text) {
  $("notice").textContent = text || "";
}

/** One management request: its result, or an Error carrying the daemon's code. */
async function rpc(method, params) {
  const res = await fetch("/v1/rpc", {
    method: "POST",
    headers: { "content-type": "application/json" },
    credentials: "same-origin",
    body: JSON.stringify({ method, params }),
  });
  let body = null;
  try { body = await res.json(); } catch (_) { /* not JSON: named below */ }
  if (res.status === 401) {
    notice("Signed out: run `broca ui` for a new sign-in link.");
  }
  if (body && "result" in body) return body.result;
  const err = new Error(body && body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${res.status}`);
  err.code = body && body.error ? body.error.code : String(res.status);
  throw err;
}

const view = {
  filters: {},
  sessionsCursor: null,
  current: null,        // {project_root, harness, session}
  nextOrdinal: 0,
  unknown: new Set(),   // "run_id/call_id" of calls whose outcome is unknown
  source: null,         // the live EventSource
  lastId: null,         // the last control unit's id seen live
  retry: null,
};

function stateCell(run) {
  if (!run) return el("td", "muted", "none");
  const s = el("span", `state state-${run.state}`, run.state);
  return el("td", null, s, run.reason && run.reason !== run.state ? el("span", "muted", ` (${run.reason})`) : null);
}

// ---- sessions ----

async function loadSessions(reset) {
  if (reset) {
    view.sessionsCursor = null;
    $("sessions").tBodies[0].replaceChildren();
  }
  const params = { limit: 50, ...view.filters };
  if (view.sessionsCursor) params.cursor = view.sessionsCursor;
  let page;
  try {
    page = await rpc("sessions.list", params);
  } catch (e) {
    notice(`sessions.list: ${e.message}`);
    return;
  }
  const body = $("sessions").tBodies[0];
  for (const s of page.sessions || []) {
    const tr = el("tr", null,
      el("td", "session-name", s.session),
      el("td", null, s.harness),
      el("td", null, s.project_root),
      stateCell(s.last_run),
      el("td", null, s.runs ?? 0),
      el("td", null, when(s.active_at_ms)));
    tr.dataset.key = JSON.stringify([s.project_root, s.harness, s.session]);
    tr.tabIndex = 0;
    tr.addEventListener("click", () => selectSession(s));
    tr.addEventListener("keydown", (ev) => { if (ev.key === "Enter") selectSession(s); });
    if (view.current && tr.dataset.key === keyOf(view.current)) tr.classList.add("selected");
    body.append(tr);
  }
  view.sessionsCursor = page.next_cursor || null;
  $("more-sessions").hidden = !view.sessionsCursor;
  $("sessions-empty").hidden = body.rows.length > 0;
}

function keyOf(s) {
  return JSON.stringify([s.project_root, s.harness, s.session]);
}

function triple() {
  const { project_root, harness, session } = view.current;
  return { project_root, harness, session };
}

async function selectSession(s) {
  view.current = { project_root: s.project_root, harness: s.harness, session: s.session };
  view.lastId = null;
  location.hash = encodeURIComponent(keyOf(view.current));
  for (const tr of $("sessions").tBodies[0].rows) {
    tr.classList.toggle("selected", tr.dataset.key === keyOf(view.current));
  }
  $("session-pane").hidden = false;
  $("session-title").textContent = s.session;
  $("session-meta").textContent = `${s.harness} · ${s.project_root}`;
  $("live-text").textContent = "";
  $("live-events").replaceChildren();
  await refreshSession();
  follow();
}

async function refreshSession() {
  await loadRuns();
  view.nextOrdinal = 0;
  $("transcript").replaceChildren();
  await loadTranscript();
}

// ---- runs ----

async function loadRuns() {
  let page;
  try {
    page = await rpc("runs.list", { ...triple(), limit: 100 });
  } catch (e) {
    notice(`runs.list: ${e.message}`);
    return;
  }
  view.unknown = new Set();
  const body = $("runs").tBodies[0];
  body.replaceChildren();
  for (const r of page.runs || []) {
    const usage = r.usage || {};
    const unknown = r.indeterminate_tool_calls || [];
    for (const id of unknown) view.unknown.add(`${r.run_id}/${id}`);
    const cost = r.cost ? `${(r.cost.micros / 1e6).toFixed(4)} ${r.cost.currency}` : "";
    const tr = el("tr", unknown.length ? "run has-unknown" : "run",
      el("td", "run-id", r.run_id),
      stateCell(r),
      el("td", null, r.provider ? `${r.provider}/${r.model}` : r.model || ""),
      el("td", null, r.steps ?? ""),
      el("td", null, `${usage.input_tokens ?? 0} / ${usage.output_tokens ?? 0}`),
      el("td", null, cost),
      el("td", unknown.length ? "unknown-calls indeterminate" : "unknown-calls",
        unknown.length ? `${unknown.join(", ")}: may have run; not run again` : ""));
    tr.dataset.run = r.run_id;
    body.append(tr);
  }
}

// ---- transcript ----

const PAGE = 200;

async function loadTranscript() {
  let page;
  try {
    page = await rpc("session.read", { ...triple(), from_ordinal: view.nextOrdinal, limit: PAGE });
  } catch (e) {
    notice(`session.read: ${e.message}`);
    return;
  }
  const list = $("transcript");
  const messages = page.messages || [];
  for (const m of messages) {
    list.append(entry(m));
    view.nextOrdinal = (m.ordinal ?? view.nextOrdinal) + 1;
  }
  $("more-transcript").hidden = messages.length < PAGE;
}

function text(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "string" ? v : JSON.stringify(v, null, 2);
}

/** A transcript entry: its head, then its blocks (text, tool calls, tool results). */
function entry(m) {
  const msg = m.message && typeof m.message === "object" ? m.message : m;
  const role = msg.role || m.role || "?";
  const runId = m.run ? m.run.run_id : "";
  const li = el("li", `entry role-${role}`,
    el("div", "entry-head", `#${m.ordinal} ${role}${runId ? ` · ${runId}` : ""} · ${when(m.written_at)}`));
  li.dataset.ordinal = m.ordinal;
  const content = msg.content;
  if (role === "tool") {
    const unknown = msg.reason === "outcome_unknown" || view.unknown.has(`${runId}/${msg.tool_use_id}`);
    const r = el("div", `result${msg.is_error ? " error" : ""}${unknown ? " indeterminate" : ""}`,
      `${msg.tool_use_id || ""} → ${text(content)}`);
    if (unknown) r.append(el("span", "badge", "outcome unknown"));
    li.append(r);
    return li;
  }
  if (typeof content === "string") {
    li.append(el("div", "text", content));
    return li;
  }
  for (const b of content || []) {
    const [kind, body] = b.type ? [b.type, b] : Object.entries(b)[0] || [];
    if (kind === "text") {
      li.append(el("div", "text", text(body.text)));
    } else if (kind === "tool_use" || kind === "tool_call") {
      const unknown = view.unknown.has(`${runId}/${body.id}`);
      const call = el("div", `call${unknown ? " indeterminate" : ""}`,
        `${body.name}(${text(body.input)})  [${body.id}]`);
      if (unknown) call.append(el("span", "badge", "outcome unknown: not run again"));
      li.append(call);
    } else if (kind === "tool_result") {
      li.append(el("div", `result${body.is_error ? " error" : ""}`, text(body.content)));
    } else if (kind === "thinking" || kind === "reasoning") {
      li.append(el("div", "text muted", "(reasoning)"));
    } else if (kind) {
      li.append(el("div", "text muted", `(${kind})`));
    }
  }
  return li;
}

// ---- live ----

function liveState(text, cls) {
  const s = $("live-state");
  s.textContent = text;
  s.className = `pill ${cls || ""}`;
}

/** Follows the current session's subscription, live from now; after a drop it goes on from
 * the last unit seen (the browser sends Last-Event-ID; a new stream names it with `from`). */
function follow() {
  if (view.source) view.source.close();
  clearTimeout(view.retry);
  const q = new URLSearchParams(triple());
  if (view.lastId) q.set("from", view.lastId);
  const key = keyOf(view.current);
  const es = new EventSource(`/v1/subscribe?${q}`);
  view.source = es;
  es.onopen = () => liveState("live", "on");
  es.onmessage = (ev) => {
    if (keyOf(view.current) !== key) return;
    view.lastId = ev.lastEventId || view.lastId;
    let unit;
    try { unit = JSON.parse(ev.data); } catch (_) { return; }
    onUnit(unit);
  };
  es.addEventListener("display", (ev) => {
    try { $("live-text").append(JSON.parse(ev.data).text || ""); } catch (_) { /* skip */ }
  });
  es.addEventListener("display_gap", () => $("live-text").append(" … "));
  es.addEventListener("end", (ev) => {
    // The daemon ended the subscription (this view fell behind, say): catch up from the
    // last unit seen.
    es.close();
    let why = "";
    try { why = JSON.parse(ev.data).reason; } catch (_) { /* skip */ }
    if (why) $("live-events").append(el("li", null, `subscription ended: ${why}`));
    liveState("reconnecting", "retry");
    view.retry = setTimeout(() => { if (keyOf(view.current) === key) follow(); }, 2000);
  });
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) {
      // The browser gave up (serve restarted, or refused): start again from the cursor.
      liveState("reconnecting", "retry");
      view.retry = setTimeout(() => { if (keyOf(view.current) === key) follow(); }, 2000);
    } else {
      liveState("reconnecting", "retry");
    }
  };
}

function onUnit(u) {
  const events = $("live-events");
  const line = (t) => {
    events.append(el("li", `unit unit-${u.type}`, t));
    events.scrollTop = events.scrollHeight;
  };
  switch (u.type) {
    case "run_started":
      $("live-text").textContent = "";
      line(`run ${u.run_id} started (${u.model})`);
      loadRuns();
      break;
    case "step_started":
      line(`step ${u.step}`);
      break;
    case "send_steered":
      line(`steered into run ${u.run_id}: ${u.prompt}`);
      break;
    case "tool_call":
      line(`tool call ${u.call && u.call.name} [${u.call && u.call.id}]`);
      break;
    case "tool_result":
      line(`tool result [${u.result && u.result.call_id}]`);
      break;
    case "run_finished":
      line(`run ${u.run_id} finished: ${u.reason}`);
      refreshSession();
      loadSessions(true);
      break;
    case "message":
      if (u.message && u.message.role === "assistant") $("live-text").textContent = "";
      appendLive(u);
      break;
    default:
      break;
  }
}

/** A message that became durable joins the transcript without a reload. */
function appendLive(u) {
  if (!u.message) return;
  const list = $("transcript");
  const m = { ordinal: view.nextOrdinal, message: u.message, run: { run_id: u.run_id }, written_at: Date.now() };
  const li = entry(m);
  li.classList.add("live");
  list.append(li);
  view.nextOrdinal += 1;
}

// ---- start ----

async function health() {
  try {
    const res = await fetch("/healthz", { credentials: "same-origin" });
    const h = await res.json();
    $("health").textContent = `serve: ${h.status}`;
  } catch (_) {
    $("health").textContent = "serve: unreachable";
  }
}

function start() {
  $("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const state = $("state-filter").value;
    const project = $("project-filter").value.trim();
    view.filters = {};
    if (state) view.filters.state = state;
    if (project) view.filters.project_root = project;
    loadSessions(true);
  });
  $("more-sessions").addEventListener("click", () => loadSessions(false));
  $("more-transcript").addEventListener("click", () => loadTranscript());
  $("sign-out").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", credentials: "same-origin" });
    if (view.source) view.source.close();
    notice("Signed out.");
  });
  health();
  loadSessions(true).then(() => {
    if (!location.hash) return;
    try {
      const [project_root, harness, session] = JSON.parse(decodeURIComponent(location.hash.slice(1)));
      selectSession({ project_root, harness, session });
    } catch (_) { /* not a session's key */ }
  });
}

start();
