"""Quantizer cost: precisionlab.quantize beside torch's own float8 cast of the same tensor.

Run: python benchmarks/bench_quantize.py [--rows 2048] [--cols 2048] [--repeats 9] [--threads 1]
Each time is the fastest of `repeats` calls after one warm-up call (which also loads numba's
compiled kernels): on a shared machine the minimum is the least disturbed estimate of the
work itself. Baselines on the same float32 tensor: torch's bare cast x.to(float8_e4m3fn)
(one byte out), that cast and back to float32 (what a float32 result costs), and torch's own
current-scaling recipe (amax, scale = 448 / amax, (x * scale).to(float8_e4m3fn)). Every
quantizer returns float32 elements, its scales and three shares (saturated, underflowed,
subnormal), so it also reads its output back once more than the casts do.
Goals (issue #26): per-tensor current scaling within 3x of torch's cast; every per-block
quantizer within 2x of per-tensor.
A second table times one training step (forward, backward, Adam) of chapter 9's regression
(x: 512 x 128 with 2 outlier channels, 16 outputs, E5M2 output gradients) through
`emulate.QuantizedLinear`, the constant x quantized inside the layer on every step against
quantized once (`quantize_input`) and passed in as a `Quantized`: the same bits, less work.
"""

from __future__ import annotations

import argparse
import functools
import os
import timeit

import numpy as np
import torch

from precisionlab import emulate
from precisionlab.chapters import quantize_runs
from precisionlab.quantize import (
    RECIPES,
    DelayedScaling,
    quantize_blocks,
    quantize_per_tensor,
    quantize_two_level,
)
from precisionlab.tables import show


def fastest_ms(fn, repeats: int) -> float:
    """Minimum wall time of fn() in milliseconds over `repeats` calls after one warm-up call."""
    fn()
    return 1e3 * min(timeit.repeat(fn, number=1, repeat=repeats))


def torch_recipe(x: torch.Tensor) -> torch.Tensor:
    """torch's current scaling: x * (448 / amax) cast to float8_e4m3fn."""
    return (x * (448.0 / x.abs().amax())).to(torch.float8_e4m3fn)


def training_step(x, y, x_quantizer, once: bool):
    """One step of Adam on mean((x^ W^T - y)^2) through QuantizedLinear, as a closure."""
    lin = emulate.QuantizedLinear(torch.zeros(y.shape[-1], x.shape[-1]), None,
                                  x_quantizer=None if once else x_quantizer,
                                  grad_quantizer=RECIPES["fp8_tensor_e5m2"])
    opt = emulate.Adam(lin.parameters(), lr=1e-2)
    xin = emulate.quantize_input(x, x_quantizer) if once else x

    def step():
        opt.zero_grad()
        emulate.mse_loss(lin(xin), y, "float32").backward()
        opt.step()
    return step


def layer_table(repeats: int) -> str:
    """Step times with the constant x quantized every step against once, per recipe."""
    x, y = quantize_runs.outlier_regression(512, 128, 16, 100.0, (17, 90), seed=0)
    rows = []
    for name in ("fp8_tensor", "mxfp8", "nvfp4"):
        every = fastest_ms(training_step(x, y, RECIPES[name], once=False), repeats)
        once = fastest_ms(training_step(x, y, RECIPES[name], once=True), repeats)
        rows.append((name, every, once, 1 - once / every))
    return show(rows, [("x recipe", None), ("x quantized every step, ms", ".3f"),
                       ("x quantized once, ms", ".3f"), ("saved", ".0%")],
                title="One QuantizedLinear training step, 512 x 128 -> 16 (chapter 9's run)",
                width=None).to_text()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    # Activations with outlier channels: 1 column in 64 is 100 times larger.
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    x[:, ::64] *= 100.0
    t = torch.from_numpy(x)
    print(f"x: {args.rows} x {args.cols} float32 ({t.numel():,} values); cores = "
          f"{os.cpu_count()}, torch threads = {torch.get_num_threads()}, load average = "
          f"{os.getloadavg()[0]:.1f}")

    cast = fastest_ms(lambda: t.to(torch.float8_e4m3fn), args.repeats)
    baselines = [("torch cast to float8_e4m3fn", cast),
                 ("torch cast and back to float32",
                  fastest_ms(lambda: t.to(torch.float8_e4m3fn).float(), args.repeats)),
                 ("torch current scaling (amax, scale, cast)",
                  fastest_ms(lambda: torch_recipe(t), args.repeats))]
    delayed = DelayedScaling("float8_e4m3fn", amax_history_len=16)
    per_tensor = ("per-tensor current, e4m3, float32 scale",
                  functools.partial(quantize_per_tensor, t))
    quantizers = [
        per_tensor,
        ("per-tensor current, e4m3, e8m0 scale",
         functools.partial(quantize_per_tensor, t, scale_format="float8_e8m0fnu")),
        ("per-tensor delayed, e4m3, history 16", functools.partial(delayed, t)),
        ("MXFP8: 32 along rows, e4m3, e8m0", functools.partial(quantize_blocks, t)),
        ("MXFP4: 32 along rows, e2m1, e8m0",
         functools.partial(quantize_blocks, t, "float4_e2m1fn")),
        ("1x128 tiles, e4m3, float32 scale",
         functools.partial(quantize_blocks, t, block=(1, 128), scale_format="float32")),
        ("128x128 tiles, e4m3, float32 scale",
         functools.partial(quantize_blocks, t, block=(128, 128), scale_format="float32")),
        ("NVFP4: 16 along rows, e2m1, e4m3 + fp32",
         functools.partial(quantize_two_level, t)),
    ]
    times = {name: fastest_ms(fn, args.repeats) for name, fn in quantizers}
    reference = times[per_tensor[0]]
    rows = [(name, ms, ms / cast, None, "") for name, ms in baselines]
    for name, ms in times.items():
        if name.startswith("per-tensor current"):
            goal = f"<= 3x cast: {'met' if ms <= 3 * cast else 'missed'}"
        else:
            goal = f"<= 2x per-tensor: {'met' if ms <= 2 * reference else 'missed'}"
        rows.append((name, ms, ms / cast, ms / reference, goal))
    table = show(rows, [("what", None), ("ms", ".2f"), ("x cast", ".1f"),
                        ("x per-tensor", lambda v: "" if v is None else f"{v:.2f}"),
                        ("goal", None)],
                 title="Quantizer cost against torch's float8 cast of the same tensor",
                 width=None)
    print(table.to_text())
    print()
    print(layer_table(args.repeats))


if __name__ == "__main__":
    main()
