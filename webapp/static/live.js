// Live updates for the UI: one WebSocket to /api/v1/live (session cookie; the server checks Origin).
// Each notice names a job; every element on the page with data-live-job="<id>" (or data-live-jobs
// listing it) is re-fetched from its data-live-src (a server-rendered partial) and swapped in. A
// resync refreshes everything.
// Manners (docs/api.md, "Live feed"):
// - resume: a reconnect sends the last cursor seen as its first frame, so nothing in between is lost;
// - a refused handshake is asked about with HEAD /api/v1/live.sse (a browser cannot read the status of
//   a refused WebSocket): 429 waits Retry-After seconds; 401/403 stops (signed out);
// - 2.5 heartbeats (25 s by default) without any message: the connection is dead; open another;
// - while the page is hidden: no connection, no polling, no retry; when it shows again, resume.
// Without the feed (refused, proxy, offline) a visible page polls every data-poll-s seconds instead.
(function () {
  "use strict";
  const body = document.body;
  if (!body || body.dataset.live !== "1") return;
  const pollMs = (Number(body.dataset.pollS) || 30) * 1000;
  const state = document.getElementById("live-state");
  let cursor = null;
  let socket = null;
  let pollTimer = null;
  let retryTimer = null;
  let watchdog = null;
  let backoffMs = 1000;
  let silenceMs = 25000; // until a hello names the heartbeat: 2.5 heartbeats of 10 s
  let heardAt = 0;
  let signedOut = false;
  let notBefore = 0; // no connection attempt before this time (Retry-After, backoff)
  let listTimer = null;
  let filtersAsked = 0; // requests of the list's filter form, sent
  let filtersEnded = 0; // and ended (answered, failed or aborted)

  function show(text, on) {
    if (!state) return;
    state.textContent = text;
    state.classList.toggle("on", !!on);
  }

  function swap(el) {
    const src = el.dataset.liveSrc;
    if (!src || !window.htmx) return;
    if (el.querySelector('input[name="ids"]:checked')) return; // keep the user's selection
    window.htmx.ajax("GET", src, { target: el, swap: "outerHTML" }).catch(function () {});
  }

  function refreshList() {
    // New jobs appear at the top of the list: re-fetch the whole table, at most once a second.
    const table = document.getElementById("job-table");
    if (!table || listTimer) return;
    if (document.querySelector('input[name="ids"]:checked')) return; // keep the user's selection
    listTimer = setTimeout(fetchList, 1000);
  }

  // The filter form swaps its own answer into the table it saw when it asked; a list re-fetched meanwhile
  // would replace that table, and the filter's answer would land nowhere. So a re-fetch waits for a filter
  // in flight, and its answer is dropped if a filter was asked after it (that answer is the newer one).
  function fetchList() {
    if (filtersAsked !== filtersEnded) {
      listTimer = setTimeout(fetchList, 250);
      return;
    }
    listTimer = null;
    const asked = filtersAsked;
    fetch(window.location.pathname + window.location.search, {
      headers: { "HX-Request": "true" }, credentials: "same-origin", cache: "no-store",
    })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        const table = document.getElementById("job-table");
        const selected = document.querySelector('input[name="ids"]:checked'); // keep the user's selection
        const swapped = html !== null && !!table && asked === filtersAsked && !selected;
        if (swapped) window.htmx.swap(table, html, { swapStyle: "outerHTML" });
        document.dispatchEvent(new CustomEvent("tenure:list-refetched", { detail: { swapped: swapped } }));
      })
      .catch(function () {});
  }

  function isFilter(event) {
    const elt = event.detail && event.detail.elt;
    return !!(elt && elt.matches && elt.matches("form.filters"));
  }
  document.addEventListener("htmx:beforeRequest", function (event) { if (isFilter(event)) filtersAsked += 1; });
  document.addEventListener("htmx:afterRequest", function (event) { if (isFilter(event)) filtersEnded += 1; });

  function refreshAll() {
    document.querySelectorAll("[data-live-src]").forEach(swap);
    refreshList();
  }

  function onNotice(m) {
    // data-live-jobs lists several ids (a workflow's section: the workflow and every step).
    const id = CSS.escape(m.job_id);
    const els = document.querySelectorAll('[data-live-job="' + id + '"], [data-live-jobs~="' + id + '"]');
    els.forEach(swap);
    if (els.length === 0) refreshList();
  }

  function startPolling() {
    if (pollTimer || document.hidden || signedOut) return;
    pollTimer = setInterval(refreshAll, pollMs);
  }

  function stopPolling() {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = null;
  }

  function retryIn(ms) {
    if (retryTimer) clearTimeout(retryTimer);
    notBefore = Date.now() + ms;
    retryTimer = setTimeout(function () {
      retryTimer = null;
      connect();
    }, ms);
  }

  function nextBackoff() {
    const ms = backoffMs;
    backoffMs = Math.min(backoffMs * 2, 60000);
    return ms;
  }

  function drop() {
    // Let go of the current connection without waiting for its closing handshake (it may be dead).
    if (!socket) return;
    const old = socket;
    socket = null;
    old.onopen = old.onmessage = old.onclose = null;
    try { old.close(); } catch (e) { /* already closed */ }
    if (watchdog) clearInterval(watchdog);
    watchdog = null;
  }

  function ask() {
    // Why was the handshake refused? The same admission, connecting nothing.
    fetch("/api/v1/live.sse", { method: "HEAD", credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 429) {
          const seconds = Number(r.headers.get("Retry-After"));
          retryIn((seconds > 0 ? seconds : 5) * 1000 + Math.random() * 1000);
        } else if (r.status === 401 || r.status === 403) {
          signedOut = true;
          stopPolling();
          show("○ signed out", false);
        } else {
          retryIn(nextBackoff());
        }
      })
      .catch(function () { retryIn(nextBackoff()); });
  }

  function connect() {
    if (socket || document.hidden || signedOut) return;
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    let ws;
    try {
      ws = new WebSocket(scheme + window.location.host + "/api/v1/live");
    } catch (e) {
      startPolling();
      return;
    }
    socket = ws;
    let opened = false;
    ws.onopen = function () {
      opened = true;
      // The first frame says where to resume (the feed refuses query parameters); null: from now.
      ws.send(JSON.stringify({ cursor: cursor }));
      heardAt = Date.now();
      watchdog = setInterval(function () {
        if (Date.now() - heardAt > silenceMs) {
          drop(); // silent for too long: a dead connection (heartbeats count as data)
          connect();
        }
      }, 1000);
    };
    ws.onmessage = function (event) {
      heardAt = Date.now();
      let m;
      try { m = JSON.parse(event.data); } catch (e) { return; }
      if (m.type === "notice") {
        cursor = m.id;
        onNotice(m);
      } else if (m.type === "resync") {
        cursor = m.cursor;
        refreshAll();
      } else if (m.type === "hello") {
        const reconnecting = cursor !== null;
        cursor = m.cursor;
        if (m.heartbeat_s > 0) silenceMs = 2500 * m.heartbeat_s;
        backoffMs = 1000;
        stopPolling();
        show("● live", true);
        if (reconnecting) refreshAll();
      } else if (typeof m.cursor === "string") {
        cursor = m.cursor;
      }
    };
    ws.onclose = function () {
      if (socket !== ws) return;
      drop();
      if (document.hidden) return; // quiet; visibilitychange resumes
      show("○ polling every " + pollMs / 1000 + " s", false);
      startPolling();
      if (opened) retryIn(nextBackoff());
      else ask();
    };
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      // Nothing while nobody looks: no connection, no polling, no retries.
      if (retryTimer) clearTimeout(retryTimer);
      retryTimer = null;
      drop();
      stopPolling();
      show("○ paused", false);
    } else {
      // Resumes after the last cursor seen (the notices missed meanwhile arrive), once a wait the
      // server asked for is over.
      retryIn(Math.max(0, notBefore - Date.now()));
    }
  });

  document.addEventListener("change", function (event) {
    if (event.target && event.target.id === "select-all") {
      document.querySelectorAll('input[name="ids"][form="bulk"]').forEach(function (box) {
        box.checked = event.target.checked;
      });
    }
  });

  if (!("WebSocket" in window)) startPolling();
  else if (!document.hidden) connect();
  else show("○ paused", false);
})();
