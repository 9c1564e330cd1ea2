// gpulayer in Flower: a Gangs tab, the fleet on the Workers page, and one worker's place and slots on its
// page. Data: /gpulayer/fleet.json (what `gpulayer status --json` prints), behind Flower's own login.
(function () {
  "use strict";
  var prefixInput = document.getElementById("url_prefix");
  var root = prefixInput && prefixInput.value ? "/" + prefixInput.value.replace(/^\/+|\/+$/g, "") : "";
  var path = window.location.pathname.slice(root.length) || "/";
  // Requests go to the page's origin, never to a URL resolved against the page's own: opened as
  // http://user:password@host:port/ (the URL `gpulayer up --flower` prints), that URL carries the login, and
  // fetch() refuses a URL with credentials in it. The browser sends the login it was given either way.
  var base = window.location.origin + root;

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  function addGangsTab() {
    var nav = document.querySelector("ul.app-nav");
    if (!nav || document.getElementById("gpulayer-gangs-tab")) return;
    var active = path === "/gangs";
    var link = el("a", {"class": "nav-link" + (active ? " active" : ""), href: root + "/gangs",
                        id: "gpulayer-gangs-tab"}, ["Gangs"]);
    if (active) link.setAttribute("aria-current", "page");
    nav.appendChild(el("li", {"class": "nav-item"}, [link]));
  }

  function cuda(w) {
    if (!w.gpus) return w.cuda ? "yes" : "no";
    return w.gpus + " x " + (w.gpu_names && w.gpu_names[0] ? w.gpu_names[0] : "GPU");
  }

  function slots(w) {
    var free = Math.max(w.slots - w.busy - w.held, 0);
    return w.slots + " (free " + free + ", running " + w.busy + ", held by gangs " + w.held + ")";
  }

  // gang id -> the nodes of that gang on each worker
  function holders(report) {
    var out = {};
    report.gangs.forEach(function (g) {
      if (g.state !== "running") return;
      (g.ranks || []).forEach(function (node) {
        (out[node.worker] = out[node.worker] || []).push(
          (g.name || "gang") + " " + g.id.slice(0, 12) + ": ranks " + node.ranks.join(", "));
      });
    });
    return out;
  }

  function fleetTable(report) {
    var held = holders(report);
    var rows = report.workers.map(function (w) {
      return el("tr", {"data-worker": w.id}, [
        el("td", {}, [w.id]), el("td", {}, [w.zone || "-"]), el("td", {}, [w.region || "-"]),
        el("td", {}, [cuda(w)]), el("td", {}, [String(w.slots)]),
        el("td", {}, [String(Math.max(w.slots - w.busy - w.held, 0))]), el("td", {}, [String(w.busy)]),
        el("td", {}, [String(w.held)]), el("td", {}, [(held[w.id] || []).join("; ") || "-"])]);
    });
    var head = ["Worker", "Zone", "Region", "CUDA / GPUs", "Slots", "Free", "Running", "Held by gangs", "Gangs"];
    return el("section", {"class": "page-section", id: "gpulayer-fleet"}, [
      el("h2", {"class": "h5"}, ["Fleet (gpulayer)"]),
      el("div", {"class": "table-responsive"}, [
        el("table", {"class": "table table-sm table-striped align-middle", id: "gpulayer-fleet-table"}, [
          el("thead", {}, [el("tr", {}, head.map(function (h) { return el("th", {}, [h]); }))]),
          el("tbody", {}, rows)])])]);
  }

  function workerCard(report, name) {
    var id = name.split("@")[0];
    var w = report.workers.filter(function (x) { return x.id === id; })[0];
    var items = w ? [["Zone", w.zone || "-"], ["Region", w.region || "-"], ["CUDA / GPUs", cuda(w)],
                     ["Slots", slots(w)], ["Gangs", (holders(report)[w.id] || []).join("; ") || "none"],
                     ["Address", w.address]]
                  : [["gpulayer", "not a live worker of this cluster (stopped, or not heard from lately)"]];
    var dl = el("dl", {"class": "row mb-0"}, []);
    items.forEach(function (kv) {
      dl.appendChild(el("dt", {"class": "col-sm-2"}, [kv[0]]));
      dl.appendChild(el("dd", {"class": "col-sm-10"}, [kv[1]]));
    });
    return el("section", {"class": "page-section", id: "gpulayer-worker"}, [
      el("h2", {"class": "h5"}, ["Place and slots (gpulayer)"]), dl]);
  }

  function show(node) {
    var old = document.getElementById(node.id);
    if (old) { old.replaceWith(node); return; }
    var main = document.getElementById("main-content");
    var anchor = main && (main.querySelector(".worker-detail-header") || null);
    if (anchor) anchor.parentNode.insertBefore(node, anchor.nextSibling);
    else if (main) main.insertBefore(node, main.firstChild);
  }

  function refresh() {
    fetch(base + "/gpulayer/fleet.json", {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("fleet.json: HTTP " + r.status); return r.json(); })
      .then(function (report) {
        if (path === "/" || path === "/workers") show(fleetTable(report));
        else show(workerCard(report, decodeURIComponent(path.slice("/worker/".length))));
      })
      .catch(function (err) { console.warn("gpulayer: " + err); });
  }

  function showOutput(jobId) {
    fetch(root + "/gpulayer/output/" + encodeURIComponent(jobId) + ".json", {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("output: HTTP " + r.status); return r.json(); })
      .then(function (data) {
        var text = data.lines.length ? data.lines.map(function (l) { return l.text; }).join("\n")
                                     : "(nothing printed, or the output has expired)";
        var pre = el("pre", {"class": "border p-2", style: "max-height: 30em; overflow: auto"}, [text]);
        var node = el("section", {"class": "page-section", id: "gpulayer-output"}, [
          el("h2", {"class": "h5"}, ["Output (gpulayer)"]), pre]);
        var old = document.getElementById(node.id);
        if (old) { old.replaceWith(node); return; }
        var main = document.getElementById("main-content") || document.body;
        main.appendChild(node);
      })
      .catch(function (err) { console.warn("gpulayer: " + err); });
  }

  addGangsTab();
  if (path.indexOf("/task/") === 0) {
    var jobId = decodeURIComponent(path.slice("/task/".length));
    showOutput(jobId);
    setInterval(function () { showOutput(jobId); }, 5000);
  }
  if (path === "/" || path === "/workers" || path.indexOf("/worker/") === 0) {
    refresh();
    setInterval(refresh, 5000);
  }
})();
