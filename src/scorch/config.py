"""Process-wide settings.  Set them as attributes: ``scorch.config.dense_fallback = "raise"``.

dense_fallback
    What happens when a torch op without a sparse implementation meets a
    SparseTensor: ``"warn"`` (default: densify, run torch's op, warn once per
    op name), ``"silent"`` (densify without a warning) or ``"raise"``.
"""

dense_fallback = "warn"

_FALLBACK_CHOICES = ("warn", "silent", "raise")
