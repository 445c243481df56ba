"""torch functions scorch runs on dense copies of its SparseTensor arguments at the
``__torch_function__`` level, before autograd and ``__torch_dispatch__`` see them.

Most ops without a sparse form reach :func:`scorch._dispatch.dense_fallback` as aten ops, which
is right for most of them.  For these it is not:

* ``linalg.pinv`` / ``pinverse`` and ``linalg.lstsq``: inside any ``__torch_dispatch__`` (a
  subclass or a mode), the complex kernels use their internal conjugate view ``.mH()``
  unconjugated (pytorch#198118: ``x @ pinv(A) @ x != x``, and lstsq's backward, which calls
  pinv, was wrong).  Here the aten op never runs under scorch's dispatch.
* ``linalg.householder_product`` / ``orgqr`` / ``ormqr``: autograd saved the sparse input and
  torch's backward writes into it (``tril_``), which scorch refuses; here autograd saves the
  dense copy.
* ``F.gaussian_nll_loss`` (a loss: dense by definition): torch's body clamps a clone of ``var``
  in place, which on a SparseTensor changes the stored values only (README), so the absent
  zeros stayed 0 and gave log(0): NaN.

The dense copies are ``to_dense()``: differentiable, a SparseTensor leaf receiving its gradient
in its own pattern.  The linalg ops keep the fallback's rules (``config.dense_fallback``'s
warning or refusal, its size limit); the loss is dense whatever its operands, so it only checks
the size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import dense_fallback, densified, implements

__all__: list = []


def _fallback_first(func):
    """``func`` on the dense copies, under the dense fallback's rules (a warning once, or a refusal
    with ``config.dense_fallback = 'raise'``, and its size limit)."""
    def run(*args, **kwargs):
        return dense_fallback(func, args, kwargs)
    run.__name__ = run.__qualname__ = getattr(func, "__name__", "on_dense")
    run.__doc__ = f"``{run.__name__}`` on the dense copies of its sparse arguments (see :mod:`{__name__}`)."
    return run


def _dense_by_definition(func):
    """``func`` on the dense copies, its result dense anyway (only the size limit applies)."""
    def run(*args, **kwargs):
        return densified(func, args, kwargs)
    run.__name__ = run.__qualname__ = getattr(func, "__name__", "on_dense")
    run.__doc__ = f"``{run.__name__}``: dense by definition, on the dense copies (see :mod:`{__name__}`)."
    return run


for _funcs in ((torch.linalg.pinv,), (torch.pinverse, torch.Tensor.pinverse), (torch.linalg.lstsq,),
               (torch.linalg.householder_product,), (torch.orgqr, torch.Tensor.orgqr),
               (torch.ormqr, torch.Tensor.ormqr)):
    for _f in _funcs:
        implements(_f)(_fallback_first(_f))

implements(F.gaussian_nll_loss)(_dense_by_definition(F.gaussian_nll_loss))
