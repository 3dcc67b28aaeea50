"""Thin ipywidgets wrappers around `rounding`, `updates` and `plotting` (imported only by notebooks).

Each explorer first displays its default view as ordinary output (text and a figure), so
a page built without a kernel still shows it, and then returns the controls. Moving a
control redraws those same outputs in place through their display handles. The callbacks
only validate input and call the package's plain functions.
"""

from __future__ import annotations

import html
import io
import math

from matplotlib.figure import Figure

from .checks import check_choice
from .formats import FORMAT_NAMES, FORMATS, get_format
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


def bit_explorer(value: float = 0.1, fmt="bfloat16", mode: str = "nearest_even"):
    """Show bit_view(value, fmt, mode) now, then return controls that redraw it in place."""
    import ipywidgets as w

    panel, fig = bit_view(value, fmt, mode)  # validates before anything is shown
    h_text, h_fig = _display(panel), _display(fig)
    value_box = w.FloatText(value=float(value), description="x", step=0.01)
    fmt_box = w.Dropdown(options=list(FORMAT_NAMES), value=get_format(fmt).name,
                         description="format")
    mode_box = w.Dropdown(options=list(DETERMINISTIC_MODES), value=mode, description="mode")

    _live(lambda: bit_view(value_box.value, fmt_box.value, mode_box.value),
          (value_box, fmt_box, mode_box), (h_text, h_fig))
    return w.HBox([value_box, fmt_box, mode_box])


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


def crossing_explorer(w: float = 1.0, lr: float = 1e-5, fmt="bfloat16"):
    """Show crossing_view(w, lr, fmt) now, then return controls that redraw it in place."""
    import ipywidgets as wd

    panel, fig = crossing_view(w, lr, fmt)
    h_text, h_fig = _display(panel), _display(fig)
    w_box = wd.FloatText(value=float(w), description="w", step=0.1)
    lr_box = wd.FloatLogSlider(value=float(lr), base=10, min=-7, max=-1, step=0.25,
                               description="lr", readout_format=".1e")
    fmt_box = wd.Dropdown(options=[n for n in FORMAT_NAMES if n != "float64"],
                          value=get_format(fmt).name, description="format")

    _live(lambda: crossing_view(w_box.value, lr_box.value, fmt_box.value),
          (w_box, lr_box, fmt_box), (h_text, h_fig))
    return wd.HBox([w_box, lr_box, fmt_box])



# --------------------------------------------------------------------------- reduction orders

__all__ += ["reduction_data", "reduction_explorer", "reduction_view"]

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


def reduction_explorer(order: str = "atomic", acc="float16", block: int = 1, margin: float = 1e-3):
    """Show reduction_view(...) now, then return controls (order, accumulator, block, margin) that redraw it."""
    import ipywidgets as wd

    from .gpu import ORDERS

    panel, fig = reduction_view(order, acc, block, margin)
    h_text, h_fig = _display(panel), _display(fig)
    order_box = wd.Dropdown(options=list(ORDERS), value=order, description="order")
    acc_box = wd.Dropdown(options=list(_REDUCTION_ACCUMULATORS), value=get_format(acc).name,
                          description="accumulator")
    block_box = wd.SelectionSlider(options=list(_REDUCTION_BLOCKS), value=block, description="block")
    margin_box = wd.FloatLogSlider(value=float(margin), base=10, min=-6, max=-1, step=0.25,
                                   description="margin", readout_format=".1e")

    _live(lambda: reduction_view(order_box.value, acc_box.value, block_box.value, margin_box.value),
          (order_box, acc_box, block_box, margin_box), (h_text, h_fig))
    return wd.VBox([wd.HBox([order_box, acc_box]), wd.HBox([block_box, margin_box])])


# --------------------------------------------------------------------------- phantom clipping (chapter 6)


def phantom_view(engine: str = "bf16", trainer: str = "fp32", eps: float = 0.2,
                 lr: float = 5e-5, steps: int = 25, seed: int = 0) -> tuple[TextPanel, Figure]:
    """A short GRPO run (rl.train) with these precisions, clip range and lr: reward and clipping per step."""
    from .plotting import plot_run_metric
    from .rl import PolicyConfig, RunConfig, train

    run = RunConfig(trainer=trainer, engine=engine, lr=_check_value(lr, "lr"),
                    eps_low=_check_value(eps, "eps"), eps_high=_check_value(eps, "eps"),
                    steps=int(steps))  # RunConfig names the valid choices on bad input
    cfg = PolicyConfig()
    log = train(cfg, run, seed=seed, progress=False)
    early = slice(0, min(5, steps))
    lines = [
        f"{trainer} trainer, {engine} engine, eps {eps:g}, lr {lr:g}, {steps} steps",
        f"first 5 steps: mean |beta| {log.beta_abs[early].mean():.3f}, "
        f"clipped {log.clip[early].mean():.1%}",
        f"               (phantom {log.phantom[early].mean():.1%}, "
        f"legitimate {log.legitimate[early].mean():.1%})",
        f"mean reward  : {log.reward[early].mean():.2f} in the first 5 steps, "
        f"{log.reward[-5:].mean():.2f} in the last 5",
    ]
    fig = Figure(figsize=(9.0, 3.4))
    ax_r, ax_c = fig.subplots(1, 2)
    plot_run_metric({"reward": log}, "reward", ax=ax_r, ylabel="mean reward (-length)")
    ax_r.set_ylim(-cfg.max_len - 0.5, 0)
    ax_r.get_legend().remove()
    ax_c.plot(log.clip, label="all clipped", color="#555555")
    ax_c.plot(log.phantom, label="phantom", color="#D55E00")
    ax_c.set_ylim(bottom=0)
    ax_c.set_xlabel("optimizer step")
    ax_c.set_ylabel("fraction of tokens")
    ax_c.set_title("Tokens in a dead zone")
    ax_c.legend()
    fig.tight_layout()
    return TextPanel("\n".join(lines)), fig


