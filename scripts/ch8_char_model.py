"""Train chapter 8's character transformer once and store it, with its training text.

Chapter 8 diagnoses a small character transformer (precisionlab.chapters.char_model) trained
for 100 float32 AdamW steps on the module docstrings of nine precisionlab concepts. Both are
stored, so that every machine diagnoses the same model:

* the weights, in data/ch8_char_model.json (command, versions, CPU and torch's dispatch
  level, losses) and .npz (the state_dict, exact float32): torch picks its float32 kernels
  (and MKL its matrix products) for the processor's instruction set, and they round
  differently, so the same training run ends on other weights under another instruction set,
  and the chapter's checked claims moved with them;
* the text, src/precisionlab/chapters/char_corpus.txt (package data): read live, each edit
  of those docstrings retrained the model on other text. It is rewritten only with --corpus.

Rerunning this script on a machine with other kernels (another dispatch level, torch or MKL
build) stores other weights; re-execute chapter 8 after it (its hidden checks state what must
hold on any weights the run gives). With the same kernels, one thread, it stores the same bits.

Run (from the repository root):

    python3 scripts/ch8_char_model.py                 # train on the stored text, store weights
    python3 scripts/ch8_char_model.py --corpus        # first rewrite the text from the docstrings
    python3 scripts/ch8_char_model.py --check-corpus  # exit 1 if the docstrings moved since
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from precisionlab import rl
from precisionlab.chapters import char_model

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "ch8_char_model.json"
CORPUS = ROOT / "src" / "precisionlab" / "chapters" / char_model.FILE
SEED, STEPS, BATCH, LR = 0, 100, 16, 3e-3


def _cpu() -> str:
    """The CPU's model name (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--corpus", action="store_true",
                      help="rewrite the stored text from the live docstrings, then train")
    what.add_argument("--check-corpus", action="store_true",
                      help="only report whether the live docstrings differ from the stored text")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the .json to write ({OUT})")
    args = parser.parse_args(argv)
    live = char_model.from_docstrings()
    if args.check_corpus:
        same = CORPUS.read_text(encoding="utf-8") == live
        print(f"{CORPUS.name}: {'the same as' if same else 'differs from'} the live "
              f"docstrings ({len(live)} characters)")
        return 0 if same else 1
    if args.corpus:
        CORPUS.write_text(live, encoding="utf-8")
        print(f"wrote {CORPUS} ({len(live)} characters, {len(set(live))} distinct)")
    torch.set_num_threads(1)  # what chapter 8 uses; tiny tensors
    chars, data = char_model.encode(char_model.text())
    start = time.perf_counter()
    model, losses = char_model.train(data, len(chars), seed=SEED, steps=STEPS, batch=BATCH,
                                     lr=LR)
    seconds = time.perf_counter() - start
    meta = {**rl.provenance(sys.argv if argv is None else ["scripts/ch8_char_model.py", *argv]),
            "cpu": _cpu(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": 1, "seed": SEED, "steps": STEPS, "batch": BATCH,
            "lr": LR, "vocab": len(chars), "losses": losses,
            "note": "chapter 8's character transformer after train(); see "
                    "scripts/ch8_char_model.py"}
    char_model.save_trained(args.out, model, meta)
    print(f"trained {STEPS} steps in {seconds:.1f} s on {meta['cpu']}: loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}; wrote {args.out} and .npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
