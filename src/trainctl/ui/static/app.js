/* trainctl dashboard: renders the job list and a job page from the JSON API, polling while
 * a job runs. Everything here is bundled with trainctl; no request leaves the dashboard. */
(function () {
  var COLORS = ["#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989"];
  var TERMINAL = { Completed: 1, Failed: 1, Stopped: 1, Unreadable: 1 };
  function esc(s) {
    return String(s == null ? "-" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function get(url) {
    return fetch(url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) return r.text().then(function (t) { throw new Error(t || r.statusText); });
      return r.json();
    });
  }
  function duration(s) {
    if (s == null) return "-";
    var m = Math.floor(s / 60), sec = Math.round(s % 60);
    return m ? m + "m" + (sec < 10 ? "0" : "") + sec + "s" : sec + "s";
  }
  function cost(c) { return c && c.usd != null ? "$" + c.usd.toFixed(2) : "-"; }
  function fail(err) {
    document.getElementById("main").innerHTML = '<p class="state-Failed">' + esc(err.message) + "</p>";
  }

  function jobsView() {
    var all = /[?&]all=1/.test(location.search);  // diagnose's measurement runs too
    get("/api/jobs" + (all ? "?all=1" : "")).then(function (jobs) {
      var rows = jobs.map(function (j) {
        if (j.state === "Unreadable") {  // a record that cannot be read: one line saying why
          return '<tr class="job-row"><td>' + esc(j.name) + '</td><td class="state-Failed">Unreadable</td>' +
            '<td colspan="5" class="problem">' + esc(j.problem) + "</td></tr>";
        }
        return '<tr class="job-row"><td><a href="/jobs/' + encodeURIComponent(j.name) + '">' + esc(j.name) +
          '</a></td><td class="state-' + esc(j.state) + '">' + esc(j.state) + "</td><td>" +
          esc(j.instance_count + " x " + j.instance_type) + "</td><td>" + esc((j.created_at || "").replace("T", " ").slice(0, 19)) +
          "</td><td>" + duration(j.duration_s) + "</td><td>" + j.attempts.length + "</td><td>" + cost(j.cost) + "</td></tr>";
      }).join("");
      document.getElementById("main").innerHTML = "<h1>Jobs</h1>" + (jobs.length ?
        "<table id='jobs'><tr><th>name</th><th>state</th><th>instances</th><th>created</th><th>duration</th><th>attempts</th><th>cost</th></tr>" + rows + "</table>" :
        "<p class='muted'>no jobs in this store yet</p>") +
        "<p class='muted'><a id='all-toggle' href='/" + (all ? "" : "?all=1") + "'>" +
        (all ? "hide" : "show") + " diagnose's measurement runs</a></p>";
      if (jobs.some(function (j) { return !TERMINAL[j.state]; })) setTimeout(jobsView, 3000);
    }).catch(fail);
  }

  function jobView(name) {
    var base = "/api/jobs/" + encodeURIComponent(name);
    var offsets = {};
    var main = document.getElementById("main");
    main.innerHTML = "<h1>" + esc(name) + "</h1><div id='summary'></div><h2>Attempts</h2><div id='attempts'></div>" +
      "<h2>Metrics</h2><div id='charts' class='charts'></div><h2>Logs</h2><div id='logs' class='logs'></div>" +
      "<h2>Artifacts</h2><div id='artifacts'></div>" +
      "<h2>TensorBoard</h2><div id='tensorboard'><button id='tensorboard-open'>Open TensorBoard</button> " +
      "<span class='muted'>over what the job's scripts write to TRAINCTL_TENSORBOARD_DIR</span></div>";
    document.getElementById("tensorboard-open").onclick = function () {
      var box = document.getElementById("tensorboard");
      this.disabled = true;
      this.textContent = "starting TensorBoard...";
      fetch(base + "/tensorboard", { method: "POST", credentials: "same-origin", headers: { "X-Trainctl": "1" } })
        .then(function (r) {
          if (!r.ok) return r.text().then(function (t) { throw new Error(t || r.statusText); });
          return r.json();
        })
        .then(function (r) {
          box.innerHTML = "TensorBoard: <a id='tensorboard-link' target='_blank' rel='noopener' href='" + esc(r.url) + "'>" + esc(r.url) + "</a>";
        })
        .catch(function (err) { box.innerHTML = "<p class='state-Failed' id='tensorboard-error'>" + esc(err.message) + "</p>"; });
    };
    function progressText(p) {  // as trainctl status: "54/138 steps (39%), ~1m20s left"
      var text = p.step.toLocaleString("en-US") + "/" + p.total_steps.toLocaleString("en-US") + " steps (" + Math.round(100 * p.fraction) + "%)";
      if (p.seconds_left !== null && p.seconds_left !== undefined) {
        var s = Math.round(p.seconds_left), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
        text += h ? ", ~" + h + "h" + String(m).padStart(2, "0") + "m left" : ", ~" + m + "m" + String(s % 60).padStart(2, "0") + "s left";
      }
      return text;
    }
    function goodputBars(g) {  /* a bar per attempt: its paid node-time by cause (record/goodput.py) */
      var widest = Math.max.apply(null, g.attempts.map(function (a) { return a.paid_node_hours; }).concat([0]));
      if (!(widest > 0)) return "";
      return "<div id='goodput-bars'>" + g.attempts.map(function (a) {
        var segments = Object.keys(a.causes).filter(function (c) { return c !== "waiting" && a.causes[c].node_hours > 0; }).map(function (c) {
          return "<span class='segment' data-cause='" + esc(c) + "' title='" + esc(g.legend[c].label + ": " + a.causes[c].node_hours.toFixed(4) + " node-h") +
            "' style='background:" + esc(g.legend[c].colour) + ";width:" + (100 * a.causes[c].node_hours / widest).toFixed(2) + "%'></span>";
        }).join("");
        var share = a.goodput === null ? "-" : Math.round(100 * a.goodput) + " %";
        return "<div class='goodput-bar' id='goodput-attempt-" + a.attempt + "'><span class='label'>attempt " + a.attempt + "</span><span class='bar'>" +
          segments + "</span><span class='share'>" + share + "</span></div>";
      }).join("") + "<div class='legend'>" + Object.keys(g.legend).filter(function (c) { return c !== "waiting"; }).map(function (c) {
        return "<span><b style='color:" + esc(g.legend[c].colour) + "'>&#9632;</b> " + esc(g.legend[c].label) + "</span>"; }).join("") + "</div></div>";
    }
    function summary(info) {
      var rows = [["state", '<span class="state-' + esc(info.state) + '">' + esc(info.state) + "</span>"],
        ["instances", esc(info.instance_count + " x " + info.instance_type)], ["launcher", esc(info.launcher)],
        ["duration", duration(info.duration_s)], ["cost", cost(info.cost)], ["model", esc(info.model_data)]];
      if (info.progress) rows.push(["progress", "<span id='progress'>" + esc(progressText(info.progress)) + "</span>"]);
      if (info.waiting && (info.state === "Pending" || info.state === "Provisioning")) rows.push(["waiting", esc(info.waiting)]);
      if (info.failure_reason) rows.push(["failure", esc(info.failure_reason)]);
      if (info.stop_reason) rows.push(["stopped", esc(info.stop_reason)]);
      if (info.tuning_job) rows.push(["tuning job", '<a id="tuning-link" href="/tuning/' + encodeURIComponent(info.tuning_job) + '">' + esc(info.tuning_job) + "</a>"]);
      if (info.controller && info.controller.lost) rows.push(["controller", "lost " + Math.round(info.controller.silent_seconds) + " s ago"]);
      if (info.goodput) rows.push(["goodput", "<span id='goodput'>" + esc(info.goodput.text) + "</span>" + goodputBars(info.goodput)]);
      var current = info.attempts.length ? info.attempts[info.attempts.length - 1] : null;
      if (current) {  /* what each node of the latest attempt put back, and a split resume */
        var byNode = current.restored_by_node || {};
        if (Object.keys(byNode).length > 1) rows.push(["restored", "<span id='restored-by-node'>" + Object.keys(byNode).map(function (k) {
          return esc(k) + ": " + esc(byNode[k]); }).join(" · ") + "</span>"]);
        if (current.restored && current.restored.split) rows.push(["split resume", "<span id='split-resume' class='state-Failed'>" + esc(current.restored.split) + "</span>"]);
      }
      document.getElementById("summary").innerHTML = "<table>" + rows.map(function (r) {
        return "<tr><th>" + r[0] + "</th><td>" + r[1] + "</td></tr>"; }).join("") + "</table>";
      document.getElementById("attempts").innerHTML = "<table id='attempts-table'><tr><th>#</th><th>nodes</th><th>started</th><th>ended</th><th>outcome</th>" +
        "<th>started from</th><th>last step</th><th>steps lost</th><th>cause</th></tr>" + info.attempts.map(function (a) {
          var cause = [a.resized, a.cause].filter(function (t) { return t; }).join("; ");
          return "<tr class='attempt'><td>" + a.number + "</td><td>" + (a.nodes || []).length + "</td><td>" + esc((a.started_at || "").slice(11, 19)) + "</td><td>" +
            esc((a.ended_at || "").slice(11, 19)) + "</td><td>" + esc(a.outcome || "running") + "</td><td>" + esc(a.started_from) +
            "</td><td>" + esc(a.last_step) + "</td><td>" + esc(a.steps_lost) + "</td><td>" + esc(cause || null) + "</td></tr>";
        }).join("") + "</table>";
      info.attempts.forEach(function (a) {
        var nodes = a.nodes.length || info.instance_count;
        for (var rank = 0; rank < nodes; rank++) {
          var id = "log-" + a.number + "-" + rank;
          if (!document.getElementById(id)) {
            var label = "algo-" + (rank + 1) + (a.number > 1 ? " (attempt " + a.number + ")" : "");
            var div = document.createElement("div");
            div.className = "log";
            div.innerHTML = "<div><b>" + esc(label) + "</b></div><pre id='" + id + "' data-node='algo-" + (rank + 1) + "'></pre>";
            document.getElementById("logs").appendChild(div);
            offsets[id] = { attempt: a.number, rank: rank, offset: 0 };
          }
        }
      });
    }
    function logs() {  /* resolves to whether any log grew (a finished job: read on) */
      return Promise.all(Object.keys(offsets).map(function (id) {
        var o = offsets[id];
        return get(base + "/logs?attempt=" + o.attempt + "&rank=" + o.rank + "&offset=" + o.offset).then(function (r) {
          var grew = r.offset > o.offset;
          o.offset = r.offset;
          if (!r.lines.length) return grew;
          var pre = document.getElementById(id);
          var node = "algo-" + (o.rank + 1);
          pre.textContent += r.lines.map(function (l) {
            /* a line of one of several processes: "[rank R]<TAB>text" (trainctl/protocol.py) */
            var ranked = /^\[rank (\d+)\]\t/.exec(l);
            return ranked ? "[" + node + ":" + ranked[1] + "] " + l.slice(ranked[0].length) : "[" + node + "] " + l;
          }).join("\n") + "\n";
          pre.scrollTop = pre.scrollHeight;
          return true;
        });
      })).then(function (grew) { return grew.some(Boolean); });
    }
    function charts(points) {
      var byName = {};
      points.forEach(function (p) { if (!p.redone) (byName[p.name] = byName[p.name] || []).push(p); });
      var box = document.getElementById("charts");
      box.innerHTML = "";
      var names = Object.keys(byName).sort();
      if (!names.length) { box.innerHTML = "<p class='muted'>no metrics (metric_definitions or report_step(step, loss=...))</p>"; return; }
      names.forEach(function (name) {
        var byAttempt = {};
        byName[name].forEach(function (p, k) {
          (byAttempt[p.attempt] = byAttempt[p.attempt] || []).push([p.step != null ? p.step : k, p.value]);
        });
        var series = Object.keys(byAttempt).sort().map(function (a, k) {
          return { label: "attempt " + a, color: COLORS[k % COLORS.length], points: byAttempt[a] };
        });
        var div = document.createElement("div");
        div.className = "chart";
        div.setAttribute("data-metric", name);
        var last = byName[name][byName[name].length - 1];
        div.innerHTML = "<div class='title'>" + esc(name) + " <span class='muted'>" + esc(window.trainctlNumber(last.value)) + "</span></div>";
        window.trainctlChart(div, series, { integerX: true });
        var legend = document.createElement("div");
        legend.className = "legend";
        legend.innerHTML = series.map(function (s) { return "<span style='color:" + s.color + "'>&#9644; " + esc(s.label) + "</span>"; }).join("");
        div.appendChild(legend);
        box.appendChild(div);
      });
    }
    function artifacts(files) {
      document.getElementById("artifacts").innerHTML = files.length ? "<table id='artifacts-table'><tr><th>file</th><th>size</th></tr>" +
        files.map(function (f) {
          // encodeURIComponent leaves ' as it is: escaped too, or a file named a'b ends the attribute
          return "<tr><td><a href='" + esc(base + "/files/" + f.path.split("/").map(encodeURIComponent).join("/")) + "'>" + esc(f.path) +
            "</a></td><td>" + f.size + "</td></tr>";
        }).join("") + "</table>" : "<p class='muted'>none yet</p>";
    }
    function refresh() {
      get(base).then(function (info) {
        summary(info);
        return Promise.all([get(base + "/metrics").then(charts), logs(), get(base + "/artifacts").then(artifacts)]).then(function (done) {
          document.body.setAttribute("data-state", info.state);
          if (!TERMINAL[info.state]) setTimeout(refresh, 2000);
          else if (done[1]) setTimeout(refresh, 0);  /* more log to read */
          else document.body.setAttribute("data-loaded", "1");
        });
      }).catch(fail);
    }
    refresh();
  }

  function value(v) { return typeof v === "number" ? String(Math.round(v * 10000) / 10000) : esc(v); }

  function tuningsView() {
    get("/api/tuning").then(function (list) {
      var rows = list.map(function (t) {
        if (t.state === "Unreadable") {
          return '<tr class="tuning-row"><td>' + esc(t.name) + '</td><td class="state-Failed">Unreadable</td>' +
            '<td colspan="4" class="problem">' + esc(t.problem) + "</td></tr>";
        }
        return '<tr class="tuning-row"><td><a href="/tuning/' + encodeURIComponent(t.name) + '">' + esc(t.name) +
          '</a></td><td class="state-' + esc(t.state) + '">' + esc(t.state) + "</td><td>" + esc(t.strategy) +
          "</td><td>" + esc(t.objective) + "</td><td>" + t.trials + "/" + t.max_jobs + "</td><td>" +
          (t.best ? value(t.best.objective) + " (" + esc(t.best.job) + ")" : "-") + "</td></tr>";
      }).join("");
      document.getElementById("main").innerHTML = "<h1>Tuning jobs</h1>" + (list.length ?
        "<table id='tunings'><tr><th>name</th><th>state</th><th>strategy</th><th>objective</th><th>trials</th><th>best</th></tr>" + rows + "</table>" :
        "<p class='muted'>no tuning jobs in this store yet (HyperparameterTuner.fit, trainctl tune)</p>");
      if (list.some(function (t) { return t.state === "InProgress"; })) setTimeout(tuningsView, 3000);
    }).catch(fail);
  }

  function tuningView(name) {
    var main = document.getElementById("main");
    main.innerHTML = "<h1>" + esc(name) + "</h1><div id='summary'></div><h2>Objective</h2><div id='charts' class='charts'></div>" +
      "<h2>Trials</h2><div id='trials'></div>";
    function draw(t) {
      var best = t.trials.filter(function (x) { return x.number === t.best_trial; })[0];
      var rows = [["state", '<span class="state-' + esc(t.state) + '">' + esc(t.state) + "</span>"],
        ["strategy", esc(t.strategy) + (t.early_stopping ? ", early stopping" : "")],
        ["objective", esc(t.objective_type + " " + t.objective)], ["trials", t.trials.length + " of " + t.max_jobs],
        ["best", best ? value(best.objective) + ' (<a href="/jobs/' + encodeURIComponent(best.job) + '">' + esc(best.job) + "</a>)" : "-"]];
      if (t.failure_reason) rows.push(["failure", esc(t.failure_reason)]);
      document.getElementById("summary").innerHTML = "<table>" + rows.map(function (r) {
        return "<tr><th>" + r[0] + "</th><td>" + r[1] + "</td></tr>"; }).join("") + "</table>";
      /* the objective of each ended trial against its number, and the best so far */
      var sign = t.objective_type === "Minimize" ? -1 : 1, sofar = null, ended = [], bestLine = [];
      t.trials.forEach(function (x) {
        if (x.objective == null) return;
        ended.push([x.number, x.objective]);
        if (x.state === "Completed" && (sofar == null || sign * x.objective > sign * sofar)) sofar = x.objective;
        if (sofar != null) bestLine.push([x.number, sofar]);
      });
      var charts = document.getElementById("charts");
      charts.innerHTML = "";
      function chart(kind, title, series) {
        var div = document.createElement("div");
        div.className = "chart";
        div.setAttribute("data-chart", kind);
        div.innerHTML = "<div class='title'>" + esc(title) + "</div>";
        window.trainctlChart(div, series, { integerX: true });
        var legend = document.createElement("div");
        legend.className = "legend";
        legend.innerHTML = series.filter(function (s) { return s.legend !== false; }).map(function (s) {
          return "<span style='color:" + s.color + "'>&#9644; " + esc(s.label) + "</span>"; }).join("");
        div.appendChild(legend);
        charts.appendChild(div);
      }
      chart("objective", t.objective + " by trial", [{ label: "trials", color: COLORS[0], points: ended },
        { label: "best so far", color: COLORS[2], points: bestLine }]);
      /* each trial's curve: what early stopping compared (pruned trials in red) */
      var curves = t.trials.filter(function (x) { return x.curve.length; }).map(function (x) {
        var color = x.state === "Pruned" ? COLORS[1] : x.number === t.best_trial ? COLORS[2] : "#8c959f";
        return { label: "trial " + x.number, color: color, points: x.curve, legend: false };
      });
      chart("curves", t.objective + " by step, each trial", curves);
      charts.lastChild.querySelector(".legend").innerHTML = "<span style='color:" + COLORS[2] + "'>&#9644; best</span>" +
        "<span style='color:" + COLORS[1] + "'>&#9644; pruned</span><span style='color:#8c959f'>&#9644; other trials</span>";
      document.getElementById("trials").innerHTML = "<table id='trials-table'><tr><th></th><th>trial</th><th>job</th><th>state</th><th>" +
        esc(t.objective) + "</th>" + t.ranges.map(function (r) { return "<th>" + esc(r) + "</th>"; }).join("") + "<th>why it ended</th></tr>" +
        t.trials.map(function (x) {
          var isBest = x.number === t.best_trial;
          return "<tr class='trial" + (isBest ? " best" : "") + "' data-state='" + esc(x.state) + "'><td>" + (isBest ? "&#9733;" : "") + "</td><td>" + x.number +
            "</td><td><a href='" + esc("/jobs/" + encodeURIComponent(x.job)) + "'>" + esc(x.job) + "</a></td><td class='state-" + esc(x.state) + "'>" + esc(x.state) +
            "</td><td>" + value(x.objective) + "</td>" + t.ranges.map(function (r) { return "<td>" + value(x.params[r]) + "</td>"; }).join("") +
            "<td>" + esc(x.reason || "") + "</td></tr>";
        }).join("") + "</table>";
    }
    function refresh() {
      get("/api/tuning/" + encodeURIComponent(name)).then(function (t) {
        draw(t);
        document.body.setAttribute("data-state", t.state);
        if (t.state === "InProgress") setTimeout(refresh, 3000);
        else document.body.setAttribute("data-loaded", "1");
      }).catch(fail);
    }
    refresh();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var view = document.body.getAttribute("data-view");
    if (view === "job") jobView(document.body.getAttribute("data-job"));
    else if (view === "tuning") tuningView(document.body.getAttribute("data-job"));
    else if (view === "tunings") tuningsView();
    else jobsView();
  });
})();
