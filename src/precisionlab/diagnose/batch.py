"""What the four diagnoses take and return, in one place: a batch (a tensor, a tuple or list of
positional inputs, or a dict of keyword inputs such as a tokenizer's ``input_ids`` and
``attention_mask``) and a model's output (a tensor, a tuple or list, a dict or a Hugging Face
``ModelOutput``, which is an OrderedDict with attributes).

`as_inputs` turns a batch into `Inputs`, a tuple of every input (positional first, then the
keyword values in order) that remembers which trailing ones are keywords; `call` runs a model
on it (a dtype clash between the batch and the model's parameters is re-raised as a ValueError
that says what to pass), `cast` casts its floating tensors (integer ids and masks stay
integer); `output_tensors` lists the tensors of an output, choosing one field of a dict output.

`cast_inputs=True`, the one keyword the four diagnoses share for it, goes through `for_program`:
the batch's floating tensors cast to the program's parameter dtype (`param_dtype`: the first
floating parameter, in `named_parameters` order, of the Module the program is, is bound to or
closes over), so a bfloat16 copy of an image model can be given the float32 images.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

__all__ = ["CAST_HINT", "Inputs", "as_inputs", "call", "cast", "for_program", "modules_of",
           "named_modules_of", "output_tensors", "param_dtype", "tensors"]

CAST_HINT = "cast_inputs=True"  # the keyword every diagnosis takes for it


class Inputs(tuple):
    """The inputs of one call: positional inputs, then keyword values; `names` are the keywords
    of the last len(names) entries."""

    names: tuple[str, ...] = ()

    def __new__(cls, args=(), kwargs: Mapping | None = None):
        kwargs = dict(kwargs or {})
        self = super().__new__(cls, (*args, *kwargs.values()))
        self.names = tuple(kwargs)
        return self

    @property
    def args(self) -> tuple:
        """The positional inputs."""
        return tuple(self[:len(self) - len(self.names)])

    @property
    def kwargs(self) -> dict:
        """The keyword inputs, by name."""
        n = len(self.names)
        return dict(zip(self.names, self[len(self) - n:], strict=True)) if n else {}

    def map(self, f: Callable) -> Inputs:
        """f applied to every input, keywords kept."""
        return Inputs(tuple(f(x) for x in self.args), {k: f(v) for k, v in self.kwargs.items()})


def as_inputs(batch, name: str = "batch") -> Inputs:
    """The inputs of a batch: a tensor becomes (tensor,), a tuple or list stays, a dict (or a
    tokenizer's BatchEncoding) is passed as keywords, model(**batch); else ValueError."""
    if isinstance(batch, Inputs):
        return batch
    if isinstance(batch, torch.Tensor):
        return Inputs((batch,))
    if isinstance(batch, (tuple, list)) and batch:
        if any(isinstance(b, Mapping) for b in batch):  # it would go in as a positional input
            raise ValueError(
                f"{name} is a {type(batch).__name__} holding a dict, which would be passed as a "
                f"positional input; pass the dict alone ({name}=dict(input_ids=..., "
                "attention_mask=...), run as model(**batch)), or a tuple of tensors")
        return Inputs(tuple(batch))
    if isinstance(batch, Mapping) and batch:
        if not all(isinstance(k, str) for k in batch):
            raise ValueError(f"a dict {name} is passed as keywords, model(**{name}): its keys "
                             f"must be strings; got {list(batch)!r}")
        return Inputs((), batch)
    raise ValueError(f"{name} must be a tensor, a non-empty tuple of model inputs or a dict of "
                     f"keyword inputs (model(**{name})); got {name}={type(batch).__name__}")


def named_modules_of(fn) -> list:
    """(name, Module) for each Module fn runs with, each once: ("", fn) when fn is a Module; for
    a function or method, ("", the Module it is bound to), then the Modules it closes over or
    names as globals, under their variable names."""
    if isinstance(fn, torch.nn.Module):
        return [("", fn)]
    found: list = []

    def add(name, v):
        if isinstance(v, torch.nn.Module) and all(v is not m for _, m in found):
            found.append((name, v))
    add("", getattr(fn, "__self__", None))
    code = getattr(fn, "__code__", None)
    names = code.co_freevars if code is not None else ()
    for name, cell in zip(names, getattr(fn, "__closure__", None) or (), strict=False):
        try:
            add(name, cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    glob = getattr(fn, "__globals__", {})
    for name in (code.co_names if code is not None else ()):
        add(name, glob.get(name))
    return found


def modules_of(fn) -> list:
    """The Modules whose parameters fn runs with (`named_modules_of`, without the names)."""
    return [m for _, m in named_modules_of(fn)]


def param_dtype(fn) -> torch.dtype | None:
    """The dtype of the first floating parameter (else buffer) of fn's first Module
    (`modules_of`), or None when fn runs with none."""
    for m in modules_of(fn):
        for t in (*m.parameters(), *m.buffers()):
            if t.is_floating_point():
                return t.dtype
    return None


def for_program(fn, inputs: Inputs, cast_inputs: bool) -> Inputs:
    """inputs as fn gets them: with cast_inputs, the floating tensors cast to fn's parameter
    dtype (`param_dtype`; a program without floating parameters takes them as they are)."""
    if not isinstance(cast_inputs, bool):
        raise ValueError(f"cast_inputs must be True or False; got cast_inputs={cast_inputs!r}")
    dtype = param_dtype(fn) if cast_inputs else None
    return inputs if dtype is None else cast(inputs, dtype)


def _names(dtypes) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def call(fn: Callable, inputs: Inputs, name: str = "the program"):
    """fn run on inputs: fn(*args, **kwargs). A RuntimeError or TypeError raised while the
    batch's floating tensors differ in dtype from fn's floating parameters is re-raised as a
    ValueError that names both dtypes and shows cast_inputs=True and the wrapper to write."""
    try:
        return fn(*inputs.args, **inputs.kwargs)
    except (RuntimeError, TypeError) as err:
        given = {x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()}
        params = {t.dtype for m in modules_of(fn) for t in m.parameters() if t.is_floating_point()}
        if not given or not params or given <= params:
            raise
        to = str(param_dtype(fn)).removeprefix("torch.")
        raise ValueError(
            f"{name} has {_names(params)} parameters but the batch holds {_names(given)} "
            f"tensors, and it failed on them ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); pass {CAST_HINT} to cast the "
            f"batch's floating tensors to {to} (integer ids and masks are never cast), or wrap "
            f"the model: lambda x: model(x.to(torch.{to}))") from err


def cast(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    """inputs with their floating tensors cast to dtype; integer and bool tensors (token ids,
    attention masks) and non-tensors stay as they are."""
    return inputs.map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor)
                      and x.is_floating_point() else x)


def tensors(obj) -> list:
    """The tensors in obj, in order: a tensor, or nested tuples, lists and dicts (a Hugging Face
    ModelOutput is a dict; a dict's values in the order of its sorted keys) of them; anything
    else (a cache object, None) is skipped."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    out = []
    if isinstance(obj, (list, tuple)):
        for o in obj:
            out += tensors(o)
    elif isinstance(obj, Mapping):  # by key, so that two dicts with the same keys pair up
        for key in sorted(obj, key=str):
            out += tensors(obj[key])
    return out


def output_tensors(out, field: str | None = None, name: str = "the program") -> list:
    """The tensors of a program's output that a diagnosis compares. A dict output (a Hugging
    Face ModelOutput) gives out[field]'s tensors; field=None takes "logits" when present, else
    every tensor in it. A tensor, tuple or list gives its tensors (field must then be None)."""
    if isinstance(out, Mapping):
        if field is None and "logits" in out:
            field = "logits"
        if field is not None:
            if field not in out:
                raise ValueError(f"output={field!r} is not a field of what {name} returns "
                                 f"({type(out).__name__}); valid fields: "
                                 f"{', '.join(map(str, out))}")
            out = out[field]
    elif field is not None:
        raise ValueError(f"output={field!r} selects a field of a dict or ModelOutput, but "
                         f"{name} returns {type(out).__name__}; pass output=None")
    ts = tensors(out)
    if not ts:
        raise ValueError(f"{name} must return a tensor, a tuple of tensors, or a dict or "
                         f"ModelOutput of tensors; got {type(out).__name__}")
    return ts
