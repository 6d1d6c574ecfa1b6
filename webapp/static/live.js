// Live updates for the UI: one WebSocket to /api/v1/live (session cookie; the server checks Origin).
// Each notice names a job; every element on the page with data-live-job="<id>" (or data-live-jobs
// listing it) is re-fetched from its data-live-src (a server-rendered partial) and swapped in. A
// resync refreshes everything.
// Without the feed (refused, proxy, offline) the page polls every data-poll-s seconds instead.
(function () {
  "use strict";
  const body = document.body;
  if (!body || body.dataset.live !== "1") return;
  const pollMs = (Number(body.dataset.pollS) || 30) * 1000;
  const state = document.getElementById("live-state");
  let cursor = null;
  let pollTimer = null;
  let backoffMs = 1000;
  let listTimer = null;

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
    listTimer = setTimeout(function () {
      listTimer = null;
      window.htmx.ajax("GET", window.location.pathname + window.location.search, {
        target: "#job-table", swap: "outerHTML", headers: { "HX-Request": "true" },
      }).catch(function () {});
    }, 1000);
  }

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
    if (pollTimer) return;
    pollTimer = setInterval(refreshAll, pollMs);
  }

  function stopPolling() {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = null;
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    let ws;
    try {
      ws = new WebSocket(scheme + window.location.host + "/api/v1/live");
    } catch (e) {
      startPolling();
      return;
    }
    ws.onopen = function () {
      // The first frame says where to resume (the feed refuses query parameters); null: from now.
      ws.send(JSON.stringify({ cursor: cursor }));
      backoffMs = 1000;
      stopPolling();
      show("● live", true);
    };
    ws.onmessage = function (event) {
      let m;
      try { m = JSON.parse(event.data); } catch (e) { return; }
      if (m.type === "notice") {
        cursor = m.id;
        onNotice(m);
      } else if (m.type === "resync") {
        cursor = m.cursor;
        refreshAll();
      } else if (typeof m.cursor === "string") {
        const reconnecting = cursor !== null && m.type === "hello";
        cursor = m.cursor;
        if (reconnecting) refreshAll();
      }
    };
    ws.onclose = function () {
      show("○ polling every " + pollMs / 1000 + " s", false);
      startPolling();
      setTimeout(connect, backoffMs);
      backoffMs = Math.min(backoffMs * 2, 60000);
    };
  }

  document.addEventListener("change", function (event) {
    if (event.target && event.target.id === "select-all") {
      document.querySelectorAll('input[name="ids"][form="bulk"]').forEach(function (box) {
        box.checked = event.target.checked;
      });
    }
  });

  if ("WebSocket" in window) connect(); else startPolling();
})();
