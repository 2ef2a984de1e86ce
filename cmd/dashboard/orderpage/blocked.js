// The blocked-orders page. It fetches a page of the list from
// <root>/blocked-orders.json with this page's ?reason=, ?cursor= and
// ?limit=, and renders it with textContent only: the dashboard has escaped
// every string that came from Redis (control and bidi characters, as the
// order page shows them) and built every link to an order page or to
// asynqmon. Errors are shown on the page, never thrown. When it is done,
// <main> has data-state="loaded" or "error". With writes on, each row has
// the operator actions the dashboard offers for its reason (see act).
"use strict";
(() => {
  // sameOrigin returns path, an absolute path the dashboard built, as a URL
  // of this page's origin. A page opened with credentials in its URL
  // (http://user:pass@host/blocked-orders, as a bookmark or a monitoring
  // check would) cannot fetch a URL resolved against its own: fetch
  // refuses a URL that includes credentials. The origin has none, and
  // the browser sends the credentials it logged in with as usual.
  const sameOrigin = (path) => window.location.origin + path;
  const main = document.getElementById("blocked");
  const readOnly = main.dataset.readOnly === "true";
  const params = new URLSearchParams(window.location.search);
  const reason = params.get("reason") || "";
  const cursor = params.get("cursor") || "";
  const limit = params.get("limit") || "";

  // query is the query string of a page of the list: reason r, after
  // cursor c, of this page's size.
  const query = (r, c) => {
    const q = [];
    if (limit) {
      q.push("limit=" + encodeURIComponent(limit));
    }
    if (r) {
      q.push("reason=" + encodeURIComponent(r));
    }
    if (c) {
      q.push("cursor=" + encodeURIComponent(c));
    }
    return q.length ? "?" + q.join("&") : "";
  };

  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) {
      e.textContent = String(text);
    }
    if (cls) {
      e.className = cls;
    }
    return e;
  };
  // link is an <a> to href, a link the dashboard built (or a query of this
  // page); plain text when there is none.
  const link = (href, text, cls) => {
    if (!href) {
      return el("span", text, cls);
    }
    const a = el("a", text, cls);
    a.setAttribute("href", href);
    return a;
  };

  // age says how long ms is, to the second: "45s", "3m12s", "2h05m",
  // "3d04h"; under a second, "250ms".
  const age = (ms) => {
    if (ms > 0 && ms < 1000) {
      return ms + "ms";
    }
    const s = Math.max(0, Math.round(ms / 1000));
    const pad = (n) => String(n).padStart(2, "0");
    if (s < 60) {
      return s + "s";
    }
    if (s < 3600) {
      return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
    }
    if (s < 86400) {
      return Math.floor(s / 3600) + "h" + pad(Math.floor(s / 60) % 60) + "m";
    }
    return Math.floor(s / 86400) + "d" + pad(Math.floor(s / 3600) % 24) + "h";
  };

  const showError = (msg) => {
    document.getElementById("error-text").textContent = msg;
    document.getElementById("error").hidden = false;
    document.getElementById("read-at").textContent = "";
    main.dataset.state = "error";
  };

  // act sends operator action a (one of a row's b.actions, built by the
  // dashboard: the order page's endpoint) with the reason typed at the top
  // of the page, says the outcome in #action-result, and reads the list
  // again after a success. #action-result's data-state is "sending", then
  // "refused", or "done" once the list is read again.
  const act = async (a, button) => {
    if (a.confirm && !window.confirm(a.confirm)) {
      return;
    }
    const out = document.getElementById("action-result");
    const reasonField = document.getElementById("action-reason");
    const what = a.label + " " + button.dataset.order;
    button.disabled = true;
    out.dataset.state = "sending";
    out.textContent = what + "…";
    let r;
    let body = null;
    try {
      r = await fetch(sameOrigin(a.url), {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ reason: reasonField ? reasonField.value : "" }),
      });
      try {
        body = await r.json();
      } catch (_e) {
        // not JSON (a refusal before the dashboard's handler): said below
      }
    } catch (e) {
      out.textContent = what + " failed: could not reach the dashboard: " + e;
      out.dataset.state = "refused";
      button.disabled = false;
      return;
    }
    if (!r.ok) {
      out.textContent = what + " refused: " + (body && typeof body.error === "string" ? body.error : r.status + " " + r.statusText);
      out.dataset.state = "refused";
      button.disabled = false;
      return;
    }
    out.textContent = what + ": " + (body && body.detail ? body.detail : "done");
    await load();
    out.dataset.state = "done";
  };

  // actions returns the buttons of blocked order b's actions cell, which is
  // there only when the dashboard has writes on: one per action the
  // dashboard offers for its reason (b.actions: retry now, skip, hold or
  // resume).
  const actions = (b) => (b.actions || []).map((a) => {
    const button = el("button", a.label, "order-action");
    button.type = "button";
    button.dataset.action = a.action;
    button.dataset.order = b.order_no;
    if (a.needs_reason) {
      button.title = "requires a reason";
    }
    button.addEventListener("click", () => act(a, button));
    return button;
  });

  const reasonCell = (b) => {
    const td = el("td");
    td.append(el("span", b.reason, "state reason-" + b.reason));
    return td;
  };

  // headCell shows the head: what it was reserved for, its task (linked to
  // asynqmon's page of it) and its state (linked to its queue's list).
  const headCell = (b) => {
    const td = el("td", null, "head");
    const h = b.head;
    if (!h) {
      td.textContent = "-";
      return td;
    }
    td.append(el("div", h.label || "position " + h.seq, "mono"));
    if (h.task_id) {
      const line = el("div");
      line.append(link(b.task_url, h.task_id, "mono task"), " ");
      line.append(link(b.state_url, h.task_state, "state state-" + h.task_state));
      if (h.queue) {
        line.append(" ", el("span", "in " + h.queue, "muted"));
      }
      td.append(line);
    }
    return td;
  };

  // whyCell shows the explanation (which says who holds a held order, and
  // why) and the links of the reason's detail: the task that holds a stale
  // lock, the order whose exchange creates this one.
  const whyCell = (b) => {
    const td = el("td", null, "why");
    td.append(el("div", b.explanation));
    const more = el("div", null, "muted");
    if (b.lock && b.stale_task_url) {
      more.append("stale task ", link(b.stale_task_url, b.lock.task_id, "mono"), " (" + b.lock.task_state + ")");
    }
    if (b.creation) {
      more.append("created by exchange " + b.creation.exchange + " of ", link(b.from_url, b.creation.from, "mono"));
      if (b.creation.cycle) {
        more.append(", a cycle");
      }
    }
    if (more.childNodes.length) {
      td.append(more);
    }
    return td;
  };

  const row = (b) => {
    const tr = el("tr");
    tr.dataset.order = b.order_no;
    tr.dataset.reason = b.reason;
    const no = el("td");
    no.append(link(b.order_url, b.order_no, "mono order"));
    tr.append(no, reasonCell(b));
    const since = el("td", age(b.age_ms) + " ago");
    since.title = b.since;
    tr.append(since, el("td", b.waiting, "num"), headCell(b), whyCell(b));
    if (!readOnly) {
      const td = el("td", null, "actions");
      td.append(...actions(b));
      tr.append(td);
    }
    return tr;
  };

  const render = (v) => {
    document.getElementById("error").hidden = true;
    document.getElementById("read-at").textContent = "Read at " + v.at + "; blocked after " + age(v.blocked_after_ms) +
      " of waiting. " + v.candidates + " order(s) looked at.";

    // The counts by reason, each a filter of the list.
    const list = document.getElementById("reason-list");
    let all = 0;
    for (const r of v.reasons) {
      all += v.counts[r] || 0;
    }
    const item = (r, label, n) => {
      const li = el("li");
      li.dataset.reason = r;
      const text = label + " " + n;
      li.append(r === reason ? el("strong", text) : link(main.dataset.page + query(r, ""), text));
      return li;
    };
    list.replaceChildren(item("", "all", all), ...v.reasons.map((r) => item(r, r, v.counts[r] || 0)));
    document.getElementById("truncated").hidden = !v.truncated;

    document.getElementById("list-title").textContent = (reason ? "Orders blocked for " + reason : "Orders") + ": " + v.total +
      (v.total > v.orders.length ? " (this page: " + v.orders.length + ")" : "");
    document.getElementById("orders").querySelector("tbody").replaceChildren(...v.orders.map(row));
    document.getElementById("orders").hidden = v.orders.length === 0;
    document.getElementById("none").hidden = v.orders.length !== 0;

    const next = document.getElementById("next");
    if (v.next_cursor) {
      next.setAttribute("href", main.dataset.page + query(reason, v.next_cursor));
      next.hidden = false;
    }
    const first = document.getElementById("first");
    if (cursor) {
      first.setAttribute("href", main.dataset.page + query(reason, ""));
      first.hidden = false;
    }
    main.dataset.state = "loaded";
  };

  const load = async () => {
    let r;
    try {
      r = await fetch(sameOrigin(main.dataset.api + query(reason, cursor)), { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (e) {
      showError("Could not reach the dashboard: " + e);
      return;
    }
    let body = null;
    try {
      body = await r.json();
    } catch (_e) {
      // not JSON: said below
    }
    if (!r.ok || body === null) {
      // The dashboard's own errors say what failed; others get their status.
      showError(body && body.error && body.error.message ? body.error.message
        : "Could not read the blocked orders: " + r.status + " " + r.statusText);
      return;
    }
    try {
      render(body);
    } catch (e) {
      showError("Could not show the blocked orders: " + e);
    }
  };

  load();
})();
