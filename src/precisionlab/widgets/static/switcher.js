// precisionlab's static frame switcher: shows frames precomputed over a grid, with no kernel
// and no network. Every control is a native <input>/<select>, so Tab reaches it and the arrow
// keys (Home/End on a slider) move it. The fragment #<id>--<name>-<index>... selects a view (a
// shareable link); it uses only [A-Za-z0-9_-], so themes that hand location.hash to
// querySelector do not throw.
(function () {
  function init(root) {
    if (root.getAttribute("data-pl-ready")) { return; }
    root.setAttribute("data-pl-ready", "1");
    var data = JSON.parse(root.querySelector("script.pl-data").textContent);
    var img = root.querySelector("img.pl-frame"), panel = root.querySelector(".pl-panel");
    if (img) { data.images[data.images.indexOf("")] = img.getAttribute("src"); }
    var ctl = data.names.map(function (n) { return root.querySelector("[data-pl-param='" + n + "']"); });
    function get(i) {
      var c = ctl[i];
      return c.type === "checkbox" ? data.checkbox[i][c.checked ? 1 : 0] : parseInt(c.value, 10);
    }
    function put(i, k) {
      var c = ctl[i];
      if (c.type === "checkbox") { c.checked = data.checkbox[i][1] === k; } else { c.value = String(k); }
    }
    function show(share) {
      var flat = 0, parts = [], said = [];
      for (var i = 0; i < ctl.length; i++) {
        var k = get(i), text = data.labels[i][k];
        flat = flat * data.labels[i].length + k;
        parts.push(data.names[i] + "-" + k);
        said.push(data.names[i] + "=" + text);
        if (ctl[i].type === "range") { ctl[i].setAttribute("aria-valuetext", text); }
        var out = root.querySelector("output[data-pl-for='" + data.names[i] + "']");
        if (out) { out.textContent = text; }
      }
      var frame = data.frames[flat];
      panel.innerHTML = data.panels[frame[1]];
      if (img) {
        var src = data.images[frame[0]], about = data.alts[frame[0]];
        img.style.display = src ? "" : "none";
        if (src) { img.src = src; img.alt = data.view + ", " + said.join(", ") + (about ? ": " + about : ""); }
      }
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
      c.addEventListener("input", function () { show(true); });
      c.addEventListener("change", function () { show(true); });
    });
    window.addEventListener("hashchange", function () { if (fromHash()) { show(false); } });
    if (fromHash()) { show(false); root.scrollIntoView(); } else { show(false); }
  }
  var all = document.querySelectorAll(".pl-interactive");
  for (var j = 0; j < all.length; j++) { init(all[j]); }
})();
