"""Sparsifiers and ``SparsityBuilder``: make an existing dense model's weights sparse (seed 002, STen).

A sparsifier decides which entries of a dense tensor to keep (:meth:`Sparsifier.mask`) and
builds the SparseTensor holding them (calling it).  ``SparsityBuilder`` rewrites a model's
chosen parameters into ``nn.Parameter(SparseTensor)`` -- the forward then runs scorch's
kernels (``F.linear``, convolutions, embeddings, einsum...), and training keeps each pattern
(the gradient of a SparseTensor is a SparseTensor in its pattern; optimizers update the
stored values).

>>> import torch, scorch
>>> from scorch.sparsify import SparsityBuilder, ScalarFractionSparsifier
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> sb = SparsityBuilder(model)
>>> sb.set_weight("0.weight", initial_sparsifier=ScalarFractionSparsifier(0.75), out_format="csr")
>>> sparse_model = sb.get_sparse_model()
>>> sparse_model[0].weight.nnz
16
>>> sparse_model(torch.randn(3, 8)).shape
torch.Size([3, 2])
"""

from __future__ import annotations

import copy
import difflib
import math
import numbers

import numpy as np
import torch
from torch import nn

from .errors import ScorchError, ScorchTypeError, ScorchValueError
from .format import check_format, resolve
from .interop import from_coo
from .tensor import SparseTensor

__all__ = ["Sparsifier", "KeepAll", "RandomFractionSparsifier", "ScalarThresholdSparsifier",
           "ScalarFractionSparsifier", "BlockFractionSparsifier", "PerBlockNMSparsifier", "SparsityBuilder"]


