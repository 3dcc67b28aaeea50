"""Triage's second pass, which separates logic from precision: the target's own program run at
the reference's precision.

A bfloat16 target's bounds are wide (each operation may round to 8 bits), so a small logic bug
(an attention scale off by 2^-7, a changed eps) hides inside them and the verdict is Type-I.
Where the target is a cast of a module (an nn.Module whose parameters are all bfloat16, or all
float16) and the reference is a module at a wider precision, the logic pass triages

- a copy of the target cast up to the reference's dtype (the same program, the same rounded
  parameter values, the reference's precision), against
- a copy of the reference whose parameters (and the floating buffers the target holds in its
  dtype) are rounded to the target's dtype, their own dtype kept (the reference's program
  with the parameter values the target has),

so the only difference left between the two is the programs' logic, bounded at the reference's
precision: a Type-II there is a bug in the target's program that its round-off hid. Floating
inputs in the target's dtype are cast up (exactly). Anything else (a function target, a
reference that is not a module, mixed or wide parameter dtypes) has no such copy: the pass is
not possible, and `run_logic_pass` says why.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch

from .batch import as_inputs

__all__ = ["LOW", "module_dtype", "run_logic_pass", "with_logic_pass"]

LOW = (torch.bfloat16, torch.float16)  # the target dtypes the logic pass casts up from
_WIDE = (torch.float32, torch.float64)


def module_dtype(module) -> torch.dtype | None:
    """The one dtype of all of module's floating parameters, or None (no parameters, a
    non-floating one, or more than one dtype)."""
    if not isinstance(module, torch.nn.Module):
        return None
    dts = {p.dtype for p in module.parameters()}
    if len(dts) != 1:
        return None
    dt = dts.pop()
    return dt if dt.is_floating_point else None


def _why_not(reference, target) -> str:
    """Why the logic pass cannot run on these programs ("" when it can)."""
    if not isinstance(target, torch.nn.Module):
        return (f"the target is a {type(target).__name__}, not an nn.Module, so there is no "
                "module to run at the reference's precision; pass the low-precision module "
                "itself (with cast_inputs=True if it needs its inputs cast)")
    low = module_dtype(target)
    if low not in LOW:
        found = sorted({str(p.dtype).removeprefix("torch.") for p in target.parameters()})
        return ("the target's parameters are not all one low-precision dtype (bfloat16 or "
                f"float16); they are {', '.join(found) or 'none'}")
    if not isinstance(reference, torch.nn.Module):
        return (f"the reference is a {type(reference).__name__}, not an nn.Module, so its "
                "parameters cannot be rounded as the target's were")
    high = module_dtype(reference)
    if high not in _WIDE:
        found = sorted({str(p.dtype).removeprefix("torch.") for p in reference.parameters()})
        return ("the reference's parameters are not all float32 or all float64; they are "
                f"{', '.join(found) or 'none'}")
    return ""


def run_logic_pass(reference, target, inputs, run: Callable) -> tuple:
    """(report, note): `run` (a triage) of the target's program at the reference's precision
    against the reference with the target's rounded parameters, or (None, why not).

    Parameters
    ----------
    reference, target : torch.nn.Module or callable
        triage's programs.
    inputs : torch.Tensor, tuple, dict or batch.Inputs
        triage's inputs; floating tensors in the target's dtype are cast up to the
        reference's for the pass (exactly: both low dtypes are contained in float32).
    run : callable
        run(reference, target, inputs) -> TriageReport, the triage of the pass.

    Returns
    -------
    tuple
        (TriageReport, "") when the pass ran; (None, the reason in words) when the programs
        have no such copies (see the module docstring).
    """
    why = _why_not(reference, target)
    if why:
        return None, why
    low, high = module_dtype(target), module_dtype(reference)
    ref = _rounded(reference, target, low)
    tgt = copy.deepcopy(target).to(high)
    ins = as_inputs(inputs, "inputs").map(
        lambda x: x.to(high) if isinstance(x, torch.Tensor) and x.dtype == low else x)
    return run(ref, tgt, ins), ""


def _rounded(reference, target, low: torch.dtype) -> torch.nn.Module:
    """A copy of reference with every parameter rounded to low (and back: its dtype kept), and
    each floating buffer whose namesake in target is in low rounded too."""
    ref = copy.deepcopy(reference)
    kept = {n: b.dtype for n, b in target.named_buffers()}
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(low))
        for n, b in ref.named_buffers():
            if b.is_floating_point() and kept.get(n) == low:
                b.copy_(b.to(low))
    return ref


def with_logic_pass(report, when: bool | None, reference, target, inputs, run: Callable):
    """report with its logic pass (`run_logic_pass`) as triage's logic_pass keyword asks: None
    runs it where possible and the report is Type-I (else report as it is), True always
    (noting why where it is not possible), False never."""
    if when is False or (when is None and report.verdict != "Type-I"):
        return report
    lg, note = run_logic_pass(reference, target, inputs, run)
    if lg is None and when is None:  # automatic, and not possible: nothing to say
        return report
    return dataclasses.replace(report, logic=lg, logic_note=note)
