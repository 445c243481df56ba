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

import torch
from torch import nn

from .errors import ScorchTypeError, ScorchValueError
from .format import check_format, resolve
from .interop import from_coo
from .tensor import SparseTensor

__all__ = ["Sparsifier", "KeepAll", "RandomFractionSparsifier", "ScalarThresholdSparsifier",
           "ScalarFractionSparsifier", "BlockFractionSparsifier", "PerBlockNMSparsifier", "SparsityBuilder"]


def _fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ScorchValueError(f"{name}: fraction must be a number in [0, 1], got {value!r}")
    return float(value)


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
    if isinstance(keep, SparseTensor):
        keep = keep.to_dense()
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
        self.generator = generator

    def mask(self, tensor):
        w = _dense("RandomFractionSparsifier", tensor)
        return _smallest(torch.rand(w.shape, generator=self.generator), self.fraction)


class ScalarThresholdSparsifier(Sparsifier):
    """Keeps the entries with ``|w| >= threshold`` (a ReLU-like cut on magnitudes)."""

    def __init__(self, threshold: float):
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
            raise ScorchValueError(f"ScalarThresholdSparsifier: threshold must be a number >= 0, got {threshold!r}")
        self.threshold = float(threshold)

    def mask(self, tensor):
        w = _dense("ScalarThresholdSparsifier", tensor)
        return (w.abs() >= self.threshold) & (w != 0)


class ScalarFractionSparsifier(Sparsifier):
    """Magnitude pruning: drops the ``fraction`` of the entries with the smallest ``|w|``
    (``ScalarFractionSparsifier(0.9)``: 90% zeros)."""

    def __init__(self, fraction: float):
        self.fraction = _fraction("ScalarFractionSparsifier", fraction)

    def mask(self, tensor):
        return _smallest(_dense("ScalarFractionSparsifier", tensor).abs(), self.fraction)


class BlockFractionSparsifier(Sparsifier):
    """Block magnitude pruning: tiles the tensor into blocks of ``block_shape`` (one size per
    dim, dividing it) and drops the ``fraction`` of blocks with the smallest sum of ``|w|``."""

    def __init__(self, fraction: float, block_shape):
        self.fraction = _fraction("BlockFractionSparsifier", fraction)
        shape = (block_shape,) if isinstance(block_shape, int) else tuple(block_shape)
        if not shape or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in shape):
            raise ScorchValueError(f"BlockFractionSparsifier: block_shape must be positive ints, got {block_shape!r}")
        self.block_shape = shape

    def mask(self, tensor):
        w = _dense("BlockFractionSparsifier", tensor)
        b = self.block_shape
        if len(b) != w.dim() or any(n % k for n, k in zip(w.shape, b)):
            raise ScorchValueError(f"BlockFractionSparsifier: block_shape {b} must have one size per dim of the "
                                   f"tensor's shape {tuple(w.shape)}, each dividing it")
        split = [s for n, k in zip(w.shape, b) for s in (n // k, k)]
        norms = w.abs().reshape(split).sum(dim=tuple(range(1, 2 * w.dim(), 2)))   # one per block
        keep = _smallest(norms, self.fraction)
        for d, k in enumerate(b):
            keep = keep.repeat_interleave(k, dim=d)
        return keep


class PerBlockNMSparsifier(Sparsifier):
    """n:m sparsity: of every ``m`` consecutive entries along the last dim (its size a multiple
    of ``m``), keeps the ``n`` of largest ``|w|``."""

    def __init__(self, n: int, m: int):
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (n, m)) or not 0 <= n <= m or m < 1:
            raise ScorchValueError(f"PerBlockNMSparsifier: needs ints 0 <= n <= m, m >= 1, got n={n!r}, m={m!r}")
        self.n, self.m = n, m

    def mask(self, tensor):
        w = _dense("PerBlockNMSparsifier", tensor)
        if w.dim() == 0 or w.shape[-1] % self.m:
            raise ScorchValueError(f"PerBlockNMSparsifier: the last dim of shape {tuple(w.shape)} must be a "
                                   f"multiple of m={self.m}")
        groups = w.abs().reshape(-1, self.m)
        keep = torch.zeros(groups.shape, dtype=torch.bool)
        if self.n:
            keep.scatter_(1, groups.topk(self.n, dim=1, sorted=False).indices, True)
        return keep.view(w.shape)


def _same_state(a: dict, b: dict) -> bool:
    """Equal attribute dicts (tensors compared by value: ``==`` of two tensors is no bool)."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, torch.Tensor) or isinstance(w, torch.Tensor):
            if not (isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) and v.shape == w.shape
                    and v.dtype == w.dtype and torch.equal(v, w)):
                return False
        elif v is not w and v != w:
            return False
    return True


def _one_spec(method: str, kind: str, specs: dict, objects: dict, name: str, spec, ndim) -> None:
    """Refuse a spec for ``name`` that differs from one set under another name of the same object
    (a tied parameter, a module registered twice): the object gets one."""
    (sparsifier, fmt) = spec
    for other, (prev, prev_fmt) in specs.items():
        if other == name or objects[other] is not objects[name]:
            continue
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
                                   f"{did_you_mean(name, params)}")
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
            old = params[name]
            if isinstance(old, SparseTensor):
                continue   # a tied parameter set under another name too
            try:
                new = nn.Parameter(sparsifier(old.detach(), fmt), requires_grad=old.requires_grad)
            except ScorchValueError as e:
                raise ScorchValueError(f"SparsityBuilder: parameter {name!r}: {e}") from e
            for module, attr in owners[id(old)]:
                setattr(module, attr, new)
            for key in [k for k, p in params.items() if p is old]:
                params[key] = new
        hooked = set()   # a module registered under several names: one hook, on its every use
        for name, (sparsifier, fmt) in self._interms.items():
            module = model.get_submodule(name)
            if id(module) not in hooked:
                hooked.add(id(module))
                module.register_forward_hook(_SparsifyOutput(name, sparsifier, fmt))
        return model


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
        try:
            return self.sparsifier(output, self.fmt)
        except ScorchValueError as err:   # (a block size that does not divide this call's output, ...)
            raise ScorchValueError(f"set_interm: submodule {self.name!r}'s output of shape {tuple(output.shape)}: "
                                   f"{err}") from None

