// Kronk's browser UI: plain ES module, no build step. It calls the server's own API with
// the token kept in this browser (Settings), and reads streams (chat, pull progress) as
// server-sent events through fetch, which, unlike EventSource, can send that token.

const TOKEN_KEY = "kronk.token";
const THEME_KEY = "kronk.theme";
const PAGES = ["dashboard", "chat", "models", "catalog", "libraries", "security", "docs", "settings"];

const $ = (id) => document.getElementById(id);

// A model's answer is untrusted text. marked (static/vendor/) turns its Markdown into HTML;
// HTML written in the answer itself is shown as the text it is ("use <br>" stays readable,
// and a tag never reaches a parser); DOMPurify then removes from marked's HTML whatever
// could run (javascript: links and images) before it reaches the page. The
// Content-Security-Policy is the last line: it blocks any inline script that got through.
const { marked, DOMPurify } = globalThis;

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}

const markdown = new marked.Marked({ renderer: { html: ({ text }) => escapeHtml(text) } });

// Links leave the UI in a new tab that gets no handle on this page and no referrer.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

function renderMarkdown(node, text) {
  node.innerHTML = DOMPurify.sanitize(markdown.parse(text));
}

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) {
    if (child !== undefined && child !== null) node.append(child);
  }
  return node;
}

function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

function headers(json) {
  const found = {};
  if (token()) found.Authorization = `Bearer ${token()}`;
  if (json) found["Content-Type"] = "application/json";
  return found;
}

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: fall back to the status line
  }
  const error = body && body.error;
  const message = error && error.message ? error.message : `${response.status} ${response.statusText}`;
  return new ApiError(response.status, message, error && error.code);
}

async function api(path, { method = "GET", body } = {}) {
  const response = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw await errorOf(response);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

// Server-sent events from a fetch: yields {event, data} per frame; comments are skipped.
async function* events(path, { method = "GET", body, signal } = {}) {
  const response = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of frame.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

function showError(error) {
  let text = error instanceof Error ? error.message : String(error);
  if (error instanceof ApiError && error.status === 401) {
    text += " (enter a token in Settings)";
  } else if (error instanceof ApiError && error.status === 403) {
    text += " (this page needs an admin token)";
  }
  $("banner-text").textContent = text;
  $("banner").hidden = false;
}

function clearError() {
  $("banner").hidden = true;
}

function bytes(count) {
  if (count === null || count === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const whole = Math.round(seconds);
  if (whole < 60) return `${whole}s`;
  const minutes = Math.floor(whole / 60);
  if (minutes < 60) return `${minutes}m${String(whole % 60).padStart(2, "0")}s`;
  return `${Math.floor(minutes / 60)}h${String(minutes % 60).padStart(2, "0")}m`;
}

function fill(body, rows, emptyText, columns) {
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { colspan: columns, class: "empty", text: emptyText })));
    return;
  }
  body.append(...rows);
}

// ---- pages -----------------------------------------------------------------------------

const pages = {};

// Live charts: the engines' counters every LIVE_SECONDS while the dashboard is shown.
const LIVE_SECONDS = 2;
const LIVE_POINTS = 60;
const live = { timer: null, last: null, tokens: [], ttft: [], requests: [], slots: [] };

function drawChart(svg, values) {
  const top = Math.max(1, ...values);
  const step = 300 / (LIVE_POINTS - 1);
  const offset = LIVE_POINTS - values.length;
  const points = values.map((value, index) => `${((offset + index) * step).toFixed(1)},${(58 - (value / top) * 56).toFixed(1)}`);
  svg.querySelector("polyline").setAttribute("points", points.join(" "));
  svg.dataset.points = String(values.length);
}

function pushPoint(series, value) {
  series.push(value);
  if (series.length > LIVE_POINTS) series.shift();
}

