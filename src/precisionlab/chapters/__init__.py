"""Chapter code: the measurements, runs and demonstrations one chapter makes of the concepts.

A concept (``scaling``, ``quantize``, ``intervals``, ``rl``, ...) is what a reader may reuse
on their own model; a module here is what one chapter does with it, and its docstring's first
lines say which chapter. Concepts never import this package (tests/test_layers.py checks);
``widgets`` and the notebooks do. Modules are imported by name, for example
``from precisionlab.chapters import quantize_runs``:

* ``underflow_runs`` -- chapter 4: its training probes, stored and replayed;
* ``scaling_runs`` -- chapters 4 and 5: a loss scaler in front of chapter 4's network, the
  AMP training loop, the scaler's decisions as a table;
* ``rl_findings`` -- chapter 6: the verdict rules on the source study's findings, the
  evidence from the book's runs, the tally;
* ``allclose_demos`` -- chapter 7: a dot product by hand with directed rounding, every
  summation order, a matmul with a bug of known size;
* ``char_model`` -- chapter 8: the character transformer it diagnoses, its stored training
  text and trained weights;
* ``quantize_runs`` -- chapter 9: what each FP8/MX/NVFP4 recipe keeps of the book's tensors,
  outlier channels, a layer trained under a recipe, delayed-scaling traces;
* ``at_scale`` -- chapter 10: a float32 training run whose gradient is all-reduced on
  1, 2, 4 or 8 ranks.
"""
