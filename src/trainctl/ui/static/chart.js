/* A small SVG line chart for trainctl's dashboard (bundled: nothing is fetched at run time).
 * trainctlChart(element, series, {width, height, integerX}) where series = [{label, color, points: [[x, y], ...]}];
 * integerX: the x values are whole numbers (steps, trials), so are its ticks.
 * Each point is drawn as a circle too (class "pt"), so a page shows how many it has. */
(function () {
  var NS = "http://www.w3.org/2000/svg";
  function el(name, attrs) {
    var node = document.createElementNS(NS, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    return node;
  }
  function fmt(v) {
    var a = Math.abs(v);
    if (a !== 0 && (a < 0.001 || a >= 100000)) return v.toExponential(2);
    return String(Math.round(v * 1000) / 1000);
  }
  window.trainctlNumber = fmtValue;
  /* a value as a person reads it: 4 significant digits (0.01605, not 0.016048895195126534) */
  function fmtValue(v) {
    if (typeof v !== "number" || !isFinite(v)) return String(v);
    var a = Math.abs(v);
    if (a !== 0 && (a < 0.001 || a >= 100000)) return v.toExponential(3);
    return String(parseFloat(v.toPrecision(4)));
  }
  window.trainctlChart = function (target, series, options) {
    options = options || {};
    var width = options.width || 460, height = options.height || 220;
    var left = 56, right = 10, top = 10, bottom = 28;
    var xs = [], ys = [];
    series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var svg = el("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, "class": "chart-svg" });
    if (!xs.length) { target.appendChild(svg); return svg; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y1 = y0 + 1; y0 = y0 - 1; }
    var sx = function (x) { return left + (x - x0) / (x1 - x0) * (width - left - right); };
    var sy = function (y) { return top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom); };
    svg.appendChild(el("rect", { x: left, y: top, width: width - left - right, height: height - top - bottom, fill: "none", stroke: "#d0d7de" }));
    var xTicks = [];
    for (var i = 0; i <= 4; i++) {
      var yv = y0 + (y1 - y0) * i / 4, yy = sy(yv);
      svg.appendChild(el("line", { x1: left, x2: width - right, y1: yy, y2: yy, stroke: "#eaeef2" }));
      var t = el("text", { x: left - 4, y: yy + 4, "text-anchor": "end", "font-size": 10, fill: "#57606a" });
      t.textContent = fmt(yv); svg.appendChild(t);
      var xv = x0 + (x1 - x0) * i / 4;
      /* steps and trial numbers are whole: a tick at each whole value the five land on */
      if (options.integerX) { xv = Math.round(xv); if (xTicks.indexOf(xv) >= 0) continue; xTicks.push(xv); }
      var tx = el("text", { x: sx(xv), y: height - 10, "text-anchor": "middle", "font-size": 10, fill: "#57606a", "class": "xtick" });
      tx.textContent = fmt(xv); svg.appendChild(tx);
    }
    series.forEach(function (s) {
      if (!s.points.length) return;
      var d = s.points.map(function (p, k) { return (k ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join(" ");
      svg.appendChild(el("path", { d: d, fill: "none", stroke: s.color, "stroke-width": 1.5, "class": "line" }));
      s.points.forEach(function (p) {
        svg.appendChild(el("circle", { cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 1.6, fill: s.color, "class": "pt" }));
      });
    });
    target.appendChild(svg);
    return svg;
  };
})();
