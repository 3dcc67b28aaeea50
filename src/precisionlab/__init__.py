"""precisionlab: small, explicit simulations of floating-point formats, rounding and
reduced-precision training, written to accompany the book "Numerics Under Pressure".

Submodules are imported explicitly by the code that needs them, for example
``from precisionlab import formats``. One room per concept; a concept too big for one file is
a folder whose ``__init__`` re-exports its public names and lists its files. From the ground
floor up; a module imports only from floors below its own:

1. ``checks`` -- argument checks; each error names the parameter, the bad value and the
   valid choices. ``formats`` -- ``FloatFormat``, the registry (float64 ... float4_e2m1fn),
   the one table of short names (``ALIASES``, ``short_name``) and which format's values
   contain another's (``contains``). ``exact`` -- exact float64 arithmetic: ``as_float64``,
   TwoSum and TwoProduct.
2. ``rounding`` -- fl(x) into a format in six modes (``round_to``), ``ulp``,
   ``next_up``/``next_down``, bit fields, and the one rounding-mode check;
   ``rounding_kernel``, its emulated recipe on bit patterns in Python, NumPy and numba
   tiers. ``tables`` -- the chapters' table printer and the format table.
3. ``quantize/`` -- scales at every grain for FP8/MX recipes: per-tensor current and
   delayed (amax history), per-block (MX, 1x128 and 128x128 tiles), two-level (NVFP4),
   with the shares that saturated, underflowed and landed subnormal. ``emulate/`` -- portable reduced-precision arithmetic with autograd: fixed-order
   matmul and sums, elementwise ops rounded once, the portable exp/log and normal sampler,
   optimizers, a quantized linear layer, and the numba kernels that mirror them; the same
   bits on every CPU.
   ``gpu/`` -- how GPUs add: reduction orders, matmuls, tensor cores, device profiles and
   ``Kernel`` (one description of how a sum or matmul runs). ``updates`` -- updates that a
   narrow weight format swallows, boundary crossings, weight-storage policies.
4. ``world/`` -- the differentiable bouncing ball whose solver's stopping rule runs in a
   chosen precision. ``rl/`` -- the toy policy, rollout engine, GRPO loss and the
   alpha/beta split, trainer, and the stored runs. ``scaling`` -- loss scalers with
   ``torch.amp.GradScaler``'s semantics. ``underflow`` -- gradient attenuation by depth and
   per-layer gradient health. ``intervals/`` -- interval arithmetic with outward rounding,
   per-operation bound rules, propagation and the round-off-or-bug verdict, and the
   labelled corpus; ``intervals/torch_ops/``, the bound rules for torch operations (the
   engine ``diagnose.triage`` runs).
5. ``mixed_precision`` -- a run's precision policy (autocast device and dtype, loss
   scaler) and low-precision weight storage. ``plotting/`` -- the house style and the
   figures (``ax=None`` in, the Axes out).
6. ``diagnose/`` -- the book's lessons pointed at the reader's own model: the four
   diagnoses and their reports, triage's tracing, pairing and checks (its bounds from
   ``intervals/torch_ops``). ``chapters/`` -- chapter code, each module named for what it
   is and saying which chapter it serves: ``scaling_runs`` (chapters 4 and 5: a scaler in
   front of the network, the AMP loop), ``rl_findings`` (chapter 6: the verdicts on the
   source's findings), ``allclose_demos`` (chapter 7: a dot product by hand, every order,
   a bug of known size), ``quantize_runs`` (chapter 9's measurements). No concept imports
   it; widgets and notebooks do.
7. ``widgets/`` -- the frame switcher (its JS and CSS are package data) and one view per
   chapter.
"""

__version__ = "1.0.0"
