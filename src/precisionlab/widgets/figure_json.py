"""A matplotlib Figure as a small JSON-ready spec that static/plot.js draws as SVG in the page."""

# The spec holds what the figure shows, in data coordinates: each Axes' scales, limits, ticks
# and their labels, title and axis labels, and its artists (lines, vertical/horizontal line
# collections, filled polygons, bars, text, legend). Numbers keep DIGITS significant digits;
# long lines are simplified within TOLERANCE_PX of the drawn curve (Ramer-Douglas-Peucker in
# the Axes' pixel space), and each axis' numbers keep the digits that place them within 0.05 px
# (axis_digits; DIGITS at least). An artist the spec cannot express raises UnsupportedFigure: the
# caller then keeps a PNG of that view, so nothing drawn vanishes silently.

from __future__ import annotations

import math
import re

import numpy as np
from matplotlib import cbook, rcParams
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_hex, to_rgba
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Annotation, Text

__all__ = ["DIGITS", "PX_PER_INCH", "TOLERANCE_PX", "UnsupportedFigure", "axis_digits", "figure_spec",
           "plain_text", "rounded", "simplify"]

DIGITS = 5           # significant digits kept of every coordinate, at least
PX_PER_INCH = 100    # the page draws a 7-inch figure 700 px wide, the book's text column
TOLERANCE_PX = 0.25  # a simplified line stays this close (in px) to the full one
PT = PX_PER_INCH / 72  # pixels per point (line widths, marker and font sizes)
MARKERS = {"o", ".", "x", "X", "+", "s", "D", "^", "v", "|", "_"}
LOCS = {0: "upper right", 1: "upper right", 2: "upper left", 3: "lower left", 4: "lower right",
        5: "center right", 6: "center left", 7: "center right", 8: "lower center",
        9: "upper center", 10: "center"}