def _real(value):
    """``value`` as a Python number if it is a real one (numpy scalars and 0-d tensors are; a bool
    is not: ``True`` as a fraction is a slip), else None.  Integral stays int (block sizes)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.is_complex():
            return None
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def as_int(value):
    """``value`` as a Python int if it is an integral number (numpy ints and 0-d int tensors too), else None."""
    v = _real(value)
    return v if isinstance(v, int) else None


def _fraction(name: str, value) -> float:
    v = _real(value)
    if v is None or not 0 <= v <= 1:
        raise ScorchValueError(f"{name}: fraction must be a number in [0, 1], got {value!r}")
    return float(v)


def _magnitude_key(name: str, w: torch.Tensor) -> torch.Tensor:
    """A tensor ordered exactly as ``|w|``.  Floats: ``w.abs()``.  Integers and bools: ``|w| - 1``
    in int64 (``~w`` for negative ``w``), since ``abs`` wraps at a signed dtype's minimum
    (``abs(int8 -128) == -128``) and int64's ``|min|`` fits no int64; a bool's ``|True|`` is 1."""
    if w.is_floating_point() or w.is_complex():
        return w.abs()
    if w.dtype == torch.uint64:   # its values above int64's max would wrap in int64
        raise ScorchTypeError(f"{name}: a uint64 tensor is not supported (its magnitudes overflow int64); "
                              "convert it to int64 or float64")
    w = w.to(torch.int64)
    return torch.where(w < 0, ~w, w - 1)


def _at_least(name: str, w: torch.Tensor, threshold: float) -> torch.Tensor:
    """``|w| >= threshold`` computed exactly: integers compare with ``ceil(threshold)`` in int64
    (comparing with a float would round large ints, and ``abs`` wraps at the dtype's minimum)."""
    if w.is_floating_point() or w.is_complex():
        return w.abs() >= threshold
    if math.isinf(threshold):
        return torch.zeros(w.shape, dtype=torch.bool)
    bound = math.ceil(threshold) - 1   # |w| >= ceil(t)  <=>  |w| - 1 >= ceil(t) - 1
    if bound > torch.iinfo(torch.int64).max:
        return torch.zeros(w.shape, dtype=torch.bool)
    return _magnitude_key(name, w) >= bound


def _block_sums(name: str, w: torch.Tensor, split: list, dims: tuple) -> torch.Tensor:
    """One ``sum |w|`` per block, in a type that neither overflows nor wraps: float64 for floats
    (float16 sums reached inf: blocks of different sums tied), for integers the exact int64 sum of
    ``|w| - 1`` (the same order: every block has as many entries) unless it could overflow, then float64."""
    if w.is_floating_point() or w.is_complex():
        return w.abs().to(torch.float64).reshape(split).sum(dim=dims)
    key = _magnitude_key(name, w)
    per_block = math.prod(split[d] for d in dims)
    biggest = int(key.abs().max()) + 1 if key.numel() else 0
    if biggest * per_block < 2 ** 63:
        return key.reshape(split).sum(dim=dims)
    return (key.to(torch.float64) + 1).reshape(split).sum(dim=dims)


def _dense(name: str, tensor) -> torch.Tensor:
    if isinstance(tensor, SparseTensor):
        tensor = tensor.to_dense()
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        raise ScorchTypeError(f"{name}: expects a dense torch.Tensor (or a SparseTensor), got {type(tensor).__name__}")
    return tensor


def _smallest(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """A bool mask of ``scores``' shape, False on the ``round(fraction * numel)`` smallest (ties:
    the earlier position first, so the result is deterministic)."""
    drop = round(fraction * scores.numel())
    keep = torch.ones(scores.numel(), dtype=torch.bool)
    if drop:
        keep[torch.argsort(scores.reshape(-1), stable=True)[:drop]] = False
    return keep.view(scores.shape)


class Sparsifier:
    """Chooses the entries of a dense tensor to keep; ``sparsifier(w, format)`` stores exactly
    those (an exact zero among them stays stored) as a SparseTensor in ``format`` -- in the
    autograd graph when ``w`` requires grad (a sparsified activation passes gradients back at the
    kept entries).  A blocked format (BSR, a schedule's ``.block()``) stores whole blocks: every
    block holding a kept entry is stored with its other entries as explicit zeros, and those train
    like the rest (the block is the unit of sparsity; choose blocks with a block sparsifier, e.g.
    ``BlockFractionSparsifier``, when that is the intent)."""

    def mask(self, tensor: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, tensor, format="csr") -> SparseTensor:
        w = _dense(type(self).__name__, tensor)
        keep = _mask(type(self).__name__, self.mask(w.detach()), w)
        return from_coo(keep.nonzero().t(), w[keep], tuple(w.shape), format=format)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _mask(name: str, keep, w: torch.Tensor) -> torch.Tensor:
    """What ``mask()`` returned as a bool tensor of ``w``'s shape: a bool mask as is, a numeric one
    (torch.ao.pruning's 0/1 floats) kept where nonzero."""
    if isinstance(keep, SparseTensor) or (isinstance(keep, torch.Tensor) and keep.layout != torch.strided):
        keep = keep.to_dense()   # a scorch or torch.sparse mask
    elif isinstance(keep, np.ndarray):
        keep = torch.from_numpy(keep)
    if not isinstance(keep, torch.Tensor):
        raise ScorchTypeError(f"{name}.mask() must return a tensor, got {type(keep).__name__}")
    if tuple(keep.shape) != tuple(w.shape):
        raise ScorchValueError(f"{name}.mask() must return a mask of the tensor's shape {tuple(w.shape)}, "
                               f"got shape {tuple(keep.shape)}")
    return keep if keep.dtype == torch.bool else keep != 0


class KeepAll(Sparsifier):
    """Every nonzero entry (the tensor's own sparsity)."""

    def mask(self, tensor):
        return _dense("KeepAll", tensor) != 0


class RandomFractionSparsifier(Sparsifier):
    """Drops ``fraction`` of the entries, chosen uniformly at random (torch's global RNG, or
    ``generator``), exactly ``round(fraction * numel)`` of them."""

    def __init__(self, fraction: float, generator: torch.Generator | None = None):
        self.fraction = _fraction("RandomFractionSparsifier", fraction)
        if generator is not None and not isinstance(generator, torch.Generator):   # (else refused only at mask())
            raise ScorchTypeError(f"RandomFractionSparsifier: generator must be a torch.Generator or None, got "
                                  f"{type(generator).__name__}")
        self.generator = generator

    def mask(self, tensor):
        w = _dense("RandomFractionSparsifier", tensor)
        return _smallest(torch.rand(w.shape, generator=self.generator), self.fraction)


class ScalarThresholdSparsifier(Sparsifier):
    """Keeps the entries with ``|w| >= threshold`` (a ReLU-like cut on magnitudes)."""

    def __init__(self, threshold: float):
        t = _real(threshold)
        if t is None or not t >= 0:
            raise ScorchValueError(f"ScalarThresholdSparsifier: threshold must be a number >= 0, got {threshold!r}")
        self.threshold = float(t)

    def mask(self, tensor):
        w = _dense("ScalarThresholdSparsifier", tensor)
        return _at_least("ScalarThresholdSparsifier", w, self.threshold) & (w != 0)


class ScalarFractionSparsifier(Sparsifier):
    """Magnitude pruning: drops the ``fraction`` of the entries with the smallest ``|w|``
    (``ScalarFractionSparsifier(0.9)``: 90% zeros)."""

    def __init__(self, fraction: float):
        self.fraction = _fraction("ScalarFractionSparsifier", fraction)

    def mask(self, tensor):
        return _smallest(_magnitude_key("ScalarFractionSparsifier", _dense("ScalarFractionSparsifier", tensor)),
                         self.fraction)


class BlockFractionSparsifier(Sparsifier):
    """Block magnitude pruning: tiles the tensor into blocks of ``block_shape`` (one size per
    dim, dividing it) and drops the ``fraction`` of blocks with the smallest sum of ``|w|``."""

    def __init__(self, fraction: float, block_shape):
        self.fraction = _fraction("BlockFractionSparsifier", fraction)
        shape = (block_shape,) if as_int(block_shape) is not None else tuple(block_shape)
        sizes = tuple(as_int(b) for b in shape)
        if not sizes or any(b is None or b < 1 for b in sizes):
            raise ScorchValueError(f"BlockFractionSparsifier: block_shape must be positive ints, got {block_shape!r}")
        self.block_shape = sizes

    def mask(self, tensor):
        w = _dense("BlockFractionSparsifier", tensor)
        b = self.block_shape
        if len(b) != w.dim() or any(n % k for n, k in zip(w.shape, b)):
            raise ScorchValueError(f"BlockFractionSparsifier: block_shape {b} must have one size per dim of the "
                                   f"tensor's shape {tuple(w.shape)}, each dividing it")
        split = [s for n, k in zip(w.shape, b) for s in (n // k, k)]
        norms = _block_sums("BlockFractionSparsifier", w, split, tuple(range(1, 2 * w.dim(), 2)))   # one per block
        keep = _smallest(norms, self.fraction)
        for d, k in enumerate(b):
            keep = keep.repeat_interleave(k, dim=d)
        return keep


class PerBlockNMSparsifier(Sparsifier):
    """n:m sparsity: of every ``m`` consecutive entries along the last dim (its size a multiple
    of ``m``), keeps the ``n`` of largest ``|w|``."""

    def __init__(self, n: int, m: int):
        n_, m_ = as_int(n), as_int(m)
        if n_ is None or m_ is None or not 0 <= n_ <= m_ or m_ < 1:
            raise ScorchValueError(f"PerBlockNMSparsifier: needs ints 0 <= n <= m, m >= 1, got n={n!r}, m={m!r}")
        self.n, self.m = n_, m_

    def mask(self, tensor):
        w = _dense("PerBlockNMSparsifier", tensor)
        if w.dim() == 0 or w.shape[-1] % self.m:
            raise ScorchValueError(f"PerBlockNMSparsifier: the last dim of shape {tuple(w.shape)} must be a "
                                   f"multiple of m={self.m}")
        groups = _magnitude_key("PerBlockNMSparsifier", w).reshape(-1, self.m)
        keep = torch.zeros(groups.shape, dtype=torch.bool)
        if self.n:
            keep.scatter_(1, groups.topk(self.n, dim=1, sorted=False).indices, True)
        return keep.view(w.shape)


def _same_state(a: dict, b: dict) -> bool:
    """Equal attribute dicts: two sparsifiers holding equal state are one spec."""
    return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)


def _same_value(v, w) -> bool:
    """``v`` equals ``w`` structurally: tensors and arrays by value (NaN equal to NaN, as a copied
    sparsifier's NaN is the same setting), lists / tuples / dicts item by item.  ``v != w`` is no
    bool for arrays or lists of tensors, and NaN != NaN refused two equal sparsifiers."""
    if v is w:
        return True
    if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor):
        return isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) and _same_tensor(v, w)
    if isinstance(v, np.ndarray) or isinstance(w, np.ndarray):
        return isinstance(v, np.ndarray) and isinstance(w, np.ndarray) and _same_array(v, w)
    if isinstance(v, (list, tuple)) or isinstance(w, (list, tuple)):
        return type(v) is type(w) and len(v) == len(w) and all(map(_same_value, v, w))
    if isinstance(v, dict) or isinstance(w, dict):
        return isinstance(v, dict) and isinstance(w, dict) and _same_state(v, w)
    if isinstance(v, numbers.Real) and isinstance(w, numbers.Real) and math.isnan(v) and math.isnan(w):
        return True
    try:
        return bool(v == w)
    except (ValueError, RuntimeError, TypeError):   # an == that is no bool: unknown, so a conflict
        return False


def _same_tensor(v: torch.Tensor, w: torch.Tensor) -> bool:
    """Tensors of one shape and dtype with equal values, NaN equal to NaN."""
    if v.shape != w.shape or v.dtype != w.dtype:
        return False
    v, w = (t.to_dense() if isinstance(t, SparseTensor) or t.layout != torch.strided else t for t in (v, w))
    v, w = v.detach(), w.detach()
    if v.is_floating_point() or v.is_complex():
        return bool(((v == w) | (v.isnan() & w.isnan())).all())
    return torch.equal(v, w)


def _same_array(v: np.ndarray, w: np.ndarray) -> bool:
    """numpy arrays as tensors; arrays of objects or strings item by item."""
    if v.dtype != w.dtype or v.shape != w.shape:
        return False
    if v.dtype.kind in "biufc":
        return _same_tensor(torch.from_numpy(np.ascontiguousarray(v)), torch.from_numpy(np.ascontiguousarray(w)))
    return all(map(_same_value, v.ravel().tolist(), w.ravel().tolist()))


def _one_spec(method: str, kind: str, specs: dict, objects: dict, name: str, spec, ndim) -> None:
    """Refuse a spec for ``name`` that differs from one set under another name of the same object
    (a tied parameter, a module registered twice): the object gets one."""
    (sparsifier, fmt) = spec
    for other, (prev, prev_fmt) in specs.items():
        if other == name or objects.get(other) is not objects[name]:
            continue   # (a name the model no longer has: get_sparse_model reports it)
        same = prev is sparsifier or (type(prev) is type(sparsifier) and _same_state(vars(prev), vars(sparsifier)))
        if not (same and (prev_fmt == fmt if ndim is None else resolve(prev_fmt, ndim) == resolve(fmt, ndim))):
            raise ScorchValueError(f"SparsityBuilder.{method}: {name!r} is the same {kind} as {other!r}, set "
                                   "already with another sparsifier or format; a shared "
                                   f"{kind} takes one (set it under one name)")


class SparsityBuilder:
    """Rewrites chosen parameters of a model into sparse ones (STen's ``SparsityBuilder``)::

        sb = SparsityBuilder(model)
        sb.set_weight("attention.self.query.weight", initial_sparsifier=ScalarFractionSparsifier(0.9),
                      out_format="csr")
        sparse_model = sb.get_sparse_model()   # a copy; ``model`` is left as it was

    Each chosen parameter becomes ``nn.Parameter(SparseTensor)`` holding what its sparsifier
    keeps; a parameter shared by several modules stays shared."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise ScorchTypeError(f"SparsityBuilder: model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._weights: dict = {}
        self._interms: dict = {}

    def set_weight(self, name: str, initial_sparsifier: Sparsifier | None = None, out_format="csr") -> None:
        """Make parameter ``name`` (as ``model.named_parameters()`` spells it) sparse: the entries
        ``initial_sparsifier`` keeps (:class:`KeepAll` by default) in ``out_format`` (a preset
        name or a :class:`~scorch.Format`)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        if name not in params:
            raise ScorchValueError(f"SparsityBuilder.set_weight: the model has no parameter {name!r}"
                                   f"{parametrized_hint(self.model, name) or did_you_mean(name, params)}")
        sparsifier = _checked("set_weight", KeepAll() if initial_sparsifier is None else initial_sparsifier,
                              out_format)
        if isinstance(params[name], SparseTensor):
            raise ScorchValueError(f"SparsityBuilder.set_weight: parameter {name!r} is sparse already")
        shape = tuple(params[name].shape)
        fmt = resolve(out_format, len(shape), arg=f"SparsityBuilder.set_weight: out_format for {name!r}")
        if fmt.block and any(n % b for n, b in zip(shape, fmt.block)):
            raise ScorchValueError(f"SparsityBuilder.set_weight: out_format {fmt} for {name!r}: its block size "
                                   f"{fmt.block} does not divide the parameter's shape {shape}")
        _one_spec("set_weight", "parameter", self._weights, params, name, (sparsifier, out_format), len(shape))
        self._weights[name] = (sparsifier, out_format)

    def set_interm(self, name: str, sparsifier: Sparsifier, out_format="csr") -> None:
        """Make the output of submodule ``name`` (as ``model.named_modules()`` spells it; a module
        registered under several names is one module, sparsified at its every use) sparse on
        every forward: the entries ``sparsifier`` keeps of that call's output, in ``out_format``
        (a name adapts to the output's dims) -- dynamic sparsity; gradients pass back at the kept
        entries.  The next modules take the SparseTensor (scorch's ops)."""
        modules = dict(self.model.named_modules(remove_duplicate=False))
        if name not in modules or name == "":
            raise ScorchValueError(f"SparsityBuilder.set_interm: the model has no submodule {name!r}"
                                   f"{did_you_mean(name, [m for m in modules if m])}")
        spec = (_checked("set_interm", sparsifier, out_format), out_format)
        _one_spec("set_interm", "submodule", self._interms, modules, name, spec, None)
        self._interms[name] = spec

    def get_sparse_model(self) -> nn.Module:
        """A deep copy of the model with every parameter named in :meth:`set_weight` sparse."""
        model = copy.deepcopy(self.model)
        owners: dict = {}   # id(parameter) -> every (module, attribute) holding it (tied weights)
        for module in model.modules():
            for attr, p in module._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((module, attr))
        params = dict(model.named_parameters(remove_duplicate=False))
        for name, (sparsifier, fmt) in self._weights.items():
            if name not in params:   # (the model changed after set_weight)
                raise ScorchValueError(f"SparsityBuilder.get_sparse_model: parameter {name!r}, given to set_weight, "
                                       f"is no longer in the model{did_you_mean(name, params)}")
            old = params[name]
            if isinstance(old, SparseTensor):
                continue   # a tied parameter set under another name too
            with _naming(f"SparsityBuilder: parameter {name!r}"):
                new = nn.Parameter(sparsifier(old.detach(), fmt), requires_grad=old.requires_grad)
            for module, attr in owners[id(old)]:
                setattr(module, attr, new)
            for key in [k for k, p in params.items() if p is old]:
                params[key] = new
        hooked = set()   # a module registered under several names: one hook, on its every use
        modules = dict(model.named_modules(remove_duplicate=False))
        for name, (sparsifier, fmt) in self._interms.items():
            if name not in modules:
                raise ScorchValueError(f"SparsityBuilder.get_sparse_model: submodule {name!r}, given to set_interm, "
                                       f"is no longer in the model{did_you_mean(name, [m for m in modules if m])}")
            module = modules[name]
            if id(module) not in hooked:
                hooked.add(id(module))
                module.register_forward_hook(_SparsifyOutput(name, sparsifier, fmt))
        return model


def parametrized_hint(model: nn.Module, name: str) -> str:
    """For ``name`` = ``'mod.attr'`` where ``attr`` of ``mod`` is parametrized (torch.nn.utils.parametrize):
    a hint at the parameter(s) that hold it; ``'mod.weight'`` is then a computed property, no parameter."""
    prefix, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(prefix)
    except AttributeError:
        return ""
    holders = getattr(module, "parametrizations", None)
    if holders is None or attr not in holders:
        return ""
    base = f"{prefix}." if prefix else ""
    names = [f"{base}parametrizations.{attr}.{n}" for n, _ in holders[attr].named_parameters(recurse=False)]
    return f"; {name!r} is parametrized, held by the parameter {', '.join(map(repr, names))}"


class _naming:
    """Re-raise a scorch error from a sparsifier with ``where`` (the parameter or submodule) in front
    of its message, keeping its type; another error gets ``where`` as a note."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if isinstance(err, ScorchError):
            raise type(err)(f"{self.where}: {err}") from None
        if isinstance(err, Exception):
            err.add_note(f"(raised by the sparsifier of {self.where})")
        return False


def did_you_mean(name, names) -> str:
    """``"; did you mean 'a', 'b'?"`` for the names closest to ``name`` (empty when none is close)."""
    close = difflib.get_close_matches(str(name), list(names), n=3)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def _checked(method: str, sparsifier, out_format) -> Sparsifier:
    if not isinstance(sparsifier, Sparsifier):
        raise ScorchTypeError(f"SparsityBuilder.{method}: the sparsifier must be a scorch.sparsify Sparsifier, got "
                              f"{type(sparsifier).__name__}")
    check_format(out_format, arg=f"SparsityBuilder.{method}: out_format")
    return sparsifier


class _SparsifyOutput:
    """A forward hook: the module's output as ``sparsifier`` keeps it (a class, so that the sparse
    model deep-copies and pickles)."""

    def __init__(self, name: str, sparsifier: Sparsifier, fmt):
        self.name, self.sparsifier, self.fmt = name, sparsifier, fmt

    def __call__(self, module, inputs, output):
        if not isinstance(output, torch.Tensor):
            raise ScorchTypeError(f"set_interm: submodule {self.name!r} returned {type(output).__name__}; only a "
                                  "tensor output can be sparsified")
        # (a block size that does not divide this call's output, a mask() of the wrong type, ...)
        with _naming(f"set_interm: submodule {self.name!r}'s output of shape {tuple(output.shape)}"):
            return self.sparsifier(output, self.fmt)