async function sampleLive() {
  const [slots, chats] = await Promise.all([api("/v1/kronk/slots"), api("/v1/kronk/ui/live")]);
  const now = performance.now() / 1000;
  let generated = 0;
  let running = 0;
  let busy = 0;
  let total = 0;
  for (const model of slots.data) {
    generated += model.engine.generated_tokens;
    running += model.engine.active + model.engine.queued;
    busy += model.slots.filter((slot) => slot.busy).length;
    total += model.slots.length;
  }
  if (live.last) {
    const rate = Math.max(0, generated - live.last.generated) / Math.max(0.001, now - live.last.at);
    pushPoint(live.tokens, rate);
    $("dash-live-tps").textContent = rate.toFixed(1);
    // The average of the chats that finished since the last read; none finished: no change.
    const finished = chats.ttft_count - live.last.ttftCount;
    const ttft = finished > 0 ? (chats.ttft_seconds - live.last.ttftSeconds) / finished : live.ttft.at(-1) ?? 0;
    pushPoint(live.ttft, ttft);
    $("dash-live-ttft").textContent = ttft.toFixed(2);
  }
  live.last = { at: now, generated, ttftCount: chats.ttft_count, ttftSeconds: chats.ttft_seconds };
  pushPoint(live.requests, running);
  pushPoint(live.slots, busy);
  $("dash-live-requests").textContent = String(running);
  $("dash-live-slots").textContent = `${busy} / ${total}`;
  drawChart($("dash-chart-tokens"), live.tokens);
  drawChart($("dash-chart-ttft"), live.ttft);
  drawChart($("dash-chart-requests"), live.requests);
  drawChart($("dash-chart-slots"), live.slots);
}

function startLive() {
  if (live.timer) return;
  const tick = () => sampleLive().catch(() => {});
  tick();
  live.timer = setInterval(() => (currentPage() === "dashboard" ? tick() : stopLive()), LIVE_SECONDS * 1000);
}

function stopLive() {
  clearInterval(live.timer);
  live.timer = null;
  live.last = null;
}

pages.dashboard = async function loadDashboard() {
  const live = await api("/v1/liveness");
  $("server-version").textContent = `kronk ${live.version}`;
  $("dash-host").textContent = live.host;
  const ready = await fetch("/v1/readiness", { headers: headers(false) });
  const readiness = await ready.json();
  $("dash-status").textContent = readiness.status;
  $("dash-model").textContent = readiness.model || "–";
  $("dash-model-state").textContent = readiness.model_state ? `state: ${readiness.model_state}` : "";
  const available = await api("/v1/models");
  $("dash-available").textContent = String(available.data.length);
  const pool = await api("/v1/kronk/models");
  $("dash-loaded").textContent = String(pool.data.length);
  $("dash-pool").textContent = `of ${pool.models_in_cache} places; idle models unload after ${duration(pool.cache_ttl_seconds)}, but a preloaded one or one a request keeps (keep_alive)`;
  const slots = await api("/v1/kronk/slots");
  fill(
    $("dash-slots"),
    slots.data.map((model) => {
      const busy = model.slots.filter((slot) => slot.busy).length;
      const counters = model.counters;
      return el(
        "tr",
        {},
        el("td", { text: model.model }),
        el("td", { text: model.cache }),
        el("td", { class: "num", text: `${busy} / ${model.slots.length}` }),
        el("td", { class: "num", text: String(counters.hits ?? 0) }),
        el("td", { class: "num", text: String(counters.partial_hits ?? 0) }),
        el("td", { class: "num", text: String(counters.rebuilds ?? 0) }),
        el("td", { class: "num", text: String(counters.evictions ?? 0) }),
        el("td", { class: "num", text: String(counters.tokens_saved ?? 0) }),
      );
    }),
    "No chat model is loaded.",
    8,
  );
  startLive();
};

// ---- chat

const chat = { history: [], controller: null };

pages.chat = async function loadChat() {
  const select = $("chat-model");
  const chosen = select.value;
  const models = await api("/v1/models");
  select.replaceChildren(...models.data.map((model) => el("option", { value: model.id, text: model.id })));
  if (chosen && models.data.some((model) => model.id === chosen)) select.value = chosen;
};

