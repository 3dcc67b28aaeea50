"""Thin ipywidgets wrappers around `rounding`, `updates` and `plotting` (imported only by notebooks).

Each chapter's explorer is `interactive(xxx_view, XXX_GRID, **defaults)`: one output that a
live front end (Jupyter, Colab, VS Code; ipywidgets 7 or 8) shows as controls recomputing
`xxx_view`, and that the HTML book shows as a self-contained control switching frames
precomputed over the grid (no kernel, no network). The older helpers below (_live,
_display) redraw outputs through display handles. Callbacks only validate input and call
the package's plain functions.
"""

from __future__ import annotations

import html
import io
import math

from matplotlib.figure import Figure

from .checks import check_choice
from .formats import FORMAT_NAMES, FORMATS, get_format  # noqa: F401 (FORMAT_NAMES: for chapter widgets)
from .plotting import plot_crossing_trajectory, plot_number_line
from .rounding import decompose, next_down, next_up, round_to, ulp
from .tables import format_value
from .updates import (
    DETERMINISTIC_MODES,
    simulate_crossing,
    steps_to_cross,
    steps_to_cross_estimate,
)

__all__ = [
    "BIT_GRID",
    "CROSSING_GRID",
    "TextPanel",
    "bit_explorer",
    "bit_view",
    "crossing_explorer",
    "crossing_view",
]

_MAX_TRAJECTORY_STEPS = 20_000


class TextPanel:
    """Monospaced text that shows as <pre> in HTML front ends and as itself elsewhere."""

    def __init__(self, text: str, error: bool = False):
        self.text = text
        self.error = error

    def _repr_html_(self) -> str:
        color = "#b00020" if self.error else "inherit"
        return (f'<pre style="font-size: 0.9em; line-height: 1.35; color: {color}">'
                f"{html.escape(self.text)}</pre>")

    def __repr__(self) -> str:
        return self.text


def _check_value(value, name: str = "value") -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number; got {name}={value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite; got {name}={v!r}")
    return v


def _check_fmt(fmt):
    return get_format(fmt)  # raises ValueError naming the valid choices


def _check_mode(mode: str) -> str:
    return check_choice(mode, "rounding mode", DETERMINISTIC_MODES)


def _figure(height: float) -> tuple[Figure, object]:
    fig = Figure(figsize=(7.0, height))
    return fig, fig.subplots()


def _live(view, boxes, handles) -> None:
    """Redraw the (text, figure) pair that view() returns into handles whenever a box changes."""
    h_text, h_fig = handles

    def redraw(_change=None):
        try:
            panel, fig = view()
        except ValueError as err:  # out-of-range input: say so in place of the panel
            _display(TextPanel(str(err), error=True), h_text)
            return
        _display(panel, h_text)
        _display(fig, h_fig)

    for box in boxes:
        box.observe(redraw, names="value")


# --------------------------------------------------------------------------- bit explorer


def bit_view(value: float = 0.1, fmt="bfloat16", mode: str = "nearest_even") -> tuple[TextPanel, Figure]:
    """The explorer's view of fl(value): fields, ulp, neighbours, and a number line around it."""
    v = _check_value(value)
    f = _check_fmt(fmt)
    _check_mode(mode)
    if abs(v) > f.max_finite:
        raise ValueError(
            f"value={v!r} is outside {f.name}'s finite range [-{f.max_finite!r}, {f.max_finite!r}]"
        )
    fields = decompose(v, f, mode)
    fx = fields.value
    err = fx - v
    rel = f"{err / v:+.3e}" if v != 0 else "n/a"
    gap_up = float(next_up(fx, f)) - fx
    lines = [
        f"x          = {v!r}  rounded into {f.name} ({mode})",
        f"fl(x)      = {fx!r}   (error {err:+.3e}, relative {rel})",
        f"bits       = {fields.bits}   (sign | exponent | mantissa)",
        f"kind       = {fields.kind}: {fields.meaning.split(' = ')[0]}",
        f"ulp(fl(x)) = {format_value(float(ulp(fx, f)))} = {float(ulp(fx, f))!r}",
        f"next_down  = {float(next_down(fx, f))!r}",
        f"next_up    = {float(next_up(fx, f))!r}",
    ]
    panel = TextPanel("\n".join(lines))
    gap_down = fx - float(next_down(fx, f))
    lo, hi = fx - 3.5 * gap_down, fx + 3.5 * gap_up
    fig, ax = _figure(3.2)
    plot_number_line(f, lo, hi, x=v, mode=mode, ax=ax)
    return panel, fig


def _as_image(fig: Figure):
    """The figure as a PNG image object: displays the same in every front end, whether or not
    a matplotlib backend has registered its own Figure formatter yet."""
    from IPython.display import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return Image(data=buf.getvalue(), format="png")


def _display(obj, handle=None):
    from IPython.display import display

    if isinstance(obj, Figure):
        obj = _as_image(obj)
    if handle is None:
        return display(obj, display_id=True)
    handle.update(obj)
    return handle


BIT_GRID: dict[str, tuple] = {
    "value": (0.1, 0.3, 1000.0),
    "fmt": ("float32", "tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"),
    "mode": ("nearest_even", "toward_zero"),
}


def bit_explorer(value: float = 0.1, fmt="bfloat16", mode: str = "nearest_even"):
    """interactive(bit_view, BIT_GRID, ...): fl(value) in fmt with mode, over BIT_GRID."""
    return interactive(bit_view, BIT_GRID, value=value, fmt=get_format(fmt).name, mode=mode)


# --------------------------------------------------------------------------- crossings


def crossing_view(w: float = 1.0, lr: float = 1e-5, fmt="bfloat16") -> tuple[TextPanel, Figure]:
    """Exact, estimated and simulated steps until fl(w + k·lr) changes, with the trajectory."""
    w0 = _check_value(w, "w")
    lr0 = _check_value(lr, "lr")
    f = _check_fmt(fmt)
    if f.name == "float64":
        raise ValueError(
            "fmt must be narrower than float64; valid choices: "
            + ", ".join(n for n in FORMATS if n != "float64")
        )
    if lr0 == 0:
        raise ValueError("lr must be nonzero; got lr=0.0")
    start = float(round_to(w0, f))
    k = steps_to_cross(start, lr0, f)
    if k > _MAX_TRAJECTORY_STEPS:
        raise ValueError(
            f"w={w0!r}, lr={lr0!r} needs {k} steps in {f.name}; the explorer draws at most "
            f"{_MAX_TRAJECTORY_STEPS} (raise lr or lower |w|)"
        )
    est = steps_to_cross_estimate(start, lr0, f)
    sim = simulate_crossing(start, lr0, max(2 * k, 10), f)
    lines = [
        f"w = fl({w0!r}) = {start!r} in {f.name}, lr = {lr0!r}",
        f"exact steps to first change   : {k}",
        f"estimate |W|/(2^p·lr), p = {f.precision:<2}: {est:.1f}",
        f"float32-master simulation     : {sim}",
    ]
    n_steps = int(min(max(2.3 * k, 12), _MAX_TRAJECTORY_STEPS))
    fig, ax = _figure(3.6)
    plot_crossing_trajectory(start, lr0, n_steps, f, ax=ax)
    return TextPanel("\n".join(lines)), fig


CROSSING_GRID: dict[str, tuple] = {
    "w": (0.25, 1.0, 4.0),
    "lr": (1e-6, 1e-5, 1e-4, 1e-3),
    "fmt": ("bfloat16", "float16", "float8_e5m2"),
}


def crossing_explorer(w: float = 1.0, lr: float = 1e-5, fmt="bfloat16"):
    """interactive(crossing_view, CROSSING_GRID, ...): steps until fl(w + k·lr) moves."""
    return interactive(crossing_view, CROSSING_GRID, w=w, lr=lr, fmt=get_format(fmt).name)



# --------------------------------------------------------------------------- reduction orders

__all__ += ["REDUCTION_GRID", "reduction_data", "reduction_explorer", "reduction_view"]

_REDUCTION_ACCUMULATORS = ("float16", "bfloat16", "tf32", "float32")
_REDUCTION_BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)


