// precisionlab's static view switcher: shows views precomputed over a grid, with no kernel
// and no network; a view's figure is a spec drawn as SVG by plot.js (window.PLPlot), or a PNG. Every control is a native <input>/<select>, so Tab reaches it and the arrow
// keys (Home/End on a slider) move it. The fragment #<id>--<name>-<index>... selects a view (a
// shareable link); it uses only [A-Za-z0-9_-], so themes that hand location.hash to
// querySelector do not throw.
(function () {
  function init(root) {
    if (root.getAttribute("data-pl-ready")) { return; }
    root.setAttribute("data-pl-ready", "1");
    var data = JSON.parse(root.querySelector("script.pl-data").textContent);
    var img = root.querySelector("img.pl-frame"), panel = root.querySelector(".pl-panel");
    var box = document.createElement("div");  // holds the drawn SVG; the <img> is for no-script
    box.className = "pl-figure-box";
    img.parentNode.insertBefore(box, img.nextSibling);
    var ctl = data.names.map(function (n) { return root.querySelector("[data-pl-param='" + n + "']"); });
    function get(i) {
      var c = ctl[i];
      if (!c) { return 0; }  // a parameter with one value has no control
      return c.type === "checkbox" ? data.checkbox[i][c.checked ? 1 : 0] : parseInt(c.value, 10);
    }
    function put(i, k) {
      var c = ctl[i];
      if (!c) { return; }
      if (c.type === "checkbox") { c.checked = data.checkbox[i][1] === k; } else { c.value = String(k); }
    }
    function show(share) {
      var flat = 0, parts = [], said = [];
      for (var i = 0; i < ctl.length; i++) {
        var k = get(i), text = data.labels[i][k];
        flat = flat * data.labels[i].length + k;
        parts.push(data.names[i] + "-" + k);
        said.push(data.names[i] + "=" + text);
        if (ctl[i] && ctl[i].type === "range") { ctl[i].setAttribute("aria-valuetext", text); }
        var out = root.querySelector("output[data-pl-for='" + data.names[i] + "']");
        if (out) { out.textContent = text; }
      }
      var frame = data.frames[flat];
      panel.innerHTML = data.panels[frame[1]];
      var fig = data.figures[frame[0]], about = data.alts[frame[0]];
      var alt = data.view + ", " + said.join(", ") + (about ? ": " + about : "");
      box.textContent = "";
      img.style.display = typeof fig === "string" ? "" : "none";
      if (typeof fig === "string") { img.src = fig; img.alt = alt; }  // a PNG frame
      else if (fig) { box.appendChild(window.PLPlot.draw(fig, alt, data.id)); }
      root.setAttribute("data-pl-frame", String(flat));
      if (share) {
        try { history.replaceState(null, "", "#" + data.id + "--" + parts.join("--")); } catch (e) {}
      }
    }
    function fromHash() {
      var h = window.location.hash.slice(1);
      if (h.indexOf(data.id + "--") !== 0) { return false; }
      h.slice(data.id.length + 2).split("--").forEach(function (part) {
        var cut = part.lastIndexOf("-"), i = data.names.indexOf(part.slice(0, cut));
        var k = parseInt(part.slice(cut + 1), 10);
        if (i >= 0 && k >= 0 && k < data.labels[i].length) { put(i, k); }
      });
      return true;
    }
    ctl.forEach(function (c) {
      if (!c) { return; }
      c.addEventListener("input", function () { show(true); });
      c.addEventListener("change", function () { show(true); });
    });
    window.addEventListener("hashchange", function () { if (fromHash()) { show(false); } });
    if (fromHash()) { show(false); root.scrollIntoView(); } else { show(false); }
  }
  var all = document.querySelectorAll(".pl-interactive");
  for (var j = 0; j < all.length; j++) { init(all[j]); }
})();
