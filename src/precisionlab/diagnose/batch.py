"""What the four diagnoses take and return, in one place: a batch (a tensor, a tuple or list of
positional inputs, or a dict of keyword inputs such as a tokenizer's ``input_ids`` and
``attention_mask``) and a model's output (a tensor, a tuple or list, a dict or a Hugging Face
``ModelOutput``, which is an OrderedDict with attributes).

`as_inputs` turns a batch into `Inputs`, a tuple of every input (positional first, then the
keyword values in order) that remembers which trailing ones are keywords; `call` runs a model
on it, `cast` casts its floating tensors (integer ids and masks stay integer); `output_tensors`
lists the tensors of an output, choosing one field of a dict output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

__all__ = ["Inputs", "as_inputs", "call", "cast", "output_tensors", "tensors"]


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


def call(fn: Callable, inputs: Inputs):
    """fn run on inputs: fn(*args, **kwargs)."""
    return fn(*inputs.args, **inputs.kwargs)


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