def reduction_data(n: int = 256, seed: int = 0):
    """The explorer's vector: n positive float16 values in [0.25, 1), drawn from default_rng(seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return np.asarray(round_to(rng.uniform(0.25, 1.0, n), "float16"), dtype=np.float64)


def reduction_view(order: str = "atomic", acc="float16", block: int = 1, margin: float = 1e-3,
                   n: int = 256, runs: int = 2000, seed: int = 0) -> tuple[TextPanel, Figure]:
    """Sums of one vector in `order` with an `acc` accumulator, against tol = S (1 + margin)."""
    import numpy as np

    from .gpu import ORDERS, exact_sum, flip_probability, reduce_sum

    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid choices: {', '.join(ORDERS)}")
    f = _check_fmt(acc)
    if block not in _REDUCTION_BLOCKS:
        raise ValueError(f"block must be one of {_REDUCTION_BLOCKS}; got block={block!r}")
    m = _check_value(margin, "margin")
    if m == 0 or abs(m) >= 1:
        raise ValueError(f"margin must be nonzero and below 1 in size; got margin={m!r}")
    x = reduction_data(n, seed)
    exact = float(exact_sum(x))
    tol = exact * (1 + m)
    lanes = runs if order == "atomic" else 1  # every other order gives one answer
    sums = np.atleast_1d(reduce_sum(np.broadcast_to(x, (lanes, n)), order, f, block=block,
                                    rng=np.random.default_rng(seed)))
    flip = float(flip_probability(sums, exact, m))
    u = float(ulp(exact, f))
    lines = [
        f"{n} float16 values, order={order!r}, block={block}, {f.name} accumulator",
        f"exact sum S = {exact:.10g}",
        f"tol = S (1 {'+' if m > 0 else '-'} {abs(m):.1e}) = {tol:.10g}",
        f"exact decision: S < tol is {exact < tol} ({'stop' if exact < tol else 'continue'})",
        f"{lanes} run(s): {np.unique(sums).size} distinct sum(s), "
        f"{(sums.min() - exact) / u:+.1f} to {(sums.max() - exact) / u:+.1f} ulps from S",
        f"decision flipped in {flip:.1%} of runs",
    ]
    fig, ax = _figure(3.8)
    from .plotting import plot_sum_outcomes

    plot_sum_outcomes(sums, exact, tol, f, title=f"{order} order, {f.name} accumulator", ax=ax)
    return TextPanel("\n".join(lines)), fig


REDUCTION_GRID: dict[str, tuple] = {
    "order": ("sequential", "pairwise", "blocked", "warp", "split_k", "atomic", "kahan"),
    "acc": ("float16", "bfloat16", "float32"),
    "block": (1, 16),
}


def reduction_explorer(order: str = "atomic", acc="float16", block: int = 1, margin: float = 1e-3):
    """interactive(reduction_view, REDUCTION_GRID, ...): order x accumulator x block, margin fixed."""
    return interactive(reduction_view, REDUCTION_GRID, order=order, acc=get_format(acc).name,
                       block=block, margin=margin)


# --------------------------------------------------------------------------- phantom clipping (chapter 6)


def phantom_view(engine: str = "bf16", trainer: str = "fp32", eps: float = 0.2,
                 lr: float = 5e-5, steps: int = 25, seed: int = 0) -> tuple[TextPanel, Figure]:
    """A short GRPO run (rl.train) and its matched partner (trainer = engine): reward and clipping per step."""
    from .plotting import plot_run_metric
    from .rl import PolicyConfig, RunConfig, train, with_changes

    run = RunConfig(trainer=trainer, engine=engine, lr=_check_value(lr, "lr"),
                    eps_low=_check_value(eps, "eps"), eps_high=_check_value(eps, "eps"),
                    steps=int(steps))  # RunConfig names the valid choices on bad input
    cfg = PolicyConfig()
    log = train(cfg, run, seed=seed, progress=False)
    # The matched partner (trainer = engine, same seed and eps): the convergence contrast.
    ref = log if trainer == engine else train(cfg, with_changes(run, trainer=engine),
                                              seed=seed, progress=False)
    early = slice(0, min(5, steps))
    lines = [
        f"{trainer} trainer, {engine} engine, eps {eps:g}, lr {lr:g}, {steps} steps",
        f"reaches -2 at step: {log.steps_to(-2.0)} (matched {engine} trainer: "
        f"{ref.steps_to(-2.0)}; None = not within {steps} steps)",
        f"first 5 steps: mean |beta| {log.beta_abs[early].mean():.3f}, "
        f"clipped {log.clip[early].mean():.1%}",
        f"               (phantom {log.phantom[early].mean():.1%}, "
        f"legitimate {log.legitimate[early].mean():.1%})",
        f"mean reward  : {log.reward[early].mean():.2f} in the first 5 steps, "
        f"{log.reward[-5:].mean():.2f} in the last 5",
    ]
    fig = Figure(figsize=(9.0, 3.4))
    ax_r, ax_c = fig.subplots(1, 2)
    plot_run_metric({f"{trainer} trainer": log, f"{engine} trainer (matched)": ref}, "reward",
                    ax=ax_r, ylabel="mean reward (-length)",
                    styles={f"{engine} trainer (matched)": {"color": "#999999", "ls": "--"}})
    ax_r.axhline(-2, color="#999999", lw=1, ls=":")
    ax_r.set_ylim(-cfg.max_len - 0.5, 0)
    ax_r.legend(loc="lower right", fontsize=8.5)
    ax_c.plot(log.clip, label="all clipped", color="#555555")
    ax_c.plot(log.phantom, label="phantom", color="#D55E00")
    ax_c.set_ylim(bottom=0)
    ax_c.set_xlabel("optimizer step")
    ax_c.set_ylabel("fraction of tokens")
    ax_c.set_title("Tokens in a dead zone")
    ax_c.legend()
    fig.tight_layout()
    return TextPanel("\n".join(lines)), fig


PHANTOM_GRID: dict[str, tuple] = {"eps": (0.05, 0.2, 10.0)}  # each frame trains a run


def phantom_explorer(engine: str = "bf16", trainer: str = "fp32", eps: float = 0.2,
                     lr: float = 5e-5, steps: int = 25, seed: int = 0):
    """interactive(phantom_view, PHANTOM_GRID, ...): the clip range eps moves; the rest is fixed."""
    return interactive(phantom_view, PHANTOM_GRID, engine=engine, trainer=trainer, eps=eps,
                       lr=lr, steps=steps, seed=seed)


__all__ += ["PHANTOM_GRID", "phantom_explorer", "phantom_view"]


# --------------------------------------------------------------------------- underflow and loss scaling (chapters 4 and 5)

__all__ += ["SCALING_GRID", "UNDERFLOW_GRID", "scaling_explorer", "scaling_view",
            "underflow_explorer", "underflow_view"]

_UNDERFLOW_FORMATS = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float32")


def underflow_view(attenuation: float = 0.82, depth: int = 96, fmt="float16", g0: float = 1.0,
                   network: bool = False, seed: int = 0) -> tuple[TextPanel, Figure]:
    """The attenuation model g0·a^k over depth with fmt's floors; optionally the real network's signal too."""
    import numpy as np

    from .plotting import FORMAT_COLORS, legend_outside, plot_attenuation_model
    from .underflow import (
        NETWORK_FORMATS,
        AttenuatingNet,
        first_underflow_depth,
        fit_g0,
        make_batch,
        measured_underflow_depth,
        probe_gradients,
    )

    a = _check_value(attenuation, "attenuation")
    if not 0 < a < 1:
        raise ValueError(f"attenuation must be in (0, 1); got attenuation={a!r}")
    if int(depth) != depth or not 2 <= depth <= 400:
        raise ValueError(f"depth must be an integer in [2, 400]; got depth={depth!r}")
    f = _check_fmt(fmt)
    g = _check_value(g0, "g0")
    if g <= 0:
        raise ValueError(f"g0 must be > 0; got g0={g!r}")
    depth = int(depth)

    def say(k):
        return f"{k}" if k is not None and k < depth else f"none within {depth} layers"

    head = f"a = {a:g}, {depth} layers, {f.name}, gradient at the last layer g0 = {g:.3g}"
    if network:
        if f.name not in NETWORK_FORMATS:
            raise ValueError(f"the network runs only in {', '.join(NETWORK_FORMATS)}; "
                             f"got fmt={f.name!r}")
        probes = {name: probe_gradients(AttenuatingNet(depth, 64, a, name, seed),
                                        *make_batch(64, 16, name, seed))
                  for name in dict.fromkeys(("float32", f.name))}
        g = fit_g0(probes["float32"], a)  # the network sets g0; the slider value is not used
        head = f"a = {a:g}, {depth} layers, {f.name}; g0 fitted to the float32 network: {g:.3g}"
    lines = [head]
    for floor, what in (("normal", "below the smallest normal"),
                        ("subnormal", "below the smallest subnormal"),
                        ("zero", "rounds to exactly 0")):
        lines.append(f"model, first depth {what:<28}: {say(first_underflow_depth(a, f, g, floor))}")
    if network:
        lines.append(f"network, first depth with >= half zeros in dL/dh : "
                     f"{say(measured_underflow_depth(probes[f.name]))}")
    fig, ax = _figure(4.0)
    plot_attenuation_model(a, depth, f, g, ax=ax)
    if network:
        med = probes[f.name].signal.median_abs
        ax.plot(np.arange(depth), np.where(med > 0, med, np.nan), color=FORMAT_COLORS[f.name],
                lw=1.2, marker=".", ms=4, label=f"network median |dL/dh|, {f.name}")
        legend_outside(ax)
    return TextPanel("\n".join(lines)), fig


UNDERFLOW_GRID: dict[str, tuple] = {
    "attenuation": (0.7, 0.8, 0.82, 0.9, 0.95),
    "fmt": ("float16", "bfloat16", "float32"),
    "network": (False, True),
}


def underflow_explorer(attenuation: float = 0.82, depth: int = 96, fmt="float16",
                       g0: float = 1.0, network: bool = False):
    """interactive(underflow_view, UNDERFLOW_GRID, ...): attenuation x format x network overlay."""
    return interactive(underflow_view, UNDERFLOW_GRID, attenuation=attenuation, depth=depth,
                       fmt=get_format(fmt).name, g0=g0, network=network)


def scaling_view(growth_interval: int = 50, spike_rate: float = 0.01,
                 init_scale: float = 2.0**16, steps: int = 600, fmt="float16",
                 seed: int = 0) -> tuple[TextPanel, Figure]:
    """Dynamic loss scaling over scaling.gradient_stream: the scale, skipped steps, scaled max |g| vs fmt's max."""
    import numpy as np

    from .plotting import FORMAT_COLORS, PALETTE, legend_outside, plot_scale_history
    from .scaling import (
        gradient_stream,
        largest_safe_gradient,
        smallest_surviving_gradient,
        trace_dynamic_scaling,
    )

    f = _check_fmt(fmt)
    if int(growth_interval) != growth_interval or growth_interval < 1:
        raise ValueError(f"growth_interval must be a positive integer; got {growth_interval!r}")
    g = gradient_stream(int(steps), spike_rate=_check_value(spike_rate, "spike_rate"), seed=seed)
    hist = trace_dynamic_scaling(g, f, init_scale=_check_value(init_scale, "init_scale"),
                                 growth_interval=int(growth_interval))
    final = float(hist.scale[-1])
    lines = [
        f"{steps} steps, growth_interval = {growth_interval}, init scale 2^{np.log2(init_scale):g},"
        f" {f.name}",
        f"skipped steps (overflow): {hist.skipped.sum()}; scale grew {hist.growth_steps.size} times",
        f"scale: min 2^{np.log2(hist.scale.min()):g}, max 2^{np.log2(hist.scale.max()):g}, "
        f"final 2^{np.log2(final):g}",
        f"at the final scale: gradients from {smallest_surviving_gradient(final, f):.2g} "
        f"to {largest_safe_gradient(final, f):.2g} survive",
    ]
    fig = Figure(figsize=(7.5, 6.6))
    ax_s, ax_g = fig.subplots(2, 1, sharex=True)
    plot_scale_history({"dynamic scale": hist}, ax=ax_s)
    k = np.arange(g.size)
    ax_g.plot(k, g * hist.scale, lw=1, color=PALETTE["blue"], label="largest |g| · scale")
    ax_g.axhline(f.max_finite, color=FORMAT_COLORS.get(f.name, "k"), ls="--",
                 label=f"{f.name} max {f.max_finite:g}")
    sk = hist.skipped_steps
    ax_g.plot(sk, (g * hist.scale)[sk], "x", color=PALETTE["vermillion"], label="overflow")
    ax_g.set_yscale("log")
    ax_g.set_xlabel("step")
    ax_g.set_ylabel("scaled gradient")
    ax_g.set_title("Headroom below overflow")
    legend_outside(ax_g)
    fig.tight_layout()
    return TextPanel("\n".join(lines)), fig