def phantom_explorer(engine: str = "bf16", trainer: str = "fp32", eps: float = 0.2,
                     lr: float = 5e-5, steps: int = 25, seed: int = 0):
    """Show phantom_view(...) now, then return controls that rerun the short training and redraw it."""
    import ipywidgets as wd

    from .rl import PRECISIONS

    panel, fig = phantom_view(engine, trainer, eps, lr, steps, seed)
    h_text, h_fig = _display(panel), _display(fig)
    engine_box = wd.Dropdown(options=list(PRECISIONS), value=engine, description="engine")
    trainer_box = wd.Dropdown(options=list(PRECISIONS), value=trainer, description="trainer")
    eps_box = wd.FloatLogSlider(value=float(eps), base=10, min=-1.7, max=1, step=0.1,
                                description="epsilon", readout_format=".2g",
                                continuous_update=False)
    lr_box = wd.FloatLogSlider(value=float(lr), base=10, min=-6, max=-3, step=0.1,
                               description="lr", readout_format=".1e", continuous_update=False)

    _live(lambda: phantom_view(engine_box.value, trainer_box.value, eps_box.value,
                               lr_box.value, steps, seed),
          (engine_box, trainer_box, eps_box, lr_box), (h_text, h_fig))
    return wd.VBox([wd.HBox([engine_box, trainer_box]), wd.HBox([eps_box, lr_box])])


__all__ += ["phantom_explorer", "phantom_view"]


# --------------------------------------------------------------------------- underflow and loss scaling (chapters 4 and 5)

__all__ += ["scaling_explorer", "scaling_view", "underflow_explorer", "underflow_view"]

_UNDERFLOW_FORMATS = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float32")


def underflow_view(attenuation: float = 0.82, depth: int = 96, fmt="float16", g0: float = 1.0,
                   network: bool = False, seed: int = 0) -> tuple[TextPanel, Figure]:
    """The attenuation model g0·a^k over depth with fmt's floors; optionally the real network's signal too."""
    import numpy as np

    from .plotting import PALETTE, plot_attenuation_model
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
        ax.plot(np.arange(depth), np.where(med > 0, med, np.nan), color=PALETTE["orange"],
                lw=1.2, marker=".", ms=3, label=f"network median |dL/dh|, {f.name}")
        ax.legend(fontsize=8, loc="lower left")
    return TextPanel("\n".join(lines)), fig


def underflow_explorer(attenuation: float = 0.82, depth: int = 96, fmt="float16",
                       g0: float = 1.0, network: bool = False):
    """Show underflow_view(...) now, then return controls (attenuation, depth, format, g0, network)."""
    import ipywidgets as wd

    panel, fig = underflow_view(attenuation, depth, fmt, g0, network)
    h_text, h_fig = _display(panel), _display(fig)
    a_box = wd.FloatSlider(value=float(attenuation), min=0.5, max=0.99, step=0.01,
                           description="a", continuous_update=False)
    d_box = wd.IntSlider(value=int(depth), min=8, max=400, step=4, description="depth",
                         continuous_update=False)
    fmt_box = wd.Dropdown(options=list(_UNDERFLOW_FORMATS), value=get_format(fmt).name,
                          description="format")
    g_box = wd.FloatLogSlider(value=float(g0), base=10, min=-6, max=1, step=0.5,
                              description="g0", readout_format=".0e", continuous_update=False)
    net_box = wd.Checkbox(value=bool(network), description="overlay the real network")

    _live(lambda: underflow_view(a_box.value, d_box.value, fmt_box.value, g_box.value,
                                 net_box.value),
          (a_box, d_box, fmt_box, g_box, net_box), (h_text, h_fig))
    return wd.VBox([wd.HBox([a_box, d_box, fmt_box]), wd.HBox([g_box, net_box])])


def scaling_view(growth_interval: int = 50, spike_rate: float = 0.01,
                 init_scale: float = 2.0**16, steps: int = 600, fmt="float16",
                 seed: int = 0) -> tuple[TextPanel, Figure]:
    """Dynamic loss scaling over scaling.gradient_stream: the scale, skipped steps, scaled max |g| vs fmt's max."""
    import numpy as np

    from .plotting import FORMAT_COLORS, PALETTE, plot_scale_history
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
    ax_g.legend(fontsize=8.5)
    fig.tight_layout()
    return TextPanel("\n".join(lines)), fig


def scaling_explorer(growth_interval: int = 50, spike_rate: float = 0.01,
                     init_scale: float = 2.0**16, steps: int = 600):
    """Show scaling_view(...) now, then return controls (growth interval, spike rate, initial scale)."""
    import ipywidgets as wd
    import numpy as np

    panel, fig = scaling_view(growth_interval, spike_rate, init_scale, steps)
    h_text, h_fig = _display(panel), _display(fig)
    gi_box = wd.IntSlider(value=int(growth_interval), min=1, max=400, description="interval",
                          continuous_update=False)
    sr_box = wd.FloatSlider(value=float(spike_rate), min=0.0, max=0.2, step=0.005,
                            description="spike rate", readout_format=".3f",
                            continuous_update=False)
    is_box = wd.IntSlider(value=int(np.log2(init_scale)), min=0, max=40,
                          description="log2 init", continuous_update=False)

    _live(lambda: scaling_view(gi_box.value, sr_box.value, 2.0**is_box.value, steps),
          (gi_box, sr_box, is_box), (h_text, h_fig))
    return wd.HBox([gi_box, sr_box, is_box])
