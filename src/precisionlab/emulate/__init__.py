"""Portable reduced-precision arithmetic: the same bits on every CPU, thread count and torch version.

torch's own float16/bfloat16 (and float32) CPU kernels pick their summation order, vector
width and fused multiply-adds by instruction set and thread count, so one network gives
different digits on different machines. Every number this book states is computed here
instead, with arithmetic whose semantics are written down:

* **Storage.** A value "in format F" is a float32 tensor (float64 for F = float64) holding a
  number representable in F. `Precision` names F, the accumulator and the back end.
* **Matrix products** (`matmul`, `linear`): operands rounded to F; each product rounded to
  the accumulator (exact for every operand format narrower than it: the way tensor cores
  form products), summed in the accumulator in the fixed order k = 0, 1, ..., K-1; the bias
  added last in the accumulator; one rounding of the result to F. A small numba loop with no
  fused multiply-adds and no reassociation does this, so the order is the code's, not the CPU's.
* **Everything else** (elementwise functions, norms, softmax, losses, reductions, optimizer
  updates) is evaluated in float64 from the stored values, with sums taken by a fixed
  pairwise tree (`fixed_sum`) and exp/log built from +, -, *, / (`exp64`, `log64`), then
  rounded once to F with `round_to`. IEEE 754 makes float64 +, -, *, /, sqrt correctly rounded
  on every machine, which is what makes the result portable.
* **Gradients** are computed the same way and stored in F: each backward op rounds its
  incoming gradient to F, computes in the accumulator (matmul) or float64 (the rest), and
  rounds what it returns to F. A cast (`cast`) passes gradients straight through, as
  autocast's casts do.

`backend="native"` runs the same op with torch's own kernels in F's torch dtype instead: what
*this* machine's hardware gives, for the book's "your hardware" cells. Never `torch.compile`
an emulated op: fusion could drop the rounding steps.

Files, one concept each (lowest first):

* `precision`: `Precision` (format F, accumulator, back end) and `as_precision`;
* `elementary`: the one portable exp, log and sqrt (`exp64`, `log64`, `sqrt64`) and tanh,
  sigmoid, cos(2 pi u), 2^n built on them, in float64, with their coefficients;
* `summation`: `fixed_sum`, the fixed pairwise tree every reduction uses;
* `sampling`: `randn`, the one portable normal sampler (Box-Muller, two uniforms a sample);
* `sqnr`: `sqnr_db`, a quantized tensor's signal-to-noise ratio by the fixed-order sum;
* `kernels`: the numba kernels, compiled twins of `elementary`, `summation`, `round_to` and
  the matmul loop (also used by `rl`'s fused policy forward);
* `planned_products` (from `precisionlab.plan`): a block that declares its products' work so
  that a short computation's products and roundings stay on NumPy's tier (no cold compile);
* `products`: the matrix products `matmul` and `linear`;
* `activations`: `cast` and the elementwise ops `exp`, `log`, `tanh`, `sigmoid`, `gelu`, `silu`;
* `norms`: `rms_norm`, `group_norm`;
* `reductions`: `sum`, `mean`, `log_softmax`;
* `losses`: `mse_loss`;
* `lookup`: `embedding`, a row lookup whose gradient adds repeated rows in a fixed order;
* `layers`: `Linear`;
* `optim`: `SGD`, `Adam`;
* `quantize`: `fake_quantize`;
* `quantized_linear`: `quantized_linear`, `QuantizedLinear`, a linear layer whose inputs
  and output gradient pass through a `precisionlab.quantize` quantizer (FP8/MX recipes),
  and `quantize_input`, which quantizes a constant input once for many calls.
"""

from ..plan import planned_products
from .activations import cast, exp, gelu, log, sigmoid, silu, tanh
from .elementary import exp64, log64, sqrt64
from .layers import Linear
from .lookup import embedding
from .losses import mse_loss
from .norms import group_norm, rms_norm
from .optim import SGD, Adam
from .precision import ACCUMULATORS, BACKENDS, Precision
from .products import linear, matmul
from .quantize import fake_quantize
from .quantized_linear import QuantizedLinear, quantize_input, quantized_linear
from .reductions import log_softmax, mean, sum
from .sampling import randn
from .sqnr import sqnr_db
from .summation import fixed_sum

__all__ = [
    "ACCUMULATORS",
    "BACKENDS",
    "SGD",
    "Adam",
    "Linear",
    "Precision",
    "QuantizedLinear",
    "cast",
    "embedding",
    "exp",
    "exp64",
    "fake_quantize",
    "fixed_sum",
    "gelu",
    "group_norm",
    "linear",
    "log",
    "log64",
    "log_softmax",
    "matmul",
    "mean",
    "mse_loss",
    "planned_products",
    "quantize_input",
    "quantized_linear",
    "randn",
    "rms_norm",
    "sigmoid",
    "silu",
    "sqnr_db",
    "sqrt64",
    "sum",
    "tanh",
]