SCALING_GRID: dict[str, tuple] = {
    "growth_interval": (10, 50, 200),
    "spike_rate": (0.0, 0.01, 0.05),
    "init_scale": (2.0**8, 2.0**16),
}


def scaling_explorer(growth_interval: int = 50, spike_rate: float = 0.01,
                     init_scale: float = 2.0**16, steps: int = 600):
    """interactive(scaling_view, SCALING_GRID, ...): growth interval x spike rate x initial scale."""
    return interactive(scaling_view, SCALING_GRID, growth_interval=growth_interval,
                       spike_rate=spike_rate, init_scale=init_scale, steps=steps)


# --------------------------------------------------------------------------- interactive: live controls or precomputed frames

__all__ += ["MAX_FRAMES", "STATIC_BUDGET_BYTES", "Interactive", "interactive"]

MAX_FRAMES = 48                 # views one static control may carry (the grid's product)
STATIC_BUDGET_BYTES = 1_000_000  # bytes one static control may add to a page (a chapter may have two)
FRAME_DPI = 100                 # 7 in wide figures -> 700 px, the width of the book's text column
FRAME_COLORS = 96               # palette size of the quantised PNG frames


def _frame_png(fig: Figure, dpi: int = FRAME_DPI) -> bytes:
    """The figure as a palette PNG (FRAME_COLORS colours): 3-4 times smaller than full colour."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    rgb = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba()).convert("RGB")
    buf = io.BytesIO()
    rgb.quantize(colors=FRAME_COLORS, method=Image.Quantize.MEDIANCUT).save(
        buf, format="PNG", optimize=True)
    return buf.getvalue()


def _label(value) -> str:
    """How a grid value is shown on a control: names for formats, %g for numbers."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        return f"{value:g}"
    return str(getattr(value, "name", value))


