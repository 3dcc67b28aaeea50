"""A real autocast pathway: a stopping test S = p @ p that torch.autocast's bfloat16 cast turns around."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..checks import check_count, check_positive
from ..rounding import next_down, next_up, round_to


def autocast_batch(tol: float = 1e-3) -> tuple[np.ndarray, float]:
    """(y0, tol): four float32 penetrations whose squared norm reaches tol in float32 but not in bfloat16.

    Two balls each at p1 and p2, each the largest float32 below the bfloat16 midpoint above
    b1 = 67 * 2^-13 and b2 = 85 * 2^-12: casting to bfloat16 (as autocast does for a matmul)
    rounds each down to b_i, so fl_bf16(sum b_i^2) = 0.00099182 lies below fl_bf16(tol),
    while the float32 sum of p_i^2 is 0.0010011 >= tol. Built for tol = 1e-3.
    """
    tol = check_positive(tol, "tol")
    bs = np.array([67 * 2.0**-13, 85 * 2.0**-12])
    mids = (bs + np.asarray(next_up(bs, "bfloat16"))) / 2
    p = np.asarray(next_down(mids, "float32"))
    y0 = -np.repeat(p, 2).reshape(1, -1)
    s32 = float(round_to(math.fsum(float(round_to(q * q, "float32")) for q in p.repeat(2)),
                         "float32"))
    sbf = float(round_to(math.fsum(np.repeat(bs, 2) ** 2), "bfloat16"))
    if not (s32 >= float(round_to(tol, "float32")) and sbf < float(round_to(tol, "bfloat16"))):
        raise ValueError(f"the batch is built for tol = 1e-3 (float32 |p|^2 = {s32!r}, bfloat16 "
                         f"{sbf!r}); got tol={tol!r}")
    return y0, tol


def torch_autocast_rollout(autocast: bool, T: int = 4, max_iter: int = 25, k: float = 0.5,
                           alpha: float = 0.5, tol: float = 1e-3) -> dict:
    """The autocast_batch solved with torch: float32 state and gain, stopping test S = p @ p < tol.

    With `autocast`, S is computed inside torch.autocast("cpu", dtype=torch.bfloat16), so the
    matmul casts p to bfloat16 (and returns S in bfloat16); the update y <- y + alpha k p stays
    in float32. Returns it_hist, S at the first test of each step, its dtype, loss (mean p^2),
    grad and loss_requires_grad, as torch_boundary_rollout does. Uses torch's own kernels.
    """
    y0, tol = autocast_batch(tol)
    kk = torch.tensor(float(k), dtype=torch.float32, requires_grad=True)
    y = torch.as_tensor(y0[0], dtype=torch.float32)
    it_hist, first_s, s_dtype = [], [], None
    p = torch.relu(-y)
    for _ in range(check_count(T, "T")):
        it = 0
        while it < max_iter:
            p = torch.relu(-y)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(autocast)):
                s = p @ p
            if it == 0:
                first_s.append(float(s.detach()))
                s_dtype = s.dtype
            if bool(s < tol):
                break
            y = y + alpha * kk * p
            it += 1
        it_hist.append(it)
    loss = p.pow(2).mean()
    needs = bool(loss.requires_grad)
    grad = 0.0
    if needs:
        (g,) = torch.autograd.grad(loss, kk, allow_unused=True)
        grad = 0.0 if g is None else float(g)
    return {"it_hist": it_hist, "first_s": first_s, "s_dtype": s_dtype,
            "loss": float(loss.detach()), "grad": grad, "loss_requires_grad": needs}
