// The order page's write actions. Each button carries the asynqmon API
// request it stands for (data-method, data-url); the request goes through
// the dashboard's own guards (authentication, cross-origin protection, the
// task ID guard, read-only mode), exactly as asynqmon's UI sends it. The
// operator actions' buttons (data-reason) send the reason as JSON.
"use strict";
document.addEventListener("click", async (ev) => {
  const b = ev.target.closest("button[data-url]");
  if (!b) {
    return;
  }
  if (b.dataset.confirm && !window.confirm(b.dataset.confirm)) {
    return;
  }
  const out = document.getElementById("action-result");
  b.disabled = true;
  out.textContent = b.textContent + " " + b.dataset.task + "…";
  try {
    const init = { method: b.dataset.method, credentials: "same-origin" };
    if (b.dataset.reason) {
      // An operator action (orderops): the reason typed beside the buttons.
      const reason = document.getElementById("action-reason");
      init.headers = { "Content-Type": "application/json" };
      init.body = JSON.stringify({ reason: reason ? reason.value : "" });
    }
    // From the page's origin: a page opened with credentials in its URL
    // (http://user:pass@host/...) cannot fetch a URL resolved against it.
    const r = await fetch(window.location.origin + b.dataset.url, init);
    if (r.ok) {
      window.location.reload();
      return;
    }
    let msg = r.status + " " + r.statusText;
    const text = (await r.text()).trim();
    if (text) {
      msg += ": " + text;
    }
    out.textContent = b.textContent + " " + b.dataset.task + " refused: " + msg;
  } catch (e) {
    out.textContent = b.textContent + " " + b.dataset.task + " failed: " + e;
  }
  b.disabled = false;
});