def _same(a, b) -> bool:
    """Grid membership: equal and of the same kind (True is not the grid value 1)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _check_grid(view, grid, defaults) -> tuple[list[str], list[tuple], dict]:
    """(names, values per name, fixed keyword arguments) after checking grid and defaults."""
    import inspect

    if not callable(view):
        raise ValueError(f"view must be callable; got view={view!r}")
    sig = inspect.signature(view)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    known = [n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for where, names in (("grid", list(grid)), ("default", list(defaults))):
        for name in names:
            if not takes_any and name not in known:
                raise ValueError(f"{where} parameter {name!r} is not a parameter of "
                                 f"{getattr(view, '__name__', 'view')}; valid choices: "
                                 + ", ".join(known))
    if not grid:
        raise ValueError("grid must name at least one parameter; got grid={}")
    names, values = [], []
    for name, choices in grid.items():
        if isinstance(choices, (str, bytes)) or not hasattr(choices, "__len__"):
            raise ValueError(f"grid[{name!r}] must be a list of values; got {choices!r}")
        choices = tuple(choices)
        if not choices:
            raise ValueError(f"grid[{name!r}] must hold at least one value; got []")
        labels = [_label(v) for v in choices]
        if len(set(labels)) != len(labels):
            raise ValueError(f"grid[{name!r}] repeats a value; got {list(choices)!r}")
        names.append(name)
        values.append(choices)
    size = math.prod(len(v) for v in values)
    if size > MAX_FRAMES:
        shape = " x ".join(f"{n} {len(v)}" for n, v in zip(names, values, strict=True))
        raise ValueError(f"grid has {size} frames ({shape}); at most {MAX_FRAMES} fit a page: "
                         "shorten a list")
    fixed = {}
    for name, value in defaults.items():
        if name in grid:
            choices = values[names.index(name)]
            if not any(_same(value, c) for c in choices):
                raise ValueError(f"{name}={value!r} is not in the grid; valid choices: "
                                 + ", ".join(_label(c) for c in choices))
        else:
            fixed[name] = value
    return names, values, fixed


def _panel_html(panel) -> str:
    return panel._repr_html_() if hasattr(panel, "_repr_html_") else f"<pre>{html.escape(str(panel))}</pre>"


_STATIC_CSS = (
    ".pl-interactive{border:1px solid #ddd;border-radius:6px;padding:.6em .8em;margin:.6em 0}"
    ".pl-interactive .pl-controls{display:flex;flex-wrap:wrap;gap:.4em 1.4em;margin-bottom:.3em}"
    ".pl-interactive label{display:inline-flex;align-items:center;gap:.45em;font-size:.9em}"
    ".pl-interactive .pl-name{font-family:monospace;font-weight:bold}"
    ".pl-interactive output{font-family:monospace;min-width:4.5em}"
    ".pl-interactive img{max-width:100%;height:auto;display:block}"
    ".pl-interactive .pl-note{font-size:.8em;color:#666;margin:.2em 0 0}"
)

# Switches precomputed frames: no kernel, no network. The fragment #<id>--<name>-<index>...
# selects a view (a shareable link); it uses only [A-Za-z0-9_-], so themes that hand
# location.hash to querySelector do not throw.
_STATIC_JS = """(function () {
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
        var k = get(i);
        flat = flat * data.labels[i].length + k;
        parts.push(data.names[i] + "-" + k);
        said.push(data.names[i] + " = " + data.labels[i][k]);
        var out = root.querySelector("output[data-pl-for='" + data.names[i] + "']");
        if (out) { out.textContent = data.labels[i][k]; }
      }
      var frame = data.frames[flat];
      panel.innerHTML = data.panels[frame[1]];
      if (img) {
        var src = data.images[frame[0]];
        img.style.display = src ? "" : "none";
        if (src) { img.src = src; img.alt = data.title + ": " + said.join(", "); }
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
})();"""


class Interactive:
    """One output for view(**params): ipywidgets controls in a live front end, and a
    self-contained HTML control switching frames precomputed over the grid elsewhere.

    `_repr_mimebundle_` carries both, and the front end picks: Jupyter, Colab and VS Code
    render application/vnd.jupyter.widget-view+json first (live controls that call view);
    the book's HTML build is told (_config.yml, nb_mime_priority_overrides) to drop that
    type and so renders text/html (the frame switcher), as do viewers without a kernel.
    """

    def __init__(self, view, grid, **defaults):
        names, values, fixed = _check_grid(view, grid, defaults)
        self.view = view
        self.names = names
        self.grid = dict(zip(names, values, strict=True))
        self.fixed = fixed
        chosen = {}
        import inspect

        sig = inspect.signature(view).parameters
        for name, choices in self.grid.items():
            if name in defaults:
                chosen[name] = next(c for c in choices if _same(defaults[name], c))
            elif name in sig and any(_same(sig[name].default, c) for c in choices):
                chosen[name] = sig[name].default
            else:
                chosen[name] = choices[0]
        self.params = chosen
        self.title = getattr(view, "__name__", "view")
        self.default_panel, default_fig = view(**self.fixed, **chosen)  # bad input raises here
        self._default_png = _frame_png(default_fig)
        self._frames = None
        self._html = None
        self._widget = None
        self.controls: dict = {}

    # ---------------------------------------------------------------- static frames

    @property
    def size(self) -> int:
        """Number of grid points (frames before de-duplication)."""
        return math.prod(len(v) for v in self.grid.values())

    def _index(self, params: dict) -> tuple[int, ...]:
        return tuple(next(k for k, c in enumerate(self.grid[n]) if _same(params[n], c))
                     for n in self.names)

    def frames(self) -> dict:
        """{'frames': [(image id, panel id)] in row-major grid order, 'images': [png bytes or
        None], 'panels': [html]}: every grid point's view, identical pictures stored once."""
        if self._frames is not None:
            return self._frames
        import itertools

        images, panels, frames = [], [], []
        image_ids, panel_ids = {}, {}
        default_index = self._index(self.params)
        for index in itertools.product(*(range(len(self.grid[n])) for n in self.names)):
            params = {n: self.grid[n][k] for n, k in zip(self.names, index, strict=True)}
            if index == default_index:
                panel_html, png = _panel_html(self.default_panel), self._default_png
            else:
                try:
                    panel, fig = self.view(**self.fixed, **params)
                    panel_html, png = _panel_html(panel), _frame_png(fig)
                except ValueError as err:  # outside the view's domain: say so in the frame
                    panel_html, png = _panel_html(TextPanel(str(err), error=True)), None
            frames.append((image_ids.setdefault(png, len(image_ids)),
                           panel_ids.setdefault(panel_html, len(panel_ids))))
            if len(image_ids) > len(images):
                images.append(png)
            if len(panel_ids) > len(panels):
                panels.append(panel_html)
        self._frames = {"frames": frames, "images": images, "panels": panels}
        return self._frames

    @property
    def element_id(self) -> str:
        """The control's HTML id: stable while view, grid and defaults stay the same."""
        import hashlib
        import re

        key = repr((self.title, [(n, [_label(v) for v in self.grid[n]]) for n in self.names],
                    sorted((n, _label(v)) for n, v in {**self.fixed, **self.params}.items())))
        stem = re.sub(r"[^A-Za-z0-9]+", "-", self.title.removesuffix("_view")).strip("-")
        return f"pl-{stem}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"

    def static_html(self) -> str:
        """Self-contained HTML: controls, the default view, frames as data: URIs and the script."""
        if self._html is not None:
            return self._html
        import base64
        import json

        data = self.frames()
        uid = self.element_id
        labels = [[_label(v) for v in self.grid[n]] for n in self.names]
        start = self._index(self.params)
        checkbox = []
        parts = [f'<div class="pl-interactive" id="{uid}" data-pl-frames="{self.size}">',
                 f"<style>{_STATIC_CSS}</style>", '<form class="pl-controls" onsubmit="return false">']
        for i, name in enumerate(self.names):
            values, k0 = self.grid[name], start[i]
            esc = html.escape(name)
            if len(values) == 2 and {type(v) for v in values} == {bool}:
                checkbox.append([values.index(False), values.index(True)])
                parts.append(f'<label><input type="checkbox" data-pl-param="{esc}"'
                             f'{" checked" if values[k0] else ""}> <span class="pl-name">{esc}</span>'
                             "</label>")
                continue
            checkbox.append(None)
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                parts.append(f'<label><span class="pl-name">{esc}</span><input type="range" min="0" '
                             f'max="{len(values) - 1}" step="1" value="{k0}" data-pl-param="{esc}" '
                             f'aria-label="{esc}"><output data-pl-for="{esc}">'
                             f"{html.escape(labels[i][k0])}</output></label>")
            else:
                options = "".join(f'<option value="{k}"{" selected" if k == k0 else ""}>'
                                  f"{html.escape(lab)}</option>" for k, lab in enumerate(labels[i]))
                parts.append(f'<label><span class="pl-name">{esc}</span><select data-pl-param="{esc}">'
                             f"{options}</select></label>")
        parts.append("</form>")
        flat0 = 0
        for i, n in enumerate(self.names):
            flat0 = flat0 * len(self.grid[n]) + start[i]
        img0, panel0 = data["frames"][flat0]
        parts.append(f'<div class="pl-panel" aria-live="polite">{data["panels"][panel0]}</div>')
        said = ", ".join(f"{n} = {labels[i][start[i]]}" for i, n in enumerate(self.names))
        png0 = data["images"][img0]
        parts.append(f'<img class="pl-frame" alt="{html.escape(self.title)}: {html.escape(said)}" '
                     f'src="data:image/png;base64,{base64.b64encode(png0).decode()}">')
        images = ["" if k == img0 else
                  (None if png is None else "data:image/png;base64," + base64.b64encode(png).decode())
                  for k, png in enumerate(data["images"])]
        payload = {"id": uid, "title": self.title, "names": self.names, "labels": labels,
                   "checkbox": checkbox, "frames": data["frames"], "images": images,
                   "panels": data["panels"]}
        blob = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<p class="pl-note">{self.size} precomputed views ({len(images)} distinct '
                     "figures); run the notebook for live controls.</p>")
        parts.append(f'<script type="application/json" class="pl-data">{blob}</script>')
        parts.append(f"<script>{_STATIC_JS}</script></div>")
        self._html = "".join(parts)
        if len(self._html.encode()) > STATIC_BUDGET_BYTES:
            raise ValueError(f"the static control for {self.title} takes {len(self._html.encode())} "
                             f"bytes, over the page budget of {STATIC_BUDGET_BYTES}: shorten the grid")
        return self._html

    # ---------------------------------------------------------------- live controls

    def widget(self):
        """The live ipywidgets form (7.x and 8.x): controls over the grid's values, the text
        panel and the figure, recomputed by view on every change."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as wd

        for name in self.names:
            values = self.grid[name]
            options = [(_label(v), v) for v in values]
            if len(values) == 2 and {type(v) for v in values} == {bool}:
                box = wd.Checkbox(value=self.params[name], description=name)
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                box = wd.SelectionSlider(options=options, value=self.params[name],
                                         description=name, continuous_update=False)
            else:
                box = wd.Dropdown(options=options, value=self.params[name], description=name)
            self.controls[name] = box
        panel = wd.HTML(value=_panel_html(self.default_panel))
        image = wd.Image(value=self._default_png, format="png")

        def redraw(_change=None):
            params = {n: box.value for n, box in self.controls.items()}
            try:
                text, fig = self.view(**self.fixed, **params)
            except ValueError as err:  # outside the view's domain: say so, hide the figure
                panel.value = _panel_html(TextPanel(str(err), error=True))
                image.layout.display = "none"
                return
            panel.value = _panel_html(text)
            image.value = _frame_png(fig)
            image.layout.display = None

        for box in self.controls.values():
            box.observe(redraw, names="value")
        row = wd.HBox(list(self.controls.values()), layout=wd.Layout(flex_flow="row wrap"))
        self._widget = wd.VBox([row, panel, image])
        return self._widget

    # ---------------------------------------------------------------- display

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": repr(self)}
        if (include is None or "text/html" in include) and "text/html" not in (exclude or ()):
            bundle["text/html"] = self.static_html()  # the frames are computed here, once
        try:
            from IPython import get_ipython

            in_kernel = getattr(get_ipython(), "kernel", None) is not None
        except ImportError:
            in_kernel = False
        if in_kernel:  # a front end is (or may be) listening: offer the live controls too
            box = self.widget()
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2, "version_minor": 0, "model_id": box.model_id}
        return bundle

    def __repr__(self) -> str:
        shape = " x ".join(f"{n} ({len(v)})" for n, v in self.grid.items())
        return (f"{self.title} over {shape}; shown: "
                + ", ".join(f"{n}={_label(v)}" for n, v in self.params.items())
                + f"\n{self.default_panel!r}")


def interactive(view, grid, **defaults) -> Interactive:
    """Show view(**params) for params in the product of grid's value lists: live ipywidgets in a
    kernel front end, a self-contained frame switcher (no kernel, no network) in static HTML."""
    return Interactive(view, grid, **defaults)


# --------------------------------------------------------------------------- the bouncing ball (chapter 3)

__all__ += ["WORLD_GRID", "world_explorer", "world_scenes", "world_view"]


def world_scenes(scenes: int = 16, balls: int = 16, seed: int = 0):
    """The explorer's drop heights: (scenes, balls) uniform in [0.3, 1.5) m from default_rng(seed)."""
    import numpy as np

    return np.random.default_rng(seed).uniform(0.3, 1.5, (scenes, balls))


