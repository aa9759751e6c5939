/* The trajectory browser. The index of every rollout is inline (#tf-index: column names + one array
 * per rollout); filtering and paging run over it in memory (PAGE rows shown). Opening an episode loads
 * its chunk file (episodes/chunk-NNNNN.js, which calls window.tfChunk) with a <script> tag: file://
 * pages cannot fetch() local files, but can load scripts. Every text from a trajectory is untrusted:
 * it is set with textContent, never as HTML. Deep links: #episode=<rollout id>, #flagged=<kind>. */
(function () {
  "use strict";
  var PAGE = 50;
  var raw = JSON.parse(document.getElementById("tf-index").textContent);
  var cols = raw.columns, rows = raw.rows.map(function (a) {
    var o = {}; for (var i = 0; i < cols.length; i++) { o[cols[i]] = a[i]; } return o;
  });
  var chunks = {}, waiting = {}, page = 0, shown = rows, openId = null;

  function el(tag, attrs) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) { if (k === "text") { e.textContent = attrs[k]; } else { e.setAttribute(k, attrs[k]); } }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined || c === false) { continue; }
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }
  function uniq(key) {
    var s = {}; rows.forEach(function (r) { s[r[key]] = true; });
    return Object.keys(s).sort();
  }
  function fill(id, values, anyText) {
    var sel = document.getElementById(id);
    sel.appendChild(el("option", {value: "", text: anyText || "any"}));
    values.forEach(function (v) { sel.appendChild(el("option", {value: v, text: v === "" ? "(none)" : v})); });
    sel.addEventListener("change", function () { page = 0; apply(); });
  }
  fill("f-env", uniq("env")); fill("f-family", uniq("family")); fill("f-teacher", uniq("teacher"));
  fill("f-label", uniq("label")); fill("f-status", uniq("status"));
  var kinds = {}; rows.forEach(function (r) { r.hacks.forEach(function (k) { kinds[k] = true; }); });
  var flagged = document.getElementById("f-flagged");
  [["", "any"], ["any", "flagged (any kind)"], ["none", "not flagged"],
   ["doubted", "test pass the monitor doubts"], ["monitor", "any monitor finding"]].forEach(function (o) {
    flagged.appendChild(el("option", {value: o[0], text: o[1]}));
  });
  Object.keys(kinds).sort().forEach(function (k) { flagged.appendChild(el("option", {value: "kind:" + k, text: "flagged: " + k})); });
  flagged.addEventListener("change", function () { page = 0; apply(); });
  document.getElementById("f-passed").addEventListener("change", function () { page = 0; apply(); });
  document.getElementById("f-text").addEventListener("input", function () { page = 0; apply(); });
  document.getElementById("tf-prev").addEventListener("click", function () { if (page > 0) { page--; draw(); } });
  document.getElementById("tf-next").addEventListener("click", function () {
    if ((page + 1) * PAGE < shown.length) { page++; draw(); }
  });

  function val(id) { return document.getElementById(id).value; }
  function apply() {
    var f = {env: val("f-env"), family: val("f-family"), teacher: val("f-teacher"), label: val("f-label"),
             status: val("f-status")};
    var passed = val("f-passed"), flag = val("f-flagged"), text = val("f-text").trim().toLowerCase();
    shown = rows.filter(function (r) {
      for (var k in f) { if (f[k] !== "" && String(r[k]) !== f[k]) { return false; } }
      if (passed && (passed === "yes") !== r.passed) { return false; }
      if (flag === "any" && !r.hacks.length) { return false; }
      if (flag === "none" && r.hacks.length) { return false; }
      if (flag === "doubted" && !r.doubted) { return false; }
      if (flag === "monitor" && !(r.monitor || []).length) { return false; }
      if (flag.indexOf("kind:") === 0 && r.hacks.indexOf(flag.slice(5)) < 0) { return false; }
      if (text && r.id.toLowerCase().indexOf(text) < 0 && r.env.toLowerCase().indexOf(text) < 0) { return false; }
      return true;
    });
    draw();
  }
  function draw() {
    var body = document.querySelector("#tf-table tbody");
    body.textContent = "";
    shown.slice(page * PAGE, (page + 1) * PAGE).forEach(function (r) {
      var flags = el("td", {});
      r.hacks.forEach(function (k) { flags.appendChild(el("span", {"class": "flag " + (r.severity || "hack"), text: k})); });
      var tr = el("tr", {"data-id": r.id, "class": r.id === openId ? "open" : ""},
        el("td", {}, el("code", {text: r.id})), el("td", {text: r.env}), el("td", {text: r.family + " L" + r.level}),
        el("td", {text: r.teacher}), el("td", {text: String(r.sample)}), el("td", {text: r.status}),
        el("td", {text: r.label}), el("td", {"class": r.passed ? "passed-yes" : "", text: r.passed ? "yes" : "no"}),
        flags, el("td", {text: String(r.turns)}), el("td", {text: String(r.completion_tokens)}),
        el("td", {text: Number(r.reward).toFixed(2)}));
      tr.addEventListener("click", function () { openEpisode(r.id); });
      body.appendChild(tr);
    });
    var pages = Math.max(1, Math.ceil(shown.length / PAGE));
    document.getElementById("tf-page").textContent = "page " + (page + 1) + " of " + pages;
    document.getElementById("tf-count").textContent = shown.length + " of " + rows.length + " rollouts";
  }

  window.tfChunk = function (n, episodes) {
    chunks[n] = {}; episodes.forEach(function (e) { chunks[n][e.id] = e; });
    (waiting[n] || []).forEach(function (fn) { fn(); }); delete waiting[n];
  };
  function loadChunk(n, done) {
    if (chunks[n]) { done(); return; }
    if (waiting[n]) { waiting[n].push(done); return; }
    waiting[n] = [done];
    var s = document.createElement("script");
    s.src = "episodes/chunk-" + String(n).padStart(5, "0") + ".js";
    s.onerror = function () { console.warn("could not load " + s.src); };
    document.body.appendChild(s);
  }
  function openEpisode(id) {
    var r = rows.find(function (x) { return x.id === id; });
    if (!r) { return; }
    openId = id;
    draw();
    loadChunk(r.chunk, function () { show(chunks[r.chunk][id]); });
  }

  function show(e) {
    var box = document.getElementById("tf-episode");
    box.textContent = "";
    box.hidden = false;
    box.setAttribute("data-id", e.id);
    box.appendChild(el("h3", {text: "rollout " + e.id + " · " + e.env + " · " + e.teacher + " · sample " + e.sample}));
    box.appendChild(el("p", {}, "status ", el("b", {text: e.status}), e.error ? " (" + e.error + ")" : "",
      " · label " + (e.label || "–") + " · " + e.tokens.prompt + " prompt / " + e.tokens.completion +
      " completion tokens · " + e.wall_s + " s"));
    box.appendChild(el("h3", {text: "instruction"}));
    box.appendChild(el("pre", {"class": "instruction", text: e.instruction}));
    var v = e.verdict;
    if (v) {
      box.appendChild(el("h3", {text: "verdict"}));
      box.appendChild(el("p", {"class": "verdict"}, (v.passed ? "passed" : "not passed") + " · reward " + v.reward +
        " · tests " + (v.tests_passed ? "all passed" : "not all passed") + " · mode " + v.mode +
        " · counterfactual " + v.counterfactual + (v.verified ? "" : " · not verified")));
      var tests = el("ul", {"class": "tests"});
      v.tests.forEach(function (t) {
        tests.appendChild(el("li", {"class": t[1] ? "test-pass" : "test-fail"}, (t[1] ? "✓ " : "✗ ") + t[0],
          t[2] ? el("pre", {text: t[2]}) : null));
      });
      box.appendChild(tests);
      if (v.hacks.length) {
        box.appendChild(el("h3", {text: "hack evidence"}));
        v.hacks.forEach(function (h) {
          box.appendChild(el("div", {"class": "evidence", "data-kind": h.kind},
            el("b", {"class": "sev-" + h.severity, text: h.kind + " (" + h.severity + ")"}),
            h.turn !== null && h.turn !== undefined ? " at turn " + h.turn : "",
            h.command ? el("pre", {text: "$ " + h.command}) : null, h.detail ? el("pre", {text: h.detail}) : null));
        });
      }
      var m = v.monitor;
      if (m && (m.flags.length || m.rationale)) {
        box.appendChild(el("h3", {text: "monitor (score " + Number(m.score).toFixed(2) + ")"}));
        m.flags.forEach(function (f) {
          box.appendChild(el("div", {"class": "evidence", "data-detector": f.detector}, el("b", {text: f.detector}),
            f.turn !== null && f.turn !== undefined ? " at turn " + f.turn : "", f.path ? " in " + f.path : "",
            el("pre", {text: f.evidence})));
        });
        if (!m.flags.length) { box.appendChild(el("pre", {text: m.rationale})); }
      }
      var c = v.changes;
      box.appendChild(el("h3", {text: "change set" + (c ? " (" + c.total + " paths" + (c.truncated ? ", truncated" : "") + ")" : "")}));
      if (c && c.total) {
        var ul = el("ul", {"class": "changes"});
        [["added", "+"], ["modified", "~"], ["deleted", "-"]].forEach(function (p) {
          (c[p[0]] || []).forEach(function (path) { ul.appendChild(el("li", {}, el("code", {text: p[1] + " " + path}))); });
        });
        box.appendChild(ul);
      } else { box.appendChild(el("p", {"class": "muted", text: "nothing changed"})); }
      if (v.unexpected && v.unexpected.length) {
        box.appendChild(el("p", {text: "changes the reference solution did not need: " + v.unexpected.join(", ")}));
      }
      if (v.verifier_output) { box.appendChild(el("details", {}, el("summary", {text: "verifier output"}), el("pre", {text: v.verifier_output}))); }
    }
    box.appendChild(el("h3", {text: e.turns.length + " turn(s)"}));
    e.turns.forEach(function (t) {
      var div = el("div", {"class": "turn"}, el("b", {text: "turn " + t.n}),
        el("span", {"class": "muted", text: " · " + t.tokens + " tokens" + (t.finish ? " · " + t.finish : "")}));
      if (t.text) { div.appendChild(el("pre", {"class": "assistant", text: t.text})); }
      t.commands.forEach(function (c) {
        div.appendChild(el("div", {"class": "cmd"}, el("span", {"class": "label " + c.label, text: c.label || "step"}),
          el("code", {text: "$ " + c.command}),
          el("span", {"class": "muted", text: " → exit " + c.exit + (c.killed_by ? " (killed: " + c.killed_by + ")" : "") + " · " + c.seconds + " s"})));
      });
      t.observations.forEach(function (o) { div.appendChild(el("pre", {"class": "observation", text: o})); });
      box.appendChild(div);
    });
    box.scrollIntoView({block: "start"});
  }

  function fromHash() {
    var h = decodeURIComponent(location.hash.slice(1));
    if (h.indexOf("flagged=") === 0) {
      document.getElementById("f-flagged").value = "kind:" + h.slice(8);
      page = 0; apply();
      if (shown.length === 1) { openEpisode(shown[0].id); }
      document.getElementById("browser").scrollIntoView();
    } else if (h.indexOf("episode=") === 0) {
      openEpisode(h.slice(8));
    }
  }
  window.addEventListener("hashchange", fromHash);
  apply();
  fromHash();
  window.tfReport = {rows: rows, open: openEpisode, apply: apply};
})();
