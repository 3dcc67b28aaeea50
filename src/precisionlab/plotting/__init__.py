"""House style and reusable figures. Every figure function takes `ax=None`, returns the Axes it
drew on, and never calls `plt.show()`. Files, one concept each:

* `style`: the palette, one colour and dash per format, the house rcParams, legend placement;
* `formats`: a format's value grid, ulp(x) against |x|, fl(x) on a number line (chapter 1);
* `updates`: steps until fl(w + k·lr) moves, training under storage policies (chapter 1);
* `reductions`: rounded sums against tol, flip probability, solver residuals (chapter 2);
* `world`: the bouncing ball's heights, sweeps, stiffness regions, solver passes (chapter 3);
* `underflow`: g0·a^k against a format's floors, gradients and zeros by depth (chapter 4);
* `scaling`: the loss scale per step, loss curves (chapter 5);
* `rl`: phantom clipping, beta by token and logit level, runs per step (chapter 6);
* `intervals`: leaf depths, bound widths, bound bands per element (chapter 7);
* `quantize`: per-layer SQNR and zeros, outlier sweeps, scale traces, SQNR per block
  (chapter 9).
"""

from .copies import copied_figure, figure_copies, rc_snapshot
from .formats import format_grid, plot_number_line, plot_ulp_vs_magnitude
from .intervals import plot_bound_bands, plot_bound_widths, plot_leaf_depths
from .quantize import (
    plot_block_sqnr,
    plot_layer_quantization,
    plot_outlier_sweep,
    plot_scaling_trace,
)
from .reductions import plot_flip_probability, plot_residual_histories, plot_sum_outcomes
from .rl import plot_beta_by_offset, plot_beta_vs_logprob, plot_phantom_strip, plot_run_metric
from .scaling import plot_loss_curves, plot_scale_history
from .style import (
    FORMAT_COLORS,
    FORMAT_LINESTYLES,
    PALETTE,
    format_style,
    legend_outside,
    use_house_style,
)
from .underflow import plot_attenuation_model, plot_layer_gradients, plot_zero_fraction
from .updates import (
    POLICY_STYLES,
    plot_changed_fraction,
    plot_crossing_heatmap,
    plot_crossing_trajectory,
    plot_training_curves,
)
from .world import (
    plot_height_gap,
    plot_heights,
    plot_parameter_sweep,
    plot_solver_passes,
    plot_stiffness_map,
)

__all__ = [
    "FORMAT_COLORS",
    "FORMAT_LINESTYLES",
    "PALETTE",
    "POLICY_STYLES",
    "copied_figure",
    "figure_copies",
    "format_grid",
    "format_style",
    "legend_outside",
    "plot_attenuation_model",
    "plot_beta_by_offset",
    "plot_beta_vs_logprob",
    "plot_block_sqnr",
    "plot_bound_bands",
    "plot_bound_widths",
    "plot_changed_fraction",
    "plot_crossing_heatmap",
    "plot_crossing_trajectory",
    "plot_flip_probability",
    "plot_height_gap",
    "plot_heights",
    "plot_layer_gradients",
    "plot_layer_quantization",
    "plot_leaf_depths",
    "plot_loss_curves",
    "plot_number_line",
    "plot_outlier_sweep",
    "plot_parameter_sweep",
    "plot_phantom_strip",
    "plot_residual_histories",
    "plot_run_metric",
    "plot_scale_history",
    "plot_scaling_trace",
    "plot_solver_passes",
    "plot_stiffness_map",
    "plot_sum_outcomes",
    "plot_training_curves",
    "plot_ulp_vs_magnitude",
    "plot_zero_fraction",
    "rc_snapshot",
    "use_house_style",
]
