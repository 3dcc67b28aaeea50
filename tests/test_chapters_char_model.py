"""Chapter 8's character transformer: its stored text and weights, its kernels, its training run."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from precisionlab import rounding
from precisionlab.chapters import char_model

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "data" / "ch8_char_model.json"
CHAPTER = ROOT / "notebooks" / "08-diagnose-a-real-model.ipynb"


def test_text_is_the_stored_file_byte_for_byte():
    stored = (ROOT / "src" / "precisionlab" / "chapters" / char_model.FILE).read_bytes()
    assert char_model.text().encode("utf-8") == stored


def test_text_does_not_follow_an_edited_docstring(monkeypatch):
    before = char_model.text()
    monkeypatch.setattr(rounding, "__doc__", rounding.__doc__ + "\n")  # one blank line
    assert char_model.from_docstrings() != before  # the live text moved
    assert char_model.text() == before


def test_from_docstrings_joins_the_modules_in_order():
    got = char_model.from_docstrings(("formats", "rounding"))
    docs = [importlib.import_module(f"precisionlab.{m}").__doc__ for m in ("formats", "rounding")]
    assert got == docs[0] + "\n" + docs[1]


@pytest.mark.parametrize("bad", ["rounding", ()])
def test_from_docstrings_rejects_a_bare_name_or_nothing(bad):
    with pytest.raises(ValueError, match="modules must be a non-empty tuple"):
        char_model.from_docstrings(bad)


def test_from_docstrings_names_a_module_without_a_docstring(monkeypatch):
    monkeypatch.setattr(rounding, "__doc__", None)
    with pytest.raises(ValueError, match=r"precisionlab\.rounding has no docstring"):
        char_model.from_docstrings(("rounding",))


def test_encode_round_trips_the_text():
    corpus = char_model.text()
    chars, data = char_model.encode(corpus)
    assert "".join(chars[i] for i in data.tolist()) == corpus and chars == sorted(set(corpus))
    with pytest.raises(ValueError, match="longer than CONTEXT"):
        char_model.encode("short")


def test_windows_are_slices_of_the_data():
    _, data = char_model.encode(char_model.text())
    seq = char_model.windows(data, 5, torch.Generator().manual_seed(3))
    assert seq.shape == (5, char_model.CONTEXT)
    text = data.tolist()
    for row in seq.tolist():
        assert any(text[s:s + len(row)] == row for s in range(len(text) - len(row)))
    with pytest.raises(ValueError, match="n must be a positive"):
        char_model.windows(data, 0, torch.Generator())


def test_next_char_loss_is_torchs_cross_entropy_on_shifted_targets():
    logits = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(1))
    seq = torch.randint(0, 5, (2, 6), generator=torch.Generator().manual_seed(2))
    manual = -sum(logits[b, t].log_softmax(-1)[seq[b, t + 1]]
                  for b in range(2) for t in range(5)) / 10
    assert torch.allclose(char_model.next_char_loss(logits, seq), manual, rtol=1e-6)


def _kernels_on(x, heads=4):
    """Each kernel's output for one attention layer's weights, with the same weights."""
    torch.manual_seed(0)
    ref = char_model.Attention(x.shape[-1], heads, "manual")
    out = {}
    for kernel in char_model.KERNELS:
        att = char_model.Attention(x.shape[-1], heads, kernel)
        att.load_state_dict(ref.state_dict())
        out[kernel] = att(x).detach()
    return ref, out


def test_correct_kernels_agree_and_planted_bugs_do_not():
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(4))
    _, out = _kernels_on(x.float())
    assert torch.allclose(out["manual"], out["fused"], atol=1e-6)
    for bug in ("manual, scale bug", "fused, mask bug", "fused, norm bug"):
        assert not torch.allclose(out["manual"], out[bug], atol=1e-4), bug


def test_manual_attention_is_the_textbook_formula_in_float64():
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    att = char_model.Attention(8, 2).double()
    q, k, v = att.qkv(x).chunk(3, dim=-1)
    ys = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        s = q[0, :, sl] @ k[0, :, sl].T / math.sqrt(4)
        s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
        ys.append(F.softmax(s, -1) @ v[0, :, sl])
    want = att.out(torch.cat(ys, -1))[None]
    assert torch.allclose(att(x), want, rtol=0, atol=1e-12)


def test_bad_kernel_and_shape_are_named():
    with pytest.raises(ValueError, match="kernel must be one of"):
        char_model.Attention(8, 2, "flash")
    with pytest.raises(ValueError, match="d must be a multiple of heads"):
        char_model.CharTransformer(10, d=10, heads=4)
    with pytest.raises(ValueError, match="steps and batch must be positive"):
        char_model.train(torch.zeros(100, dtype=torch.long), 2, steps=0)


def test_stored_model_loads_exactly_and_names_its_run():
    meta, model = char_model.load_trained(STORED)
    assert meta["command"].startswith("python3 scripts/ch8_char_model.py")
    assert meta["steps"] == len(meta["losses"]) == 100 and not model.training
    import numpy as np

    with np.load(STORED.with_suffix(".npz")) as z:
        for k, v in model.state_dict().items():
            assert np.array_equal(v.numpy(), z[k]) and v.dtype == torch.float32


def test_stored_model_refuses_another_text(tmp_path, monkeypatch):
    doc = json.loads(STORED.read_text())
    doc["corpus_sha256"] = "0" * 64
    (tmp_path / STORED.name).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="trained on another text"):
        char_model.load_trained(tmp_path / STORED.name)


def test_training_here_reaches_the_stored_loss():
    # The stored weights are one CPU's; here the run rounds in its own order, so the
    # losses agree to the rounding's growth over 100 steps, not bit for bit.
    meta, stored = char_model.load_trained(STORED)
    chars, data = char_model.encode(char_model.text())
    model, losses = char_model.train(data, len(chars), seed=meta["seed"], steps=meta["steps"],
                                     batch=meta["batch"], lr=meta["lr"])
    assert losses[0] == pytest.approx(meta["losses"][0], rel=1e-5)  # the same first step
    assert losses[-1] == pytest.approx(meta["losses"][-1], rel=0.02)
    probe = char_model.windows(data, 16, torch.Generator().manual_seed(9))
    with torch.no_grad():
        here, there = (char_model.next_char_loss(m(probe), probe) for m in (model, stored))
    assert float(here) == pytest.approx(float(there), rel=0.02)


def test_chapter_reads_the_stored_model_and_text():
    cells = json.loads(CHAPTER.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "char_model.text()" in code and "__doc__" not in code
    assert 'load_trained(rl.find_stored("ch8_char_model.json"))' in code
    assert "opt.step()" not in code.split("diagnose.watch")[0]  # no live training run


def test_script_check_reports_whether_the_docstrings_moved(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ch8_char_model.py"),
                           "--check-corpus"], capture_output=True, text=True, cwd=tmp_path)
    same = char_model.text() == char_model.from_docstrings()
    assert done.returncode == (0 if same else 1), done.stderr
    assert ("the same as" if same else "differs from") in done.stdout
