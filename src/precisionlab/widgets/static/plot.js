// precisionlab's figure drawer: turns a figure spec (widgets/figure_json.py: axes with scales,
// limits, ticks, labels, lines, segments, polygons, text and a legend, in data coordinates)
// into an SVG element. No library, no network. window.PLPlot.draw(spec, alt, id) returns the
// <svg>; id (unique on the page) names its clip paths.
window.PLPlot = window.PLPlot || (function () {
  var NS = "http://www.w3.org/2000/svg";
  var ANCHOR = {left: "start", center: "middle", right: "end"};
  var BASELINE = {top: "hanging", center: "central", center_baseline: "central",
                  bottom: "text-after-edge", baseline: "alphabetic"};

  function el(name, attrs, parent, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { if (attrs[k] !== null && attrs[k] !== undefined) { e.setAttribute(k, attrs[k]); } }
    if (text !== undefined) { e.textContent = text; }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function width(s, fs) { return String(s).length * fs * 0.56; }  // text width estimate
  function paint(c) { return c && c[0] ? c[0] : "none"; }

  // data -> scaled value on one axis: linear, log or matplotlib's symlog
  function scaled(sc) {
    if (sc.type === "log") { return function (v) { return Math.log(v) / Math.log(sc.base); }; }
    if (sc.type === "symlog") {
      var adj = sc.linscale / (1 - 1 / sc.base), t = sc.linthresh;
      return function (v) {
        var a = Math.abs(v);
        return a <= t ? v * adj : Math.sign(v) * t * (adj + Math.log(a / t) / Math.log(sc.base));
      };
    }
    return function (v) { return v; };
  }
  function mapper(sc, lim, p0, p1) {  // data -> px between p0 and p1
    var f = scaled(sc), a = f(lim[0]), b = f(lim[1]);
    return function (v) { return p0 + (f(v) - a) / (b - a) * (p1 - p0); };
  }

  function marker(g, m, x, y) {
    var r = m.size / 2, face = paint(m.face), edge = paint(m.edge);
    var st = {fill: face, "fill-opacity": m.face[1], stroke: edge, "stroke-width": m.ew};
    var s = m.shape;
    if (s === "o" || s === ".") { st.r = s === "." ? r / 2 : r; st.cx = x; st.cy = y; el("circle", st, g); return; }
    var d = {s: [[-r, -r], [r, -r], [r, r], [-r, r]], D: [[0, -r], [r, 0], [0, r], [-r, 0]],
             "^": [[0, -r], [r, r], [-r, r]], v: [[0, r], [r, -r], [-r, -r]]}[s];
    if (d) {
      st.d = "M" + d.map(function (p) { return (x + p[0]) + " " + (y + p[1]); }).join("L") + "Z";
      el("path", st, g);
      return;
    }
    var q = r * 0.8, lines = {x: [[-q, -q, q, q], [-q, q, q, -q]], X: [[-q, -q, q, q], [-q, q, q, -q]],
                              "+": [[-r, 0, r, 0], [0, -r, 0, r]], "|": [[0, -r, 0, r]], _: [[-r, 0, r, 0]]}[s];
    (lines || []).forEach(function (l) {
      el("line", {x1: x + l[0], y1: y + l[1], x2: x + l[2], y2: y + l[3], stroke: edge === "none" ? face : edge,
                  "stroke-width": s === "X" ? Math.max(m.ew, r / 2.5) : m.ew}, g);
    });
  }

  function stroke(it) {
    return {fill: "none", stroke: paint(it.color), "stroke-opacity": it.color[1], "stroke-width": it.lw,
            "stroke-dasharray": it.dash ? it.dash.join(" ") : null};
  }

  function legendSize(lg) {
    var rows = Math.ceil(lg.entries.length / lg.ncol), cols = [];
    lg.entries.forEach(function (e, i) {
      var c = Math.floor(i / rows);
      cols[c] = Math.max(cols[c] || 0, 36 + width(e.label, lg.fs));
    });
    return {w: cols.reduce(function (a, b) { return a + b; }, 0) + 10, h: rows * lg.fs * 1.45 + 8,
            cols: cols, rows: rows};
  }

  function drawLegend(g, lg, size, x0, y0) {
    if (lg.frame) {
      el("rect", {x: x0, y: y0, width: size.w, height: size.h, fill: "#fff", "fill-opacity": 0.9,
                  stroke: "#ccc", rx: 3}, g);
    }
    lg.entries.forEach(function (e, i) {
      var col = Math.floor(i / size.rows), row = i % size.rows;
      var x = x0 + 5 + size.cols.slice(0, col).reduce(function (a, b) { return a + b; }, 0);
      var y = y0 + 4 + (row + 0.5) * lg.fs * 1.45;
      if (e.patch !== undefined) {
        el("rect", {x: x + 4, y: y - lg.fs * 0.35, width: 22, height: lg.fs * 0.7, fill: paint(e.patch),
                    "fill-opacity": e.patch[1], stroke: paint(e.edge)}, g);
      } else {
        if (e.lw > 0) { el("line", Object.assign(stroke({color: e.line, lw: e.lw, dash: e.dash}), {x1: x, y1: y, x2: x + 30, y2: y}), g); }
        if (e.m) { marker(g, e.m, x + 15, y); }
      }
      el("text", {x: x + 34, y: y, "font-size": lg.fs, "dominant-baseline": "central"}, g, e.label);
    });
  }

  function drawAxes(svg, ax, spec, fs, clipId) {
    var W = spec.w, H = spec.h, cell;
    if (ax.cell) {
      var c = ax.cell;
      cell = [c[4] / c[1] * W, c[2] / c[0] * H, c[5] / c[1] * W, c[3] / c[0] * H];
    } else {
      cell = [ax.box[0] * W, (1 - ax.box[1] - ax.box[3]) * H, (ax.box[0] + ax.box[2]) * W, (1 - ax.box[1]) * H];
    }
    var ytw = ax.yticks.reduce(function (m, t) { return Math.max(m, width(t[1], fs.tick)); }, 0);
    var left = 8 + (ax.ylabel ? fs.label * 1.5 : 0) + ytw + (ax.yticks.length ? 8 : 0);
    var rot = ax.xtickrot || 0, xth = fs.tick * 1.3;  // rotated x tick labels need more room
    if (rot) { xth = ax.xticks.reduce(function (m, t) { return Math.max(m, width(t[1], fs.tick)); }, 0) * Math.sin(rot * Math.PI / 180) + fs.tick; }
    var bottom = 8 + (ax.xticks.length ? xth + 6 : 0) + (ax.xlabel ? fs.label * 1.5 : 0);
    var tfs = ax.titlefs || fs.title, top = 8 + (ax.title ? tfs * 1.6 : 0), right = 14;
    var lg = ax.legend, size = lg ? legendSize(lg) : null, where = "inside";
    if (lg && lg.anchor[0] >= 1) { where = "right"; right += size.w + 6; }
    else if (lg && lg.anchor[1] + lg.anchor[3] <= 0) { where = "below"; bottom += size.h + 4; }
    var x0 = cell[0] + left, x1 = cell[2] - right, y0 = cell[1] + top, y1 = cell[3] - bottom;
    var X = mapper(ax.xscale, ax.xlim, x0, x1), Y = mapper(ax.yscale, ax.ylim, y1, y0);
    var px = function (v, c) { return c === "a" ? x0 + v * (x1 - x0) : X(v); };
    var py = function (v, c) { return c === "a" ? y1 - v * (y1 - y0) : Y(v); };
    var g = el("g", {"font-family": "sans-serif", fill: "#000"}, svg);
    el("rect", {x: x0, y: y0, width: x1 - x0, height: y1 - y0}, el("clipPath", {id: clipId}, g));
    ax.xticks.forEach(function (t) {
      var x = X(t[0]);
      if (ax.grid[0]) { el("line", {x1: x, x2: x, y1: y0, y2: y1, stroke: "#ddd", "stroke-width": 1}, g); }
      el("line", {x1: x, x2: x, y1: y1, y2: y1 + 5, stroke: "#000"}, g);
      el("text", {x: x, y: y1 + 8, "font-size": fs.tick, "text-anchor": rot ? "end" : "middle", "dominant-baseline": "hanging",
                  transform: rot ? "rotate(" + (-rot) + " " + x + " " + (y1 + 8) + ")" : null}, g, t[1]);
    });
    ax.yticks.forEach(function (t) {
      var y = Y(t[0]);
      if (ax.grid[1]) { el("line", {x1: x0, x2: x1, y1: y, y2: y, stroke: "#ddd", "stroke-width": 1}, g); }
      el("line", {x1: x0 - 5, x2: x0, y1: y, y2: y, stroke: "#000"}, g);
      el("text", {x: x0 - 8, y: y, "font-size": fs.tick, "text-anchor": "end", "dominant-baseline": "central"}, g, t[1]);
    });
    var data = el("g", {"clip-path": "url(#" + clipId + ")"}, g);
    ax.items.forEach(function (it) {
      var cx = it.c[0], cy = it.c[1], d = "";
      if (it.t === "line") {
        var pen = "M";
        for (var i = 0; i < it.x.length; i++) {
          if (it.x[i] === null || it.y[i] === null) { pen = "M"; continue; }
          d += pen + px(it.x[i], cx).toFixed(2) + " " + py(it.y[i], cy).toFixed(2);
          pen = "L";
        }
        if (it.lw > 0 && d) { el("path", Object.assign(stroke(it), {d: d}), data); }
        if (it.m) {
          for (var j = 0; j < it.x.length; j++) {
            if (it.x[j] !== null && it.y[j] !== null) { marker(data, it.m, px(it.x[j], cx), py(it.y[j], cy)); }
          }
        }
      } else if (it.t === "segs") {
        for (var k = 0; k < it.xy.length; k += 4) {
          d += "M" + px(it.xy[k], cx).toFixed(2) + " " + py(it.xy[k + 1], cy).toFixed(2) +
               "L" + px(it.xy[k + 2], cx).toFixed(2) + " " + py(it.xy[k + 3], cy).toFixed(2);
        }
        if (d) { el("path", Object.assign(stroke(it), {d: d}), data); }
      } else if (it.t === "poly") {
        it.polys.forEach(function (p) {
          for (var q = 0; q < p.length; q += 2) { d += (q ? "L" : "M") + px(p[q], cx).toFixed(2) + " " + py(p[q + 1], cy).toFixed(2); }
          d += "Z";
        });
        el("path", {d: d, fill: paint(it.face), "fill-opacity": it.face[1], stroke: paint(it.edge),
                    "stroke-width": it.lw}, data);
      } else if (it.t === "text") {
        el("text", {x: px(it.x, cx) + it.dx, y: py(it.y, cy) - it.dy, "font-size": it.fs, fill: paint(it.color),
                    "text-anchor": ANCHOR[it.ha] || "start", "dominant-baseline": BASELINE[it.va] || "alphabetic",
                    transform: it.rot ? "rotate(" + (-it.rot) + " " + px(it.x, cx) + " " + py(it.y, cy) + ")" : null}, g, it.s);
      }
    });
    var sp = {l: [x0, y0, x0, y1], b: [x0, y1, x1, y1], t: [x0, y0, x1, y0], r: [x1, y0, x1, y1]};
    ax.spines.split("").forEach(function (s) {
      var p = sp[s];
      el("line", {x1: p[0], y1: p[1], x2: p[2], y2: p[3], stroke: "#000", "stroke-width": 1.1}, g);
    });
    if (ax.title) {
      el("text", {x: (x0 + x1) / 2, y: y0 - 8, "font-size": tfs, "font-weight": "bold", "text-anchor": "middle"}, g, ax.title);
    }
    if (ax.xlabel) {
      el("text", {x: (x0 + x1) / 2, y: y1 + 14 + xth, "font-size": fs.label, "text-anchor": "middle",
                  "dominant-baseline": "hanging"}, g, ax.xlabel);
    }
    if (ax.ylabel) {
      var yx = cell[0] + 6, yy = (y0 + y1) / 2;
      el("text", {x: yx, y: yy, "font-size": fs.label, "text-anchor": "middle", "dominant-baseline": "hanging",
                  transform: "rotate(-90 " + yx + " " + yy + ")"}, g, ax.ylabel);
    }
    if (lg) {
      var lx, ly, loc = lg.loc;
      if (where === "right") { lx = x1 + 10; ly = y0; }
      else if (where === "below") { lx = (x0 + x1 - size.w) / 2; ly = y1 + bottom - size.h - 4; }
      else {
        lx = loc.indexOf("right") >= 0 ? x1 - size.w - 6 : loc.indexOf("left") >= 0 ? x0 + 6 : (x0 + x1 - size.w) / 2;
        ly = loc.indexOf("upper") >= 0 ? y0 + 6 : loc.indexOf("lower") >= 0 ? y1 - size.h - 6 : (y0 + y1 - size.h) / 2;
      }
      drawLegend(g, lg, size, lx, ly);
    }
  }

  function draw(spec, alt, id) {
    var svg = el("svg", {viewBox: "0 0 " + spec.w + " " + spec.h, role: "img", "aria-label": alt,
                         class: "pl-figure", width: spec.w, height: spec.h});
    el("title", {}, svg, alt);
    el("rect", {x: 0, y: 0, width: spec.w, height: spec.h, fill: "#fff"}, svg);
    spec.axes.forEach(function (ax, k) { drawAxes(svg, ax, spec, spec.fs, id + "-clip-" + k); });
    return svg;
  }
  return {draw: draw};
})();
