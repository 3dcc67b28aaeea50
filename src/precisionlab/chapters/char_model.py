"""Chapter 8: the character transformer it diagnoses, its training text and its stored weights.

The model is a small GPT-style transformer over characters (token and position embeddings,
pre-norm blocks of causal self-attention and an MLP, a linear head). Its attention has a
``kernel`` switch: ``"manual"`` writes attention out operation by operation, ``"fused"`` calls
``F.scaled_dot_product_attention``, and three variants carry a planted bug (``KERNELS``).

Two things here are stored rather than recomputed, so that chapter 8's checks see the same
model on every machine:

* the training text, ``char_corpus.txt`` beside this module (package data): the module
  docstrings of nine concepts (``MODULES``). Read live, it changed with every edit of those
  docstrings, and with it the trained weights;
* the trained weights, ``data/ch8_char_model.json`` and ``.npz`` (``save_trained``,
  ``load_trained``), written by ``scripts/ch8_char_model.py``. The 100 float32 AdamW steps
  (``train``) end on other weights under another instruction set: torch (and MKL, for the
  matrix products) picks its float32 kernels for the processor at run time, and they group
  their additions, fuse multiply-adds and approximate exp and erf each their own way. The
  last bits that differ decide AdamW's step wherever a gradient entry is near its epsilon
  or is round-off of an exact zero (the key biases'), from the first step on.

>>> corpus = text()
>>> chars, data = encode(corpus)
>>> len(chars) == len(set(corpus)) and data.shape == (len(corpus),)
True
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CONTEXT", "FILE", "KERNELS", "MODULES", "Attention", "Block", "CharTransformer",
           "encode", "from_docstrings", "load_trained", "next_char_loss", "save_trained", "text",
           "train", "windows"]

#: the concepts whose module docstrings make up the training text, in order
MODULES = ("formats", "rounding", "emulate", "underflow", "scaling", "rl",
           "intervals", "updates", "world")
#: the stored text's file name, beside this module (package data)
FILE = "char_corpus.txt"
#: characters per training window (the model's context)
CONTEXT = 32
#: the attention implementations: two correct, three with a planted bug
KERNELS = ("manual", "manual, scale bug", "fused", "fused, mask bug", "fused, norm bug")


def from_docstrings(modules: tuple[str, ...] = MODULES) -> str:
    """The module docstrings of ``precisionlab.<m>`` for each name in `modules`, joined by newlines."""
    if isinstance(modules, str) or not modules:
        raise ValueError(f"modules must be a non-empty tuple of precisionlab module names, "
                         f"got {modules!r}; the default is {MODULES}")
    docs = []
    for name in modules:
        try:
            doc = importlib.import_module(f"precisionlab.{name}").__doc__
        except ImportError:
            raise ValueError(f"modules: there is no module precisionlab.{name} (got {name!r}); "
                             f"valid choices include {MODULES}") from None
        if not doc:
            raise ValueError(f"modules: precisionlab.{name} has no docstring; "
                             f"valid choices include {MODULES}")
        docs.append(doc)
    return "\n".join(docs)


def text() -> str:
    """The stored training text (``from_docstrings()`` as it was when the snapshot was written)."""
    return resources.files(__package__).joinpath(FILE).read_text(encoding="utf-8")


def encode(corpus: str) -> tuple[list[str], torch.Tensor]:
    """(the sorted distinct characters, the text as an int64 tensor of their indices)."""
    if not isinstance(corpus, str):
        raise ValueError(f"corpus must be a str longer than CONTEXT = {CONTEXT} characters, "
                         f"got a {type(corpus).__name__}: {corpus!r:.40}")
    if len(corpus) <= CONTEXT:
        raise ValueError(f"corpus must be a str longer than CONTEXT = {CONTEXT} characters, "
                         f"got {len(corpus)} characters: {corpus!r}")
    chars = sorted(set(corpus))
    index = {c: i for i, c in enumerate(chars)}
    return chars, torch.tensor([index[c] for c in corpus])


def windows(data: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """n windows of CONTEXT characters at places drawn uniformly from [0, len(data) - CONTEXT)."""
    if n < 1:
        raise ValueError(f"n must be a positive number of windows, got {n}")
    if len(data) <= CONTEXT:
        raise ValueError(f"data must be longer than CONTEXT = {CONTEXT}, got {len(data)} entries")
    start = torch.randint(0, len(data) - CONTEXT, (n,), generator=generator)
    return torch.stack([data[s:s + CONTEXT] for s in start])


def next_char_loss(logits: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of each position's logits against the next character of `seq`."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                           seq[:, 1:].reshape(-1))


class Attention(nn.Module):
    """Causal multi-head self-attention; `kernel` picks how (``KERNELS``)."""

    def __init__(self, d: int, heads: int, kernel: str = "manual"):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.kernel = heads, kernel

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=-1))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scale = 1 / math.sqrt(d // self.heads)
        if self.kernel == "manual, scale bug":  # off by one part in 2^7
            scale *= 1 + 2**-7
        if self.kernel.startswith("manual"):
            s = (q @ k.transpose(-2, -1)) * scale
            y = s.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        elif self.kernel == "fused":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        elif self.kernel == "fused, mask bug":  # each token also sees the next
            ahead = torch.ones(t, t, dtype=torch.bool,
                               device=x.device).tril(diagonal=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=ahead)
        else:  # "fused, norm bug": probabilities normalised over the queries
            s = (q @ k.transpose(-2, -1)) * scale
            y = s.masked_fill(~causal, float("-inf")).softmax(dim=-2) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)) (4x wide, GELU)."""

    def __init__(self, d: int, heads: int, kernel: str):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, kernel)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Logits over `vocab` characters for each position: embeddings, `layers` blocks, norm, head."""

    def __init__(self, vocab: int, d: int = 48, heads: int = 4, layers: int = 2,
                 context: int = CONTEXT, kernel: str = "manual"):
        super().__init__()
        if d % heads:
            raise ValueError(f"d must be a multiple of heads, got d={d}, heads={heads}")
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads, kernel) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(data: torch.Tensor, vocab: int, seed: int = 0, steps: int = 100, batch: int = 16,
          lr: float = 3e-3) -> tuple[CharTransformer, list[float]]:
    """The chapter's float32 run: AdamW(lr) for `steps` steps on `batch` windows; (model in eval mode, losses)."""
    if steps < 1 or batch < 1 or not lr > 0:
        raise ValueError(f"steps and batch must be positive and lr > 0, got steps={steps}, "
                         f"batch={batch}, lr={lr}")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # nn.Linear's and nn.Embedding's initial weights
    model = CharTransformer(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        seq = windows(data, batch, gen)
        loss = next_char_loss(model(seq), seq)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.eval(), losses


def save_trained(path, model: CharTransformer, meta: dict, corpus: str | None = None) -> None:
    """Write `model`'s state_dict to path's .npz (float32, exact) and `meta` to path (.json).

    `corpus` is the text the model was trained on (default: the stored ``text()``); its sha256
    goes into the .json, and ``load_trained`` refuses the file when the stored text differs.
    """
    path = Path(path)
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    bad = {k: str(v.dtype) for k, v in state.items() if v.dtype != np.float32}
    if bad:
        raise ValueError(f"model must be float32 to be stored exactly, got {bad}")
    np.savez_compressed(path.with_suffix(".npz"), **state)
    corpus = text() if corpus is None else corpus
    doc = {**meta, "arrays": path.with_suffix(".npz").name,
           "corpus_sha256": hashlib.sha256(corpus.encode("utf-8")).hexdigest()}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load_trained(path) -> tuple[dict, CharTransformer]:
    """(meta, the stored model in eval mode, kernel "manual") from a file `save_trained` wrote."""
    path = Path(path)
    meta = json.loads(path.read_text())
    corpus = hashlib.sha256(text().encode("utf-8")).hexdigest()
    if meta.get("corpus_sha256") != corpus:
        raise ValueError(f"{path.name} was trained on another text (sha256 "
                         f"{meta.get('corpus_sha256')}, the stored text's is {corpus}); "
                         f"run scripts/ch8_char_model.py to retrain it")
    with np.load(path.parent / meta["arrays"]) as z:
        state = {k: torch.from_numpy(z[k].copy()) for k in z.files}
    bad = {k: str(v.dtype) for k, v in state.items() if v.dtype != torch.float32}
    if bad:  # load_state_dict would round them into float32 without a word
        raise ValueError(f"{meta['arrays']} must hold float32 arrays, got {bad}")
    model = CharTransformer(meta["vocab"])
    model.load_state_dict(state)  # strict: every weight, exact float32
    return meta, model.eval()