_SUPER = str.maketrans("0123456789-+\u2212.", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b\u207a\u207b\u00b7")
_SUB = str.maketrans("0123456789-+", "\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089\u208b\u208a")
_SYMBOLS = {r"\times": "\u00d7", r"\cdot": "\u00b7", r"\minus": "\u2212", r"\pm": "\u00b1", r"\leq": "\u2264",
            r"\geq": "\u2265", r"\approx": "\u2248", r"\infty": "\u221e", r"\alpha": "\u03b1", r"\beta": "\u03b2",
            r"\varepsilon": "\u03b5", r"\epsilon": "\u03b5", r"\mu": "\u03bc", r"\sigma": "\u03c3", r"\,": " ",
            r"\;": " ", r"\ ": " ", r"\log": "log", r"\%": "%", "-": "\u2212"}


class UnsupportedFigure(ValueError):
    """A figure holds an artist (or a transform, marker, text) the spec cannot express."""


def plain_text(s: str) -> str:
    """Text with matplotlib's mathtext ($...$: \\mathdefault, ^{..}, _{..}, symbols) as Unicode."""
    def math(m):
        t = re.sub(r"\^\{([^{}]*)\}|\^(.)", lambda g: (g.group(1) or g.group(2)).translate(_SUPER),
                   m.group(1))
        t = re.sub(r"_\{([^{}]*)\}|_(.)", lambda g: (g.group(1) or g.group(2)).translate(_SUB), t)
        t = re.sub(r"\\math(?:default|rm|it|bf)\{([^{}]*)\}", r"\1", t)
        for tex, char in _SYMBOLS.items():
            t = t.replace(tex, char)
        if "\\" in t:
            raise UnsupportedFigure(f"mathtext {m.group(0)!r} has a command plain_text cannot show")
        return t.replace("{", "").replace("}", "")
    return re.sub(r"(?<!\\)\$(.+?)(?<!\\)\$", math, s).replace(r"\$", "$")


def rounded(values, digits: int = DIGITS) -> list:
    """values as a list of floats kept to `digits` significant digits; NaN and inf as None."""
    a = np.asarray(values, dtype=np.float64).ravel()
    out = [float(s) for s in np.char.mod(f"%.{digits}g", a)]
    return [v if math.isfinite(v) else None for v in out]


def axis_digits(lim, px: float, scale: str) -> int:
    """Significant digits that place a value within 0.05 px on an axis of px pixels over lim."""
    lo, hi = sorted(float(v) for v in lim)
    if scale == "log" or hi <= lo:
        return DIGITS  # a relative error of 10^-5 is far below a pixel on a log axis
    quantum = (hi - lo) / max(px, 1.0) / 20
    return int(min(17, max(DIGITS, math.ceil(math.log10(max(abs(lo), abs(hi)) / quantum)) + 1)))


def _pairs(flat, coords, digits) -> list:
    """Interleaved x, y values, each column rounded for its axis ('a' coordinates: DIGITS)."""
    a = np.asarray(flat, dtype=np.float64).reshape(-1, 2)
    cols = [rounded(a[:, j], digits[j] if coords[j] == "d" else DIGITS) for j in (0, 1)]
    return [v for pair in zip(*cols, strict=True) for v in pair]


def _color(c) -> list:
    """[hex colour, alpha] of a matplotlib colour ('none' -> [None, 0])."""
    if c is None or (isinstance(c, str) and c.lower() == "none"):
        return [None, 0]
    rgba = to_rgba(c)
    return [to_hex(rgba, keep_alpha=False), round(rgba[3], 3)] if rgba[3] > 0 else [None, 0]


def _dash(artist, lw_pt: float):
    """The dash pattern in px (None for a solid line)."""
    pattern = getattr(artist, "_dash_pattern", None)  # matplotlib's scaled dashes (offset, seq)
    if isinstance(artist, LineCollection):
        patterns = artist.get_dashes()
        pattern = patterns[0] if patterns else None
    if not pattern or pattern[1] is None:
        return None
    return [round(d * PT, 2) for d in pattern[1]]


class _Scaler:
    """An Axes' data-to-pixel map for one axis (linear, log or symlog), to simplify lines."""

    def __init__(self, ax: Axes, which: str, px: float):
        self.scale = (ax.get_xscale if which == "x" else ax.get_yscale)()
        axis = ax.xaxis if which == "x" else ax.yaxis
        self.tr = axis.get_transform()
        lo, hi = self.tr.transform(np.array(ax.get_xlim() if which == "x" else ax.get_ylim()))
        self.lo, self.k = lo, px / (hi - lo) if hi != lo else 1.0

    def __call__(self, v):
        with np.errstate(all="ignore"):
            return (self.tr.transform(np.asarray(v, dtype=np.float64)) - self.lo) * self.k


def _split_point(px: np.ndarray, py: np.ndarray, i: int, j: int, tol: float) -> int | None:
    """The first farthest interior point of segment (i, j) if it lies more than tol away, else None."""
    dx, dy = px[j] - px[i], py[j] - py[i]
    sx, sy = px[i + 1:j] - px[i], py[i + 1:j] - py[i]
    seg = dx * dx + dy * dy
    if seg == 0:
        dist = np.hypot(sx, sy)
    else:  # distance to the segment (not the infinite line): exact for back-tracking lines
        t = np.clip((sx * dx + sy * dy) / seg, 0.0, 1.0)
        dist = np.hypot(sx - t * dx, sy - t * dy)
    k = int(np.argmax(dist))
    return int(i) + 1 + k if dist[k] > tol else None


def simplify(px: np.ndarray, py: np.ndarray, tol: float = TOLERANCE_PX) -> np.ndarray:
    """Indices kept by Ramer-Douglas-Peucker: every dropped point lies within tol of the kept polyline.

    A segment keeps its ends and splits at its farthest interior point (the first of equals)
    while that point is more than tol away. The kept set does not depend on the order the
    segments are taken in, so while few segments wait (a zigzag of growing amplitude keeps
    it at one or two) they are taken one at a time by slices, and once more wait, all of
    them at once: a few array operations for the lot instead of a few per segment.
    """
    n = px.size
    if n <= 2:
        return np.arange(n)
    keep = np.zeros(n, dtype=bool)
    keep[[0, n - 1]] = True
    waiting = [(0, n - 1)]
    while waiting:
        if len(waiting) <= 2:
            i, j = waiting.pop()
            k = _split_point(px, py, i, j, tol) if j - i > 1 else None
            if k is not None:
                keep[k] = True
                waiting += [(i, k), (k, j)]
            continue
        lo, hi = (np.array(v, dtype=np.intp) for v in zip(*waiting, strict=True))
        inner = hi - lo - 1  # interior points of each segment
        lo, hi, inner = lo[inner > 0], hi[inner > 0], inner[inner > 0]
        waiting = []
        if not lo.size:
            break
        seg_of = np.repeat(np.arange(lo.size), inner)
        first = np.cumsum(inner) - inner  # each segment's offset in the flat arrays
        k = np.arange(inner.sum()) - first[seg_of] + lo[seg_of] + 1  # the interior points
        i, j = lo[seg_of], hi[seg_of]
        dx, dy = px[j] - px[i], py[j] - py[i]
        sx, sy = px[k] - px[i], py[k] - py[i]
        seg = dx * dx + dy * dy
        with np.errstate(invalid="ignore", divide="ignore"):
            # the same operations as _split_point's, element for element
            t = np.clip((sx * dx + sy * dy) / seg, 0.0, 1.0)
            dist = np.where(seg == 0, np.hypot(sx, sy), np.hypot(sx - t * dx, sy - t * dy))
        far = np.maximum.reduceat(dist, first)
        hit = np.flatnonzero(dist == far[seg_of])  # NaN (no finite distance) matches nothing
        segs, at = np.unique(seg_of[hit], return_index=True)  # the first farthest point
        split = far[segs] > tol
        segs, mid = segs[split], k[hit[at[split]]]
        keep[mid] = True
        waiting = list(zip(np.concatenate([lo[segs], mid]).tolist(),
                           np.concatenate([mid, hi[segs]]).tolist(), strict=True))
    return np.flatnonzero(keep)


def _coords(ax: Axes, transform) -> tuple[str, str]:
    """Which coordinates an artist's x and y are in: 'd' (data) or 'a' (axes fraction)."""
    for tr, kind in ((ax.transData, ("d", "d")), (ax.transAxes, ("a", "a")),
                     (ax.get_yaxis_transform(), ("a", "d")), (ax.get_xaxis_transform(), ("d", "a"))):
        if transform == tr:
            return kind
    raise UnsupportedFigure(f"an artist of {ax.get_title()!r} uses a transform the spec cannot "
                            f"express: {transform}")


def _line(ax: Axes, line: Line2D, size: tuple[float, float], digits) -> dict:
    """A Line2D: its drawn vertices (steps expanded, simplified), colour, width, dashes and marker."""
    cx, cy = _coords(ax, line.get_transform())
    x, y = (np.asarray(v, dtype=np.float64) for v in line.get_data(orig=False))
    style = line.get_drawstyle()
    if style != "default":
        x, y = cbook.STEP_LOOKUP_MAP[style](x, y)
    marker = line.get_marker()
    marker = None if marker in ("None", "none", "", " ", None) else str(marker)
    if marker is not None and marker not in MARKERS:
        raise UnsupportedFigure(f"marker {marker!r} of line {line.get_label()!r} is not drawn "
                                f"by plot.js; supported: {sorted(MARKERS)}")
    ls = line.get_linestyle()
    solid = ls not in ("None", "none", "", " ")
    if solid and marker is None and x.size > 2 and cx == cy == "d":
        sx, sy = _Scaler(ax, "x", size[0]), _Scaler(ax, "y", size[1])
        px, py = sx(x), sy(y)
        ok = np.isfinite(px) & np.isfinite(py)
        keep, start = [], 0
        for stop in [*np.flatnonzero(~ok), x.size]:  # simplify each run between gaps
            if stop > start:
                keep.append(start + simplify(px[start:stop], py[start:stop]))
            if stop < x.size:
                keep.append(np.array([stop]))
            start = stop + 1
        idx = np.concatenate(keep)
        x, y = x[idx], y[idx]
    lw = line.get_linewidth()
    item = {"t": "line", "c": (cx, cy), "x": rounded(x, digits[0] if cx == "d" else DIGITS),
            "y": rounded(y, digits[1] if cy == "d" else DIGITS),
            "color": _color(line.get_color()), "lw": round(lw * PT, 2) if solid else 0,
            "dash": _dash(line, lw) if solid else None, "z": line.get_zorder()}
    if marker is not None:
        item["m"] = {"shape": marker, "size": round(line.get_markersize() * PT, 2),
                     "face": _color(line.get_markerfacecolor()),
                     "edge": _color(line.get_markeredgecolor()),
                     "ew": round(line.get_markeredgewidth() * PT, 2)}
    return item


def _segments(ax: Axes, coll: LineCollection, digits) -> dict:
    """A LineCollection of two-point segments (vlines, hlines): [x0, y0, x1, y1] each."""
    cx, cy = _coords(ax, coll.get_transform())
    segs = coll.get_segments()
    if any(len(s) != 2 for s in segs) or len(coll.get_colors()) > 1:
        raise UnsupportedFigure(f"line collection {coll.get_label()!r}: only two-point segments "
                                "of one colour are supported")
    lw = float(np.atleast_1d(coll.get_linewidth())[0])
    flat = np.array([np.ravel(s) for s in segs]).ravel() if segs else []
    return {"t": "segs", "c": (cx, cy), "xy": _pairs(flat, (cx, cy), digits), "color": _color(coll.get_colors()[0]),
            "lw": round(lw * PT, 2), "dash": _dash(coll, lw), "z": coll.get_zorder()}


def _polygons(ax: Axes, transform, polys, face, edge, lw, z, digits) -> dict:
    """Filled polygons (fill_between, bars), each as its flat list of x, y vertices."""
    cx, cy = _coords(ax, transform)
    return {"t": "poly", "c": (cx, cy), "polys": [_pairs(np.asarray(p).ravel(), (cx, cy), digits) for p in polys],
            "face": _color(face), "edge": _color(edge), "lw": round(lw * PT, 2), "z": z}


def _text(ax: Axes, text: Text, digits) -> dict:
    """A text label in data or axes coordinates, with an offset in points for annotations."""
    offset = (0.0, 0.0)
    if isinstance(text, Annotation):
        if text.arrow_patch is not None or text.xycoords not in ("data", "axes fraction"):
            raise UnsupportedFigure(f"annotation {text.get_text()!r}: arrows and xycoords "
                                    f"{text.xycoords!r} are not supported")
        if text.anncoords not in ("offset points", text.xycoords):
            raise UnsupportedFigure(f"annotation {text.get_text()!r}: textcoords "
                                    f"{text.anncoords!r} is not supported")
        (x, y), coords = text.xy, ("d", "d") if text.xycoords == "data" else ("a", "a")
        if text.anncoords == "offset points":
            offset = text.xyann
        else:
            x, y = text.xyann
    else:
        (x, y), coords = text.get_position(), _coords(ax, text.get_transform())
    x, y = _pairs([x, y], coords, digits)
    return {"t": "text", "c": coords, "x": x, "y": y,
            "dx": round(offset[0] * PT, 1), "dy": round(offset[1] * PT, 1),
            "s": plain_text(text.get_text()), "color": _color(text.get_color()),
            "fs": round(text.get_fontsize() * PT, 1), "ha": text.get_horizontalalignment(),
            "va": text.get_verticalalignment(), "rot": text.get_rotation(), "z": text.get_zorder()}


def _handle(h) -> dict:
    """A legend entry's key: a line (with marker) or a filled patch."""
    if isinstance(h, Line2D):
        marker = h.get_marker()
        solid = h.get_linestyle() not in ("None", "none", "", " ")
        key = {"line": _color(h.get_color()), "lw": round(h.get_linewidth() * PT, 2) if solid else 0,
               "dash": _dash(h, h.get_linewidth()) if solid else None}
        if marker not in ("None", "none", "", " ", None):
            key["m"] = {"shape": str(marker), "size": round(h.get_markersize() * PT, 2),
                        "face": _color(h.get_markerfacecolor()),
                        "edge": _color(h.get_markeredgecolor()),
                        "ew": round(h.get_markeredgewidth() * PT, 2)}
        return key
    if isinstance(h, LineCollection):
        lw = float(np.atleast_1d(h.get_linewidth())[0])
        return {"line": _color(h.get_colors()[0]), "lw": round(lw * PT, 2), "dash": _dash(h, lw)}
    if isinstance(h, Patch):
        return {"patch": _color(h.get_facecolor()), "edge": _color(h.get_edgecolor())}
    if isinstance(h, PolyCollection):
        return {"patch": _color(h.get_facecolor()[0]), "edge": [None, 0]}
    raise UnsupportedFigure(f"legend handle {type(h).__name__} is not supported")


def _best_corner(ax: Axes) -> str:
    """loc='best' as plot.js can place it: the Axes corner whose third holds the fewest data points."""
    points = [ln.get_xydata() for ln in ax.get_lines() if ln.get_transform() == ax.transData]
    xy = np.concatenate(points) if points else np.empty((0, 2))
    with np.errstate(all="ignore"):
        xy = (ax.transData + ax.transAxes.inverted()).transform(xy) if len(xy) else xy
    corners = {"upper right": (1, 1), "upper left": (0, 1), "lower left": (0, 0),
               "lower right": (1, 0)}
    return min(corners, key=lambda c: int(np.sum((np.abs(xy[:, 0] - corners[c][0]) < 0.4)
                                                 & (np.abs(xy[:, 1] - corners[c][1]) < 0.4))))


def _legend(ax: Axes, legend: Legend) -> dict:
    """A legend: entries, columns, font size, and where it sits (loc against its anchor box)."""
    loc = legend._loc  # matplotlib keeps the resolved location code here
    if not isinstance(loc, int):
        raise UnsupportedFigure(f"legend of {ax.get_title()!r}: loc {loc!r} is not supported")
    box = legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted())
    texts = [t.get_text() for t in legend.get_texts()]
    return {"loc": _best_corner(ax) if loc == 0 else LOCS[loc], "anchor": rounded(box.bounds), "ncol": legend._ncols,
            "fs": round(legend.get_texts()[0].get_fontsize() * PT, 1) if texts else 10,
            "frame": legend.get_frame_on(),
            "entries": [{"label": plain_text(t), **_handle(h)}
                        for t, h in zip(texts, legend.legend_handles, strict=True)]}