function chatMessage(role, text) {
  $("chat-empty").hidden = true;
  // The user's own words stay plain text; only answers are read as Markdown.
  const content = el("div", { class: role === "user" ? "content" : "content markdown", text });
  const node = el("div", { class: `msg ${role}`, "data-role": role }, el("div", { class: "role", text: role }), content);
  $("chat-log").append(node);
  node.scrollIntoView({ block: "end" });
  return { node, content };
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("chat-text").value.trim();
  if (!text || chat.controller) return;
  clearError();
  $("chat-text").value = "";
  chat.history.push({ role: "user", content: text });
  chatMessage("user", text);
  const answer = chatMessage("assistant", "");
  answer.node.classList.add("streaming");
  const reasoning = el("div", { class: "text markdown" });
  const reasoningBlock = el("details", { class: "reasoning", open: true, hidden: true }, el("summary", { text: "Reasoning" }), reasoning);
  answer.content.before(reasoningBlock);
  const messages = [];
  const system = $("chat-system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.history);
  const body = {
    model: $("chat-model").value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("chat-temperature").value),
    top_p: Number($("chat-top-p").value),
    max_tokens: Number($("chat-max-tokens").value) || 256,
  };
  chat.controller = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").hidden = false;
  let content = "";
  let thought = "";
  let finish = "";
  let usage = null;
  // Measured here, as the user sees it: the first token's arrival, then the stream's pace.
  const sent = performance.now();
  let firstAt = null;
  try {
    for await (const frame of events("/v1/chat/completions", { method: "POST", body, signal: chat.controller.signal })) {
      if (frame.data === "[DONE]") break;
      const chunk = JSON.parse(frame.data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (firstAt === null && (delta.content || delta.reasoning_content)) firstAt = performance.now();
        if (delta.reasoning_content) {
          thought += delta.reasoning_content;
          renderMarkdown(reasoning, thought);
          reasoningBlock.hidden = !$("chat-show-reasoning").checked;
        }
        if (delta.content) {
          content += delta.content;
          renderMarkdown(answer.content, content);
          answer.node.scrollIntoView({ block: "end" });
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    chat.history.push({ role: "assistant", content });
  } catch (error) {
    if (error.name === "AbortError") {
      finish = "stopped";
      chat.history.push({ role: "assistant", content });
    } else {
      answer.node.classList.add("error");
      if (!content) answer.content.textContent = error.message;
      chat.history.pop();
      showError(error);
    }
  } finally {
    answer.node.classList.remove("streaming");
    answer.node.dataset.done = "true";
    const parts = [];
    if (finish) parts.push(`finish: ${finish}`);
    if (usage) parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
    if (firstAt !== null) {
      const ttft = (firstAt - sent) / 1000;
      answer.node.dataset.ttft = ttft.toFixed(3);
      parts.push(`TTFT ${ttft.toFixed(2)} s`);
      const seconds = (performance.now() - firstAt) / 1000;
      if (usage && usage.completion_tokens > 1 && seconds > 0) {
        const pace = (usage.completion_tokens - 1) / seconds;
        answer.node.dataset.tokensPerSecond = pace.toFixed(1);
        parts.push(`${pace.toFixed(1)} tokens/s`);
      }
    }
    if (parts.length) answer.node.append(el("div", { class: "meta", text: parts.join(" · ") }));
    $("chat-usage").textContent = usage ? `Last answer: ${usage.completion_tokens} tokens` : "";
    chat.controller = null;
    $("chat-send").disabled = false;
    $("chat-stop").hidden = true;
  }
}

function newChat() {
  if (chat.controller) chat.controller.abort();
  chat.history = [];
  $("chat-log").replaceChildren($("chat-empty"));
  $("chat-empty").hidden = false;
  $("chat-usage").textContent = "";
}

// ---- models

pages.models = async function loadModels() {
  const pool = await api("/v1/kronk/models");
  $("models-pool").textContent = `${pool.data.length} of ${pool.models_in_cache} places in use.`;
  fill(
    $("models-loaded"),
    pool.data.map((model) =>
      el(
        "tr",
        { "data-model": model.id },
        el("td", { text: model.id }),
        el("td", { text: model.capabilities.join(", ") }),
        el("td", { class: "num", text: bytes(model.memory_bytes) }),
        el("td", { class: "num", text: String(model.slots) }),
        el("td", { class: "num", text: String(model.active_requests) }),
        el("td", { class: "num", text: model.ttl_left_seconds === null ? "never (kept loaded)" : duration(model.ttl_left_seconds) }),
        el("td", {}, el("button", { class: "danger small", type: "button", text: "Unload", onclick: () => unload(model.id) })),
      ),
    ),
    "No model is loaded; one loads on its first request.",
    7,
  );
  const loaded = new Set(pool.data.map((model) => model.id));
  const available = await api("/v1/models");
  fill(
    $("models-available"),
    available.data.map((model) =>
      el(
        "tr",
        { "data-model": model.id },
        el("td", { text: model.id }),
        el("td", { text: model.owned_by || "" }),
        el("td", { text: (model.input_modalities || ["text"]).join(", ") }),
        el("td", {}, el("span", { class: loaded.has(model.id) ? "pill ok" : "pill", text: loaded.has(model.id) ? "loaded" : "on disk" })),
        el("td", {}, el("button", { class: "danger small", type: "button", text: "Delete", onclick: () => deleteModel(model.id, loaded.has(model.id)) })),
      ),
    ),
    "No models.",
    5,
  );
};

async function unload(modelId) {
  await api(`/v1/kronk/models/${encodeURIComponent(modelId)}/unload`, { method: "POST" });
  await pages.models();
}

// The server deletes only what it installed or pulled under <base>/models, as `kronk model
// rm` does; anything else it refuses, saying why, and the banner shows that.
async function deleteModel(modelId, isLoaded) {
  const question = isLoaded
    ? `Unload ${modelId} and delete its files from the server's disk?`
    : `Delete ${modelId}'s files from the server's disk?`;
  if (!window.confirm(question)) return;
  clearError();
  try {
    await api(`/v1/kronk/models/${encodeURIComponent(modelId)}${isLoaded ? "?force=true" : ""}`, { method: "DELETE" });
  } catch (error) {
    showError(error);
    return;
  }
  await pages.models();
}

// ---- catalog and downloads

const followed = new Set();

pages.catalog = async function loadCatalog() {
  const filter = $("catalog-filter").value.trim();
  const query = filter ? `?category=${encodeURIComponent(filter)}` : "";
  const catalog = await api(`/v1/kronk/catalog${query}`);
  fill(
    $("catalog-models"),
    catalog.data.map((model) => {
      const size = model.files.reduce((sum, file) => (file.size === null || sum === null ? null : sum + file.size), 0);
      return el(
        "tr",
        { "data-model": model.id },
        el("td", { class: "nowrap", text: model.category }),
        el("td", {}, el("div", { text: model.id }), el("div", { class: "muted", text: model.description })),
        el("td", { class: "nowrap", text: model.endpoint }),
        el("td", { class: "num nowrap", text: bytes(size) }),
        el("td", {}, el("span", { class: model.pulled || model.packaged ? "pill ok" : "pill", text: model.pulled ? "yes" : model.packaged ? "package" : "no" })),
        el("td", {}, el("button", { type: "button", class: "small", text: model.pulled ? "Pulled" : "Pull", disabled: model.pulled, onclick: () => startPull({ model: model.id }) })),
      );
    }),
    "No catalog models match.",
    6,
  );
  for (const problem of catalog.problems) {
    showError(`catalog ${problem.file} skipped: ${problem.message}`);
  }
  const pulls = await api("/v1/kronk/pulls");
  if (pulls.data.length) $("pulls").replaceChildren();
  for (const pull of pulls.data.slice().reverse()) {
    renderPull(pull);
    if (pull.status === "running") follow(pull.id);
  }
};

function pullRow(pull) {
  let row = $(`pull-${pull.id}`);
  if (!row) {
    const empty = $("pulls").querySelector(".empty");
    if (empty) empty.remove();
    row = el(
      "div",
      { class: "pull", id: `pull-${pull.id}`, "data-model": pull.model },
      el("div", { class: "name", text: pull.model }),
      el("progress", { max: "100", value: "0" }),
      el("div", { class: "percent" }),
      el("div", { class: "status pill" }),
      el("div", { class: "figures" }),
    );
    $("pulls").prepend(row);
  }
  return row;
}

function renderPull(pull) {
  const row = pullRow(pull);
  const percent = pull.percent ?? (pull.status === "done" ? 100 : 0);
  row.querySelector("progress").value = percent;
  row.querySelector(".percent").textContent = `${percent.toFixed(percent === 100 ? 0 : 1)}%`;
  const status = row.querySelector(".status");
  status.textContent = pull.status;
  status.className = `status pill ${pull.status === "done" ? "ok" : pull.status === "failed" ? "bad" : ""}`;
  row.dataset.status = pull.status;
  const figures = [`${bytes(pull.done_bytes)} of ${bytes(pull.total_bytes)}`];
  if (pull.status === "running") {
    figures.push(`${bytes(pull.bytes_per_second)}/s`, `${duration(pull.eta_seconds)} left`);
  }
  row.querySelector(".figures").textContent = figures.join(" · ");
  let error = row.querySelector(".error");
  if (pull.error && !error) {
    error = el("div", { class: "error" });
    row.append(error);
  }
  if (error) error.textContent = pull.error ? pull.error.message : "";
}

async function follow(pullId) {
  if (followed.has(pullId)) return;
  followed.add(pullId);
  try {
    for await (const frame of events(`/v1/kronk/pulls/${pullId}/events`)) {
      const pull = JSON.parse(frame.data);
      renderPull(pull);
      if (pull.status !== "running") {
        if (pull.status === "done" && currentPage() === "catalog") await pages.catalog();
        return;
      }
    }
  } catch (error) {
    showError(error);
  } finally {
    followed.delete(pullId);
  }
}

async function startPull(body) {
  clearError();
  try {
    const pull = await api("/v1/kronk/pulls", { method: "POST", body });
    renderPull(pull);
    follow(pull.id);
  } catch (error) {
    showError(error);
  }
}

// ---- keys and tokens

pages.security = async function loadSecurity() {
  let keys;
  try {
    keys = await api("/v1/kronk/security/keys");
  } catch (error) {
    if (error instanceof ApiError && (error.code === "auth_disabled" || error.status === 404)) {
      $("security-off").hidden = false;
      $("security-on").hidden = true;
      return;
    }
    throw error;
  }
  $("security-off").hidden = true;
  $("security-on").hidden = false;
  fill(
    $("keys"),
    keys.data.map((key) =>
      el(
        "tr",
        { "data-key": key.id },
        el("td", {}, el("code", { text: key.id })),
        el("td", { text: key.created }),
        el("td", {}, key.id === "master"
          ? el("span", { class: "muted", text: "signs admin tokens" })
          : el("button", { class: "danger small", type: "button", text: "Delete", onclick: () => deleteKey(key.id) })),
      ),
    ),
    "No keys.",
    3,
  );
};

async function deleteKey(keyId) {
  if (!window.confirm(`Delete key ${keyId}? Every token it signed stops working.`)) return;
  await api(`/v1/kronk/security/keys/${encodeURIComponent(keyId)}`, { method: "DELETE" });
  await pages.security();
}

async function createToken(event) {
  event.preventDefault();
  clearError();
  try {
    const result = await api("/v1/kronk/security/tokens", {
      method: "POST",
      body: { duration: $("token-duration").value.trim(), endpoints: $("token-endpoints").value.trim() },
    });
    $("token-value").value = result.token;
    $("token-result").hidden = false;
  } catch (error) {
    showError(error);
  }
}

// ---- settings

// ---- libraries

pages.libraries = async function loadLibraries() {
  const libs = await api("/v1/kronk/libs");
  $("libs-processor").textContent = libs.processor || "llama-cpp-python's own (CPU)";
  $("libs-directory").textContent = libs.directory;
  $("libs-version").textContent = libs.current;
  $("libs-platform").textContent = `${libs.os}, ${libs.arch}; builds go to ${libs.libraries_path}`;
  fill(
    $("libs-installed"),
    libs.installed.map((build) =>
      el(
        "tr",
        { "data-processor": build.processor },
        el("td", { text: build.processor }),
        el("td", { text: build.llama_cpp_python }),
        el("td", { text: build.built_at || "–" }),
        el("td", { text: build.directory }),
      ),
    ),
    "No build of `kronk libs` is installed: the server runs llama-cpp-python's own libraries.",
    4,
  );
};

// ---- documentation, read from the server's own code

const reference = { loaded: null };

function referenceEntry(title, help, details) {
  const entry = el("details", { class: "entry", "data-title": title.toLowerCase() }, el("summary", {}, el("code", { text: title }), el("span", { class: "muted", text: help ? ` ${help}` : "" })));
  if (details) entry.append(details);
  return entry;
}

function filterReference() {
  const wanted = $("docs-filter").value.trim().toLowerCase();
  for (const entry of document.querySelectorAll("#page-docs details.entry")) {
    entry.hidden = wanted !== "" && !entry.dataset.title.includes(wanted) && !entry.textContent.toLowerCase().includes(wanted);
  }
}

pages.docs = async function loadDocs() {
  if (!reference.loaded) {
    reference.loaded = await api("/v1/kronk/ui/reference");
    $("docs-cli").replaceChildren(
      ...reference.loaded.cli.map((command) => {
        const options = el("table", { class: "table" }, el("tbody", {}, ...command.options.map((option) => el("tr", {}, el("td", {}, el("code", { text: option.flags })), el("td", { text: option.help })))));
        return referenceEntry(command.command, command.help, command.options.length ? options : null);
      }),
    );
    $("docs-sdk").replaceChildren(
      ...reference.loaded.sdk.map((method) =>
        referenceEntry(`${method.async ? "await " : ""}kronk.${method.signature}`, "", el("pre", { class: "code", text: method.doc || "(no description)" })),
      ),
    );
  }
  filterReference();
};

pages.settings = async function loadSettings() {
  $("settings-token").value = token();
  const theme = document.documentElement.dataset.theme;
  for (const radio of document.querySelectorAll('input[name="theme"]')) radio.checked = radio.value === theme;
};

function showTokenState() {
  const state = $("token-state");
  state.textContent = token() ? "token set" : "no token";
  state.className = token() ? "pill ok" : "pill";
}

// ---- navigation

function currentPage() {
  const name = location.hash.replace(/^#\//, "");
  return PAGES.includes(name) ? name : "dashboard";
}

async function show() {
  const name = currentPage();
  for (const page of PAGES) $(`page-${page}`).hidden = page !== name;
  for (const link of document.querySelectorAll(".sidebar a")) {
    link.classList.toggle("active", link.dataset.page === name);
  }
  clearError();
  try {
    await pages[name]();
  } catch (error) {
    showError(error);
  }
}

function setTheme(theme) {
  document.documentElement.dataset.theme = theme;
  localStorage.setItem(THEME_KEY, theme);
}

function start() {
  setTheme(localStorage.getItem(THEME_KEY) || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"));
  $("banner-close").addEventListener("click", clearError);
  $("dashboard-refresh").addEventListener("click", show);
  $("models-refresh").addEventListener("click", show);
  $("catalog-refresh").addEventListener("click", show);
  $("security-refresh").addEventListener("click", show);
  $("catalog-filter").addEventListener("change", show);
  $("libraries-refresh").addEventListener("click", show);
  $("docs-filter").addEventListener("input", filterReference);
  $("chat-form").addEventListener("submit", sendChat);
  $("chat-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("chat-stop").addEventListener("click", () => chat.controller && chat.controller.abort());
  $("chat-clear").addEventListener("click", newChat);
  for (const [input, output] of [["chat-temperature", "chat-temperature-value"], ["chat-top-p", "chat-top-p-value"]]) {
    $(input).addEventListener("input", () => { $(output).textContent = $(input).value; });
  }
  $("chat-show-reasoning").addEventListener("change", () => {
    for (const block of document.querySelectorAll("details.reasoning")) {
      block.hidden = !$("chat-show-reasoning").checked || !block.querySelector(".text").textContent;
    }
  });
  $("url-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const proj = $("url-proj").value.trim();
    startPull(proj ? { url: $("url-model").value.trim(), proj } : { url: $("url-model").value.trim() });
  });
  $("key-create").addEventListener("click", async () => {
    try {
      await api("/v1/kronk/security/keys", { method: "POST" });
      await pages.security();
    } catch (error) {
      showError(error);
    }
  });
  $("token-form").addEventListener("submit", createToken);
  $("token-copy").addEventListener("click", () => navigator.clipboard.writeText($("token-value").value));
  $("settings-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(TOKEN_KEY, $("settings-token").value.trim());
    showTokenState();
    clearError();
  });
  $("settings-clear").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    $("settings-token").value = "";
    showTokenState();
  });
  for (const radio of document.querySelectorAll('input[name="theme"]')) {
    radio.addEventListener("change", () => setTheme(radio.value));
  }
  window.addEventListener("hashchange", show);
  showTokenState();
  api("/v1/liveness").then((live) => { $("server-version").textContent = `kronk ${live.version}`; }, () => {});
  show();
}

start();
