"""Named formats (presets).  Each is an ordinary :class:`scorch.Format`.

The constants are the 2-d forms.  A format *name* (``format="csr"``) passed
to any scorch function adapts to the tensor's number of dims instead: n-d
``csr`` keeps the outer dims dense (batched CSR), ``csf`` compresses every
level, ``coo`` is one nonunique level followed by singletons.

>>> import scorch
>>> scorch.formats.csr
Format([dense, compressed], name='csr')
>>> scorch.formats.bsr(2, 2).block
(2, 2)
"""

from .format import Format, bsc_format as bsc, bsr_format as bsr, preset

__all__ = ["dense", "coo", "csr", "csc", "dcsr", "dcsc", "ell", "csf", "bsr", "bsc", "preset", "NAMES"]

NAMES = ("dense", "coo", "csr", "csc", "dcsr", "dcsc", "csf", "ell", "bsr", "bsc")

dense = preset("dense", 2)
coo = preset("coo", 2)
csr = preset("csr", 2)
csc = preset("csc", 2)
dcsr = preset("dcsr", 2)
dcsc = preset("dcsc", 2)
ell = preset("ell", 2)


def csf(ndim: int = 3) -> Format:
    """Compressed sparse fiber: compressed at every level of an ``ndim``-d tensor."""
    return preset("csf", ndim)
