"""precisionlab: small, explicit simulations of floating-point formats, rounding and
reduced-precision training, written to accompany the book "Numerics Under Pressure".

Submodules are imported explicitly by the code that needs them, for example
``from precisionlab import formats``.
"""

__version__ = "0.1.0"
