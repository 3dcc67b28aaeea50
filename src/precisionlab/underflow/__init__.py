"""Gradient underflow by depth: the attenuation model, a network that realises it, per-layer health.

The attenuation model: if every layer multiplies the backward signal by a factor ``a < 1``, a
gradient entry of typical size ``g0`` at the last layer has typical size ``g0 · a^k`` at depth
``k`` (``k`` layers below the loss). Once that falls to half the format's smallest subnormal
``q/2``, round-to-nearest turns the typical entry into exactly zero and the layer stops
learning. `first_underflow_depth` solves for ``k`` exactly.

`AttenuatingNet` is a real deep network whose initialisation sets ``a``: affine layers
``h <- W h + b`` with ``W = a · Q`` (``Q`` random orthogonal, so every backward step multiplies
the gradient's norm by exactly ``a``) and biases of variance ``1 - a^2`` (so the forward signal
stays at unit scale at every depth). `probe_gradients` runs one backward pass in the network's
format (float16, bfloat16 or float32) and returns per-layer statistics (`ForwardPass`
keeps its forward pass for backward passes at several loss scales); `train_probe`
repeats that for a few SGD steps; `health_table`, `health_summary` and `diagnose` print what
a practitioner would look at.

The network computes through `precisionlab.emulate` (backend="emulated", the default): values
stored in the format, products and sums in float32 in a fixed order, one rounding per
operation, so every number is the same on every CPU and thread count. backend="native" runs
torch's own float16/bfloat16/float32 kernels instead: what this machine's hardware gives.

Files, from the floor up:

* `network` - the attenuation model (`floor_value`, `gradient_by_depth`,
  `first_underflow_depth`), `AttenuatingNet`, `make_batch`, the per-layer statistics
  (`GradientStats`, `LayerGradients`), `ForwardPass`, `probe_gradients`, `train_probe` and the
  depth fits;
* `diagnosis` - `layer_status`, `health_table`, `health_summary`, `Diagnosis`, `diagnose`.
"""

from .diagnosis import Diagnosis, diagnose, health_summary, health_table, layer_status
from .network import (
    FLOORS,
    NETWORK_FORMATS,
    STATUSES,
    AttenuatingNet,
    ForwardPass,
    GradientStats,
    LayerGradients,
    TrainingProbe,
    first_underflow_depth,
    fit_g0,
    floor_value,
    gradient_by_depth,
    make_batch,
    measured_underflow_depth,
    orthonormal_columns,
    pass_products,
    predicted_underflow_depth,
    probe_gradients,
    probe_network,
    train_probe,
    train_probe_arguments,
    zero_counts,
)

__all__ = [
    "FLOORS",
    "NETWORK_FORMATS",
    "STATUSES",
    "AttenuatingNet",
    "Diagnosis",
    "ForwardPass",
    "GradientStats",
    "LayerGradients",
    "TrainingProbe",
    "diagnose",
    "first_underflow_depth",
    "fit_g0",
    "floor_value",
    "gradient_by_depth",
    "health_summary",
    "health_table",
    "layer_status",
    "make_batch",
    "measured_underflow_depth",
    "orthonormal_columns",
    "pass_products",
    "predicted_underflow_depth",
    "probe_gradients",
    "probe_network",
    "train_probe",
    "train_probe_arguments",
    "zero_counts",
]