def _scale(ax: Axes, which: str) -> dict:
    """An axis' scale: linear, log (base) or symlog (base, linthresh, linscale)."""
    name = (ax.get_xscale if which == "x" else ax.get_yscale)()
    tr = (ax.xaxis if which == "x" else ax.yaxis).get_transform()
    if name == "linear":
        return {"type": "linear"}
    if name == "log":
        return {"type": "log", "base": tr.base}
    if name == "symlog":
        return {"type": "symlog", "base": tr.base, "linthresh": tr.linthresh,
                "linscale": tr.linscale}
    raise UnsupportedFigure(f"{which} scale {name!r} of {ax.get_title()!r} is not supported")


def _ticks(ax: Axes, which: str, digits: int, locs: np.ndarray) -> list:
    """The major ticks inside the limits: [[position, label], ...]; locs: the axis' major tick locations."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    span = (hi - lo) * 1e-9
    locs = locs[(locs >= lo - span) & (locs <= hi + span)]
    labels = axis.get_major_formatter().format_ticks(locs) if locs.size else []
    if not axis.get_tick_params().get("labelbottom" if which == "x" else "labelleft", True):
        labels = [""] * len(labels)  # hidden, e.g. the upper of two Axes sharing x
    return [[v, plain_text(s)] for v, s in zip(rounded(locs, digits), labels, strict=True)]


def _tick_rotation(axis, n: int) -> float:
    """The rotation in degrees of an axis' tick labels (set_xticklabels(..., rotation=30)).

    What ``axis.get_majorticklabels()[0].get_rotation()`` returns (0 without a visible label),
    read without making the ticks that call would add: one per tick location beyond those that
    exist, each a copy of the first (matplotlib >= 3.9 copies its labels' rotation and
    visibility), so the first visible label among the existing ticks is the first of them all.
    n: the number of major tick locations (get_majorticklocs).
    Making those ticks took most of a frame's spec time.
    """
    ticks = axis.get_major_ticks(min(n, len(axis.majorTicks)))  # creates none
    for which in ("label1", "label2"):  # get_majorticklabels lists every label1, then label2
        for tick in ticks:
            label = getattr(tick, which)
            if label.get_visible():
                return float(label.get_rotation())
    return 0.0


def _axes(ax: Axes, fig_px: tuple[float, float]) -> dict:
    """One Axes: its place in the figure, scales, limits, ticks, labels, artists and legend."""
    pos = ax.get_position()
    size = (pos.width * fig_px[0], pos.height * fig_px[1])
    spec = ax.get_subplotspec()
    cell = None
    if spec is not None:
        rows, cols = spec.get_geometry()[:2]
        cell = [rows, cols, spec.rowspan.start, spec.rowspan.stop, spec.colspan.start,
                spec.colspan.stop]
    digits = (axis_digits(ax.get_xlim(), size[0], ax.get_xscale()),
              axis_digits(ax.get_ylim(), size[1], ax.get_yscale()))
    items = []
    for child in ax.get_children():
        if not child.get_visible() or child in (ax.patch, ax.title, ax._left_title,
                                                ax._right_title, ax.get_legend()):
            continue
        if isinstance(child, Line2D):
            items.append(_line(ax, child, size, digits))
        elif isinstance(child, LineCollection):
            items.append(_segments(ax, child, digits))
        elif isinstance(child, PolyCollection):
            polys = [p.vertices for p in child.get_paths()]
            items.append(_polygons(ax, child.get_transform(), polys, child.get_facecolor()[0],
                                   "none", 0.0, child.get_zorder(), digits))
        elif isinstance(child, Rectangle):
            corners = child.get_patch_transform().transform([(0, 0), (1, 0), (1, 1), (0, 1)])
            items.append(_polygons(ax, child.get_data_transform(), [corners], child.get_facecolor(),
                                   child.get_edgecolor(), child.get_linewidth(), child.get_zorder(),
                                   digits))
        elif isinstance(child, Text):
            if child.get_text():
                items.append(_text(ax, child, digits))
        elif type(child).__name__ in ("Spine", "XAxis", "YAxis"):
            continue
        else:
            raise UnsupportedFigure(f"artist {type(child).__name__} ({child.get_label()!r}) in "
                                    f"{ax.get_title()!r} is not supported by the figure spec")
    items.sort(key=lambda it: it["z"])
    merged = []
    for it in items:  # consecutive polygons of one style (a bar chart's bars) share one item
        last = merged[-1] if merged else None
        if it["t"] == "poly" and last is not None and last["t"] == "poly" and all(
                it[k] == last[k] for k in ("c", "face", "edge", "lw", "z")):
            last["polys"] += it["polys"]
        else:
            merged.append(it)
    grid = [bool(getattr(a, "_major_tick_kw", {}).get("gridOn", False))  # matplotlib's grid flag
            for a in (ax.xaxis, ax.yaxis)]
    legend = ax.get_legend()
    xlocs, ylocs = (np.asarray(a.get_majorticklocs(), dtype=np.float64)  # the locator, once
                    for a in (ax.xaxis, ax.yaxis))
    return {"box": rounded([pos.x0, pos.y0, pos.width, pos.height]), "cell": cell,
            "title": plain_text(ax.get_title()), "xlabel": plain_text(ax.get_xlabel()),
            "ylabel": plain_text(ax.get_ylabel()), "xscale": _scale(ax, "x"),
            "yscale": _scale(ax, "y"), "digits": list(digits),
            "xlim": rounded(ax.get_xlim(), digits[0]), "ylim": rounded(ax.get_ylim(), digits[1]),
            "xticks": _ticks(ax, "x", digits[0], xlocs), "yticks": _ticks(ax, "y", digits[1], ylocs),
            "grid": grid, "xtickrot": _tick_rotation(ax.xaxis, xlocs.size), "titlefs": round(ax.title.get_fontsize() * PT, 1),
            "spines": "".join(k[0] for k in ("left", "bottom", "top", "right")
                              if ax.spines[k].get_visible()),
            "items": merged, "legend": None if legend is None else _legend(ax, legend)}


def figure_spec(fig: Figure) -> dict:
    """The figure as a JSON-ready dict: size in px and each Axes' spec (see the module comment)."""
    w, h = fig.get_size_inches()
    px = (float(w) * PX_PER_INCH, float(h) * PX_PER_INCH)
    if fig.texts or fig.legends or fig.images or fig.patches or fig.lines:
        raise UnsupportedFigure("figure-level texts, legends, images or patches are not supported")
    sizes = {k: round(FontProperties(size=rcParams[key]).get_size_in_points() * PT, 1)
             for k, key in (("tick", "xtick.labelsize"), ("label", "axes.labelsize"),
                            ("title", "axes.titlesize"))}
    return {"w": round(px[0]), "h": round(px[1]), "fs": sizes,
            "axes": [_axes(ax, px) for ax in fig.axes]}