def world_view(tol: float = 1e-3, policy: str = "low_precision", horizon: int = 120,
               reduce_fmt="bfloat16", scenes: int = 16, balls: int = 16,
               seed: int = 0) -> tuple[TextPanel, Figure]:
    """Float32 drops of scenes x balls balls with projection contact: the stopping rule `policy`
    with reduce_fmt sums, beside the same rule with float32 sums (where the two differ)."""
    import numpy as np

    from .plotting import plot_solver_passes
    from .world import World, rollout

    steps = int(horizon) if not isinstance(horizon, bool) and float(horizon) == int(horizon) else 0
    if steps < 1:
        raise ValueError(f"horizon must be a whole number of steps >= 1; got horizon={horizon!r}")
    y0 = world_scenes(scenes, balls, seed)
    low = World(fmt="float32", reduce_fmt=reduce_fmt, policy=policy, tol=_check_value(tol, "tol"))
    wide = low.with_(reduce_fmt="float32")
    run = rollout(low, y0, 1.0, steps, loss="height")
    sums = policy in ("low_precision", "hysteresis") and low.accumulator != wide.accumulator
    same = rollout(wide, y0, 1.0, steps, loss="height") if sums else run
    differ = np.flatnonzero((run.iterations != same.iterations).any(axis=0))
    scale = np.abs(same.grad).max()
    rel = float(np.abs(run.grad - same.grad).max() / scale) if scale > 0 else 0.0
    what = "per-ball tests, no sum" if policy == "per_instance" else f"{low.accumulator} sums"
    lines = [
        f"{scenes} scenes x {balls} balls dropped, float32 state, tol {low.tol:g}, {steps} steps",
        f"stopping rule {policy} ({what})"
        + (f", exit tolerance {low.exit_tol:g}" if policy == "hysteresis" else ""),
        f"solver passes: {int(run.total_iterations.sum())}, "
        f"stops on max_iter: {int((run.stop == 'max_iter').sum())}",
        f"decisions the exact sum would reverse: {int(run.flips.sum())}",
    ]
    if sums:
        lines.append(f"scenes whose iteration history differs with float32 sums: {differ.size} of "
                     f"{scenes}; largest change of dL/dk: {rel:.1e} of max |dL/dk|")
    fig, ax = _figure(3.4)
    curves = {f"{policy}, {what}": run.iterations}
    if sums:
        curves[f"{policy}, float32 sums"] = same.iterations
    plot_solver_passes(curves, flips=run.flips, ax=ax)
    return TextPanel("\n".join(lines)), fig


