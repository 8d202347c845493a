// pgjobs dashboard: progressive enhancement only. Every page works without this file; with it, pages
// follow the live event stream (/api/events, one shared reader on the server), relative times stay
// current, the job page's progress bar moves, and the database banner comes and goes.
"use strict";
(function () {
  const body = document.body;
  const banner = document.getElementById("db-banner");
  const bannerText = document.getElementById("db-banner-text");
  const liveStatus = document.getElementById("live-status");
  const jobId = body.dataset.job ? Number(body.dataset.job) : null;

  // -- relative times ------------------------------------------------------------------------------
  function ago(seconds) {
    const s = Math.abs(seconds);
    let text;
    if (s < 45) text = Math.floor(s) + " s";
    else if (s < 90 * 60) text = Math.round(s / 60) + " min";
    else if (s < 36 * 3600) text = Math.round(s / 3600) + " h";
    else text = Math.round(s / 86400) + " d";
    return seconds >= 0 ? text + " ago" : "in " + text;
  }
  // (the same text as span() in views.py)
  function span(seconds) {
    const s = Math.max(seconds, 0);
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 60) return Math.round(s) + " s";
    let m = Math.floor(s / 60);
    if (m < 60) return m < 10 ? m + " min " + Math.floor(s % 60) + " s" : m + " min";
    let h = Math.floor(m / 60); m %= 60;
    if (h < 24) return m ? h + " h " + m + " min" : h + " h";
    const d = Math.floor(h / 24); h %= 24;
    return h ? d + " d " + h + " h" : d + " d";
  }
  function updateTimes() {
    const now = Date.now();
    for (const el of document.querySelectorAll("time[data-rel]")) {
      const t = Date.parse(el.getAttribute("datetime"));
      if (!Number.isNaN(t)) el.textContent = ago((now - t) / 1000);
    }
    for (const el of document.querySelectorAll("time[data-since]")) {
      const t = Date.parse(el.getAttribute("datetime"));
      if (!Number.isNaN(t)) el.textContent = span((now - t) / 1000);
    }
  }
  setInterval(updateTimes, 5000);

  // -- the database banner -------------------------------------------------------------------------
  function setDb(ok, error) {
    if (!banner) return;
    const wasDown = !banner.hidden;
    banner.hidden = ok;
    if (bannerText) bannerText.textContent = ok ? "" : (error || "");
    if (ok && wasDown) scheduleRefresh(0);
  }

  // -- refreshing the page's content ---------------------------------------------------------------
  let refreshTimer = null;
  let lastRefresh = 0;
  // The server shares aggregate reads between pages for 1.5 s, so the refresh an event triggers may
  // still show the moment before it: one trailing refresh after the last event settles the page.
  let trailing = false;
  function busyTyping() {
    const a = document.activeElement;
    return a && a.closest && a.closest("#filters") !== null;
  }
  function scheduleRefresh(delay) {
    if (body.dataset.refresh !== "1") return;
    if (refreshTimer !== null) { trailing = false; return; }  // folded into the pending one, which then trails
    const wait = delay !== undefined ? delay : Math.max(0, 1500 - (Date.now() - lastRefresh));
    refreshTimer = setTimeout(refresh, wait);
  }
  async function refresh() {
    refreshTimer = null;
    const isTrailing = trailing;
    trailing = false;
    if (busyTyping()) { scheduleRefresh(2000); return; }
    lastRefresh = Date.now();
    let response;
    try {
      response = await fetch(location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin" });
    } catch (e) {
      setDb(false, "the dashboard server does not answer");
      return;
    }
    if (response.status === 401 || response.redirected && response.url.includes("/login")) {
      location.reload();
      return;
    }
    if (response.status === 503) { setDb(false, "the database is unreachable"); scheduleRefresh(5000); return; }
    if (!response.ok) return;
    const html = await response.text();
    const main = document.getElementById("content");
    const checked = new Set([...main.querySelectorAll("input[name=ids]:checked")].map((c) => c.value));
    main.innerHTML = html;
    for (const c of main.querySelectorAll("input[name=ids]")) if (checked.has(c.value)) c.checked = true;
    wire(main);
    setDb(true);
    if (!isTrailing && refreshTimer === null) { trailing = true; refreshTimer = setTimeout(refresh, 2000); }
  }

  // -- the job page: progress and state ------------------------------------------------------------
  // (the same rules as progress_parts in views.py)
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  function countOf(p) {
    const total = p.total !== undefined ? p.total : p.of;
    if (!isNum(total) || total <= 0) return null;
    for (const name of ["done", "current"]) if (isNum(p[name])) return [name, p[name], total];
    const others = Object.keys(p).filter((k) => !["total", "of", "percent"].includes(k) && isNum(p[k]));
    return others.length === 1 ? [others[0], p[others[0]], total] : null;
  }
  function progressParts(p) {
    if (p === null || p === undefined || typeof p === "boolean") return null;
    if (typeof p === "number") { const f = p <= 1 ? p : p / 100; return [Math.max(0, Math.min(f, 1)), 1, Math.round(f * 100) + "%"]; }
    if (typeof p === "object" && !Array.isArray(p)) {
      const msg = p.message ? " " + p.message : "";
      const count = countOf(p);
      if (count) {
        const label = count[0] === "done" || count[0] === "current" ? "" : count[0] + " ";
        return [count[1], count[2], label + count[1] + "/" + count[2] + msg];
      }
      if (isNum(p.percent)) return [p.percent, 100, p.percent + "%" + msg];
    }
    return null;
  }
  function showProgress(p) {
    const bar = document.getElementById("job-progress");
    const text = document.getElementById("job-progress-text");
    if (!bar) return;
    const parts = progressParts(p);
    if (parts) {
      bar.hidden = false; bar.max = parts[1]; bar.value = parts[0];
      if (text) text.textContent = parts[2];
    } else if (text && p !== null && p !== undefined) {
      text.textContent = JSON.stringify(p);
    }
  }
  async function reloadJob() {
    try {
      const r = await fetch("/api/jobs/" + jobId, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!r.ok) return;
      const job = await r.json();
      showProgress(job.progress);
      const st = document.getElementById("job-state");
      if (st && st.dataset.state !== job.state) scheduleRefresh(0);
    } catch (e) { /* the next event retries */ }
  }
  function onJobEvent(ev) {
    const st = document.getElementById("job-state");
    const sameState = st && st.dataset.state === ev.state;
    if (ev.progress !== null && ev.progress !== undefined) showProgress(ev.progress);
    else if (ev.state === "active") reloadJob();
    if (!sameState) scheduleRefresh(0);
  }

  // -- the event stream ----------------------------------------------------------------------------
  function connect() {
    if (!window.EventSource || !liveStatus) return;
    const source = new EventSource("/api/events" + (body.dataset.live ? "?" + body.dataset.live : ""));
    source.onopen = () => { liveStatus.className = "live-status on"; liveStatus.textContent = "live"; };
    source.onerror = () => { liveStatus.className = "live-status off"; liveStatus.textContent = "reconnecting"; };
    source.onmessage = (e) => {
      let m;
      try { m = JSON.parse(e.data); } catch (err) { return; }
      if (m.type === "db") { setDb(m.ok, m.error); return; }
      if (m.type === "resync") { scheduleRefresh(); return; }
      if (m.type !== "event") return;
      if (jobId !== null && m.id === jobId) onJobEvent(m);
      else if (jobId === null) scheduleRefresh();
    };
  }

  // -- forms ---------------------------------------------------------------------------------------
  function wire(root) {
    for (const form of root.querySelectorAll("form[data-confirm]")) {
      form.addEventListener("submit", (e) => { if (!confirm(form.dataset.confirm)) e.preventDefault(); });
    }
    const all = root.querySelector("#select-all");
    if (all) all.addEventListener("change", () => {
      for (const c of root.querySelectorAll("input[name=ids]")) c.checked = all.checked;
    });
    const bulk = root.querySelector("#bulk");
    if (bulk) bulk.addEventListener("submit", (e) => {
      const scope = bulk.querySelector("select[name=scope]");
      const action = e.submitter ? e.submitter.value : "";
      if (scope && scope.value === "filter" && !confirm(action + " every job matching the filter?")) e.preventDefault();
    });
    updateTimes();
  }

  wire(document);
  connect();
})();