WORLD_GRID: dict[str, tuple] = {
    "tol": (3e-4, 1e-3),
    "policy": ("low_precision", "float32", "per_instance", "hysteresis"),
    "horizon": (40, 120),
}


def world_explorer(tol: float = 1e-3, policy: str = "low_precision", horizon: int = 120):
    """interactive(world_view, WORLD_GRID, ...): tolerance x stopping policy x horizon."""
    return interactive(world_view, WORLD_GRID, tol=tol, policy=policy, horizon=horizon)


# --------------------------------------------------------------------------- when allclose fails (chapter 7)

__all__ += ["ALLCLOSE_GRID", "allclose_explorer", "allclose_view"]


def allclose_view(k: int = 4096, fmt: str = "float32", bug: float = 0.0) -> tuple[TextPanel, Figure]:
    """A 4 x k x 4 matmul in fmt with a bug of size bug * mean|C| at C[0, 0], against a float64
    reference: the structure-aware and order-oblivious bounds, the error, and each method's verdict."""
    import numpy as np

    from .intervals import injected_bug
    from .plotting import plot_bound_bands

    c = injected_bug(k, fmt, bug)
    s, o = c.structure, c.oblivious
    i = c.index
    names = {"structure": "structure-aware interval", "oblivious": "order-oblivious rule",
             "high_precision": "high-precision re-execution"}
    truth = "Type-II (bug)" if bug > 0 else "Type-I (round-off)"
    lines = [
        f"C = A B, A 4 x {k}, B {k} x 4, {c.kernel.describe()}",
        f"injected bug: C[0, 0] += {bug:g} mean|C|   truth: {truth}",
        f"allclose(target, float64 reference) with {fmt} tolerances: "
        + ("passes" if c.passes_allclose else "fails"),
        f"at C[0, 0]: |target - reference| = {c.error:.3g}",
        f"  structure-aware bound  +-{float(s.width[i]) / 2:.3g}",
        f"  order-oblivious bound  +-{float(o.width[i]) / 2:.3g}",
    ]
    lines += [f"{names[m]:>28}: {v}" for m, v in c.verdicts.items()]
    fig, ax = _figure(3.3)
    plot_bound_bands(c.reference - c.target, (s.lo - c.target, s.hi - c.target),
                     (o.lo - c.target, o.hi - c.target), ax=ax,
                     title=f"k = {k}, {fmt}, bug = {bug:g}")
    ax.set_xticks(np.arange(c.target.size))
    ax.set_xticklabels([f"{r}{q}" for r in range(4) for q in range(4)], fontsize=7)
    ax.set_xlabel("output element C[i, j] (ij)")
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)  # inside: the frame has no room beside
    fig.set_layout_engine("none")  # fixed margins: a layout pass per frame costs more than the model
    fig.subplots_adjust(left=0.13, right=0.98, bottom=0.19, top=0.9)
    return TextPanel("\n".join(lines)), fig


ALLCLOSE_GRID: dict[str, tuple] = {
    "k": (256, 4096),
    "fmt": ("float32", "tf32", "bfloat16", "float16"),
    "bug": (0.0, 0.001, 0.1),
}


def allclose_explorer(k: int = 4096, fmt: str = "float32", bug: float = 0.0):
    """interactive(allclose_view, ALLCLOSE_GRID, ...): inner dimension x format x injected bug size."""
    return interactive(allclose_view, ALLCLOSE_GRID, k=k, fmt=fmt, bug=bug)
