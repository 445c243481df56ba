"""Differentiable einsum over dense and sparse operands.

The forward is the compiled kernel; the backward is again einsums, compiled
the same way.  The gradient of a sparse operand keeps its pattern: it is the
sampled product (SDDMM) of the output gradient and the other operands,
computed only at the operand's stored positions (never densified).  The
gradient of a dense operand is a dense einsum (summed back over broadcast
dims).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import torch
import torch.autograd.forward_ad as _fwAD

from .. import config, runtime
from .._memo import remember
from .._dispatch import check_dense_size, implements, with_autocast
from ..compiler import driver
from ..compiler.notation import parse, permutation
from ..errors import NotSupportedError, ScorchTypeError, ScorchValueError
from ..format import Format
from ..interop import is_torch_sparse
from ..tensor import SparseTensor, _above_autograd, _has_tangent, _legacy_vmap, _mode_stack, on_cpu
from ..tensor import _unwrapped as _without_wrappers
from ._pattern import in_pattern, project


def _front(guarded: bool):
    """``einsum`` (``guarded``: ``scorch.einsum``, which also keeps its work on the CPU under a
    torch-function mode -- ``with torch.device("meta")`` -- and gives a product with a sparse operand
    torch.autocast's dtype, as torch's own einsum does; scorch's ops call the unguarded one, whose
    sums must not take the autocast dtype).  One body, two functions: the guard costs the hot path
    one flag test, not a call layer."""
    def einsum(equation: str, *operands, format=None):
        """Einstein summation with sparse operands; differentiable w.r.t. dense operands and
        the values of sparse ones.  See :func:`scorch.compiler.einsum` for the result format.
        Without a sparse operand (and without ``format=`` or ``config.auto_sparsify``) it is
        ``torch.einsum`` itself, any form torch takes (sublists, any device).

        >>> import torch, scorch
        >>> A = scorch.as_sparse(torch.eye(2), "csr").requires_grad_()
        >>> scorch.einsum("ij,jk->ik", A, torch.ones(2, 3)).sum().backward()
        >>> A.grad.to_dense().tolist()
        [[3.0, 0.0], [0.0, 3.0]]
        """
        if guarded and (_mode_stack() or _autocast_on()):   # (rare)
            run = functools.partial(with_autocast, _plain, equation, *operands, format=format)
            return on_cpu(run) if _mode_stack() else run()
        if format is None and len(operands) == 2 and type(equation) is str:
            out = _cached(equation, operands)
            if out is not None:
                return out
        if not isinstance(equation, str):   # torch's sublist form: torch makes the equation, then dispatches
            if format is not None:
                raise ScorchValueError("einsum: format= needs the equation-string form, not sublists")
            return torch.einsum(equation, *operands)
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        for x in operands:   # (a loop: the usual call has a SparseTensor first, 0.3 us under any())
            if isinstance(x, SparseTensor):
                return _einsum(equation, operands, format, ())
        if format is None and not config.auto_sparsify:
            try:   # torch.sparse operands alone: torch's result where torch computes one, else scorch's
                return torch.einsum(equation, *operands)
            except (RuntimeError, NotImplementedError):
                if not any(map(is_torch_sparse, operands)):
                    raise
        out = _einsum(equation, operands, format, ())
        if format is None and isinstance(out, SparseTensor) and not any(map(is_torch_sparse, operands)):
            return out.to_dense()   # auto_sparsify ran dense operands sparse: the result is torch's kind, dense
        return out

    return einsum


_autocast_on = torch._C._is_any_autocast_enabled
einsum = _plain = _front(False)
public_einsum = _front(True)

try:   # TorchScript compiles a call of scorch.einsum (`import scorch as torch`) as aten::einsum
    torch.jit._builtins._register_builtin(public_einsum, "aten::einsum")
except AttributeError:   # pragma: no cover - another torch layout: scripting such calls fails as before
    pass


def _einsum(equation: str, operands, format, init):
    """The dispatch shared by ``einsum`` and ``einsum_add``: dense torch, the autograd
    function, or the compiled kernel directly."""
    operands, init = tuple(runtime.maybe_sparsify(operands)), tuple(init)
    if format is not None and not isinstance(format, (str, Format)):   # (before it keys a cache: unhashable)
        raise ScorchTypeError(f"einsum: format must be a format name (str) or a scorch.Format, got "
                              f"{type(format).__name__}")
    equation, operands = _diagonals(equation, operands)
    if len(operands) == 1 and not init and type(operands[0]) is SparseTensor \
            and (perm := permutation(equation, operands[0].dim())) is not None:
        out = operands[0].permute(perm)  # "ij->ji": a sparse transpose, not a scatter into a dense result
        return driver._finish(out, out._vals.dtype, format)
    key = driver._signature(equation, format, operands, init)  # once per call: dispatch and kernel caches
    for x in operands:   # a size-1 dim of a sparse operand may broadcast (a loop: ~0.1 us; a second
        if type(x) is SparseTensor and 1 in x._shape:   # lookup of the long key costs more)
            operands = _broadcast_sparse(equation, operands)
            key = driver._signature(equation, format, operands, init)
            break
    for x in operands:   # (a loop, as above): complex values, of a sparse operand or a dense one beside it
        if (x._vals.dtype if type(x) is SparseTensor else getattr(x, "dtype", torch.float32)).is_complex:
            return _complex(equation, operands, format, init)
    if _dense_path(equation, operands, format, key):
        dense = [x.to_dense() if isinstance(x, SparseTensor) else x for x in driver._operands(operands)]
        common = functools.reduce(torch.promote_types, [x.dtype for x in dense])
        out = torch.einsum(equation, *[x.to(common) for x in dense])   # (scorch's kernels promote: so here)
        return driver._add_init(out, init)   # (one by one: sum(init) started from 0, making bools int64)
    tensors = operands + init
    if _fwAD._current_level >= 0 and _above_autograd() and any(
            type(x) is SparseTensor and _fwAD.unpack_dual(x._vals).tangent is not None for x in operands):
        return _dual_values(equation, operands, format, init)
    if (torch.is_grad_enabled() and _any_requires_grad(tensors)) or _functorch_level() is not None \
            or (_fwAD._current_level >= 0 and _dual(tensors)):   # (torch.func transforms: the Function's rules)
        return _Einsum.apply(equation, format, len(init), *driver._operands(operands), *init)
    return driver.run(key, equation, operands, format, init)


_functorch_level = torch._C._functorch.maybe_current_level   # None outside torch.func transforms


def _complex(equation: str, operands: tuple, format, init: tuple):
    """An einsum with a complex sparse operand (the kernels compute real values): it is linear in
    each operand, so it is the sum, over a choice of real or imaginary part of every complex
    operand, of the real einsum of those parts times i ** (imaginary parts chosen); differentiable
    through ``real`` / ``imag`` and ``torch.complex``, as torch's complex autograd defines."""
    from ._pattern import same_pattern
    ops = driver._operands(operands)
    choices = [((x.real, 0), (x.imag, 1)) if x.dtype.is_complex else ((x, 0),) for x in ops]
    parts = [None, None]   # the real and imaginary sums
    for combo in itertools.product(*choices):
        k = sum(p for _, p in combo) % 4
        term = einsum(equation, *[t for t, _ in combo], format=format)
        term = -term if k >= 2 else term
        parts[k % 2] = term if parts[k % 2] is None else parts[k % 2] + term
    re, im = parts
    if isinstance(re, SparseTensor):
        if not same_pattern(re, im):
            raise NotSupportedError(f"einsum {equation!r}: the real and imaginary parts of this complex sparse "
                                    "result came out in different patterns; compute it on x.to_dense()")
        out = re.with_values(torch.complex(re.values(), im.values()))   # (differentiable, as the dense case)
        return driver._add_init(out, init)
    out = torch.complex(re, im)
    for t in init:
        out = out + t
    return out


def _unwrapped(x):
    """A SparseTensor that torch.func wrapped for its transform (jvp hands the rule wrapped inputs):
    the SparseTensor itself, whose kernels the einsum runs; anything else as it is."""
    inner = _without_wrappers(x) if isinstance(x, torch.Tensor) else x
    return inner if isinstance(inner, SparseTensor) else x


def _dual_values(equation: str, operands: tuple, format, init: tuple):
    """Forward-mode AD where a SparseTensor's values carry the tangent (``A.with_values(dual)``):
    the einsum of the primals, and as the tangent the sum over operands of the einsum with that
    operand replaced by its tangent (a SparseTensor's: its pattern holding the values' tangent)."""
    if torch.is_grad_enabled() and _any_requires_grad(operands + tuple(init)):
        raise NotSupportedError(f"einsum {equation!r}: forward-mode AD through a SparseTensor's values together "
                                "with a backward pass is not supported; use one of them (or torch.no_grad())")

    def split(x):
        if type(x) is SparseTensor:
            primal, tangent = _fwAD.unpack_dual(x._vals)
            return (x._like(values=primal, nnz=x._stored),
                    None if tangent is None else x._like(values=tangent, nnz=x._stored))
        if isinstance(x, torch.Tensor):
            return tuple(_fwAD.unpack_dual(x))
        return x, None
    parts = [split(x) for x in operands]
    inits = [split(t) for t in init]
    primals = tuple(p for p, _ in parts)
    out = driver.einsum(equation, *primals, format=format, init=tuple(p for p, _ in inits))
    tangent = _tangent_sum(driver.einsum, equation, format, primals, [t for _, t in parts + inits])
    if isinstance(out, SparseTensor) or isinstance(tangent, SparseTensor):
        raise NotSupportedError(f"einsum {equation!r}: forward-mode AD of a sparse result is not supported")
    return out if tangent is None else _fwAD.make_dual(out, tangent.expand(out.shape).to(out.dtype))


def _tangent_sum(run, equation: str, format, ops: tuple, tangents):
    """The tangent of ``einsum(equation, *ops) + init``, linear in each operand: the sum over
    operands of ``run`` with that operand replaced by its tangent, plus the init operands' tangents
    (``tangents[len(ops):]``); None entries have none."""
    out = None
    for k, t in enumerate(tangents):
        if t is None:
            continue
        term = t if k >= len(ops) else run(equation, *(ops[:k] + (t,) + ops[k + 1:]), format=format)
        out = term if out is None else out + term
    return out


def _dual(tensors) -> bool:
    """Whether a forward-mode AD level is on and some operand carries a tangent (a dual tensor)."""
    return any(isinstance(x, torch.Tensor) and _has_tangent(x) for x in tensors)


def _cached(equation: str, operands: tuple):
    """``einsum(equation, A, x)`` of a SparseTensor and a dense CPU tensor whose kernel an earlier
    call of the same signature bound (``driver._BOUND``), when nothing else applies -- no grad,
    no transform, sparse dispatch, no auto_sparsify: the bound call directly, without the general
    path's layers (1.5 of a PubMed SpMV's 5 us over its kernel; under dispatch "auto", when the
    operand is surely sparse or the call's decision is memoised as sparse).  None: take the general path
    (an equation :func:`_diagonals` rewrites or operands :func:`_broadcast_sparse` expands have
    no bound call under this key)."""
    a, b = operands
    if type(a) is not SparseTensor or type(b) is not torch.Tensor or b.layout != torch.strided or not b.is_cpu \
            or config.auto_sparsify or b.is_neg():
        return None
    grad = torch.is_grad_enabled()
    if grad and b.requires_grad:   # (first: a training step leaves at once)
        return None
    key = (equation, None, torch.get_num_threads(), 0, a._sig, (b.dtype, b.shape, b.stride()))
    mode = config.dispatch
    if mode != "sparse" and (mode != "auto" or (a._density >= runtime.SURELY_SPARSE and _PATHS.get(
            (key, mode, config.dense_threshold, a._density)) is not False)):   # (_dense_path's memo: sparse)
        return None
    bound = driver._BOUND.get(key)
    if bound is None or _functorch_level() is not None or _fwAD._current_level >= 0:
        return None
    if grad:
        with torch._C.DisableTorchFunctionSubclass():
            if a.requires_grad:
                return None
    return bound.call(operands, ())


def _broadcast_sparse(equation: str, operands: tuple) -> tuple:
    """The sparse operands whose size-1 dims meet a larger size of the same index expanded to it
    (their entries repeated, as ``A * B`` broadcasts); the kernels index every dim by its size."""
    ein = parse(equation, [tuple(x.shape) for x in operands])
    out = []
    for t, x in zip(ein.inputs, operands):
        want = tuple(ein.size[c] for c in t)
        out.append(x.expand(want) if isinstance(x, SparseTensor) and tuple(x.shape) != want else x)
    return tuple(out)


_REPEATS: dict = {}  # equation -> (operands repeating an index: (k, term, its distinct letters), rewritten)


def _diagonals(equation: str, operands: tuple):
    """An index repeated within one operand (``"ii->i"``, ``"ii"``, ``"iij,j->i"``) takes that
    operand's diagonal first -- a sparse one on its coordinates, differentiably -- and the
    equation is rewritten with distinct indices (kept explicit: an implicit output is the
    original's).  Other equations pass through (one dict lookup)."""
    found = _REPEATS.get(equation) if isinstance(equation, str) else ((), equation)
    if found is None:
        found = remember(_REPEATS, equation, _repeats(equation))
    repeats, rewritten = found
    if repeats == "ellipsis":   # a term with ... repeats an index: spell the ... out for these shapes, then on
        ein = parse(equation, [tuple(x.shape) for x in operands])
        return _diagonals(",".join(ein.inputs) + "->" + ein.output, operands)
    if not repeats or len(operands) != rewritten.partition("->")[0].count(",") + 1:
        return equation, operands   # nothing repeated, or a miscount parse() will report
    ops = list(operands)
    for k, term, uniq in repeats:
        x = ops[k]
        if is_torch_sparse(x):
            x = driver._operands((x,))[0]
        ops[k] = _sparse_diagonal(x, term, k, equation) if isinstance(x, SparseTensor) \
            else torch.einsum(f"{term}->{uniq}", x)
    return rewritten, tuple(ops)


def _repeats(equation: str):
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    repeats = []
    for k, t in enumerate(terms):
        uniq = "".join(dict.fromkeys(t))
        if "." in t and len(set(t.replace(".", ""))) < len(t.replace(".", "")):
            return "ellipsis", equation
        if "." not in t and uniq != t:
            repeats.append((k, t, uniq))
            terms[k] = uniq
    if not repeats:
        return (), equation
    if not arrow:  # the implicit output: indices appearing once, sorted (from the original terms)
        letters = [c for c in lhs if c.isalpha()]
        rhs = ("..." if "..." in lhs else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return tuple(repeats), ",".join(terms) + "->" + rhs


def _sparse_diagonal(x: SparseTensor, term: str, k: int, equation: str) -> SparseTensor:
    """The entries of ``x`` whose coordinates agree wherever ``term`` repeats an index, indexed by
    the distinct indices (``"ii"`` -> the diagonal, ``"iji"`` -> ``x[a, b, a]`` at ``[a, b]``)."""
    from .shape import assemble, entries
    if x.dim() != len(term):
        raise ScorchValueError(f"einsum {equation!r}: operand {k} has {x.dim()} dims, its term {term!r} "
                               f"names {len(term)}")
    first = [term.index(c) for c in dict.fromkeys(term)]
    for p, c in enumerate(term):
        if x.shape[p] != x.shape[term.index(c)]:
            raise ScorchValueError(f"einsum {equation!r}: index {c!r} repeats in operand {k} over dims of sizes "
                                   f"{x.shape[term.index(c)]} and {x.shape[p]}; a repeated index needs equal sizes")
    coords, ids = entries(x)
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    for p, c in enumerate(term):
        keep &= coords[p] == coords[term.index(c)]
    return assemble(x._format, [x.shape[p] for p in first], coords[first][:, keep], ids[keep], x.values(),
                    x.index_dtype)


def _any_requires_grad(tensors) -> bool:
    for x in tensors:  # a loop, not any() over a generator: this runs on every call
        if type(x) is torch.Tensor:
            if x.requires_grad:
                return True
        elif isinstance(x, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():  # no __torch_function__ round trip (hot path)
                if x.requires_grad:
                    return True
    return False


def decision(equation: str, operands, format=None, key=None) -> runtime.Decision:
    """Which path ``einsum(equation, *operands)`` takes, and why (``key``: the call's
    ``driver._signature`` when it has one; its operands then need no conversion)."""
    ops = operands if key is not None else driver._operands(operands)
    return runtime.decide(ops, lambda: _dense_result(equation, ops, format, key))


_DENSE_RESULT: dict = {}  # operand signature -> does the sparse plan give a dense result


def _dense_result(equation, ops, format, key=None) -> bool:
    """Whether the sparse plan's result is dense (cached per operand signature: it needs a plan)."""
    key = key if key is not None else driver._signature(equation, format, ops)
    found = _DENSE_RESULT.get(key) if key is not None else None
    if found is None:
        found = format in (None, "dense") and driver._plan(equation, ops, format)[0].schedule.output[0] == "dense"
        if key is not None:
            remember(_DENSE_RESULT, key, found)
    return found


_PATHS: dict = {}  # (signature, dispatch and threshold settings, densest operand's density) -> dense path?


def _dense_path(equation, operands, format, key=None) -> bool:
    """Whether this call runs dense torch (:func:`runtime.decide`, without building its Decision
    on every call: 1.5 -> 0.4 us with a sparse operand under SURELY_SPARSE, 1.3 -> 0.6 us else)."""
    mode = config.dispatch
    if mode == "sparse":
        return False
    density = runtime.densest(operands)
    if density < 0 or (mode == "auto" and density < runtime.SURELY_SPARSE):
        return False  # decide's first rules: no sparse operand, or surely sparse
    if key is None:
        return decision(equation, operands, format).path == "dense"
    # decide goes by these alone (the calibration is fixed per thread count, in the signature)
    memo = (key, mode, config.dense_threshold, density)
    found = _PATHS.get(memo)
    if found is None:
        found = remember(_PATHS, memo, decision(equation, operands, format, key).path == "dense")
    return found


def explain(equation: str, *operands, format=None):
    """The plan of ``einsum(equation, *operands)``: the path (sparse kernel or dense torch, and
    why), loop order, output format and the generated C (``.source``)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    operands = runtime.maybe_sparsify(operands)
    equation, operands = _diagonals(equation, tuple(operands))   # as einsum runs it: diagonals first
    if any(type(x) is SparseTensor and 1 in x._shape for x in operands):
        operands = _broadcast_sparse(equation, operands)
    complex_ = [isinstance(x, torch.Tensor) and x.dtype.is_complex for x in operands]
    permuted = len(operands) == 1 and type(operands[0]) is SparseTensor \
        and permutation(equation, operands[0].dim()) is not None
    if any(complex_) and not permuted:   # as einsum runs it (_complex): real einsums of the parts
        plan = explain(equation, *[x.real if c else x for x, c in zip(operands, complex_)], format=format)
        return dataclasses.replace(plan, dispatch=f"{plan.dispatch}; complex values: the sum of "
                                   f"{2 ** sum(complex_)} such real einsums over the real and imaginary parts")
    plan = driver.explain(equation, *operands, format=format)
    if plan.backend == "permute (no kernel)":   # what einsum returns whatever the dispatch: the storage, permuted
        return dataclasses.replace(plan, dispatch="sparse (a permutation of one sparse operand: no product)")
    d = decision(equation, operands, format)
    plan = dataclasses.replace(plan, dispatch=f"{d.path} ({d.reason})")
    if d.path == "dense":   # torch.einsum on the densified operands runs instead
        plan = dataclasses.replace(plan, backend="torch.einsum (dense copies of the operands)",
                                   output_format="dense (torch.einsum on dense copies of the operands)")
    return plan


implements(torch.einsum)(einsum)


def einsum_add(equation: str, operands, init):
    """``einsum(equation, *operands) + init[0] + init[1] + ...`` (``init``: dense tensors
    broadcastable to the result, e.g. a bias); the additions happen inside the kernel, which
    starts its accumulators from them, where the loop nest allows (SpMM, SpMV)."""
    return _einsum(equation, operands, None, init)


class _Einsum(torch.autograd.Function):
    @staticmethod
    def forward(equation, format, n_init, *tensors):
        ops, init = tensors[:len(tensors) - n_init], tensors[len(tensors) - n_init:]
        return driver.einsum(equation, *ops, format=format, init=init)

    @staticmethod
    def setup_context(ctx, inputs, output):
        equation, format, n_init, *tensors = inputs
        ctx.equation, ctx.n_init, ctx.format, ctx.n_tensors = equation, n_init, format, len(tensors)
        # Only the operands whose values a gradient reads are saved (another operand's gradient needs
        # them): a write into the others between forward and backward changes nothing the backward reads
        # (y = A.sum(), A updated, y.backward() raised).  The rest is kept as shape and pattern only.
        # A saved sparse operand's values array is saved too: a write into it (through values(), a view,
        # detach()) bumps its version, not the wrapper's, and the backward would read the new values.
        n_ops, need = len(tensors) - n_init, ctx.needs_input_grad[3:]
        ctx.needed = [j < n_ops and any(need[k] for k in range(n_ops) if k != j) for j in range(len(tensors))]
        kept = [t for t, keep in zip(tensors, ctx.needed) if keep]
        ctx.save_for_backward(*kept, *[t._vals for t in kept if type(t) is SparseTensor])
        ctx.stand_ins = [None if keep else _stand_in(t) for t, keep in zip(tensors, ctx.needed)]
        if _fwAD._current_level >= 0 or _functorch_level() is not None:   # for jvp, as they came (under
            ctx.inputs = tuple(tensors)   # torch.func a saved SparseTensor comes back wrapped); not otherwise:
            # a ctx attribute would hold them past saved-tensor hooks (activation checkpointing)

    @staticmethod
    def vmap(info, in_dims, equation, format, n_init, *tensors):
        """``torch.func.vmap``: each batched dense operand's batch dim becomes a new index of the
        equation, at the front of the result (a batched sparse operand or init: not supported)."""
        dims = in_dims[3:]
        ops = tensors[:len(tensors) - n_init]
        if any(d is not None for d in dims[len(ops):]) or any(
                d is not None and isinstance(t, SparseTensor) for t, d in zip(ops, dims)):
            raise NotSupportedError(f"einsum {equation!r}: vmap over a sparse operand or an init operand is not "
                                    "supported; vmap over the dense operands")
        ein = parse(equation, [tuple(x.shape) if d is None else tuple(x.shape[:d] + x.shape[d + 1:])
                               for x, d in zip(ops, dims)])
        used = set("".join(ein.inputs) + ein.output)
        b = next(c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used)
        terms = [t if d is None else b + t for t, d in zip(ein.inputs, dims)]
        moved = [x if d is None else x.movedim(d, 0) for x, d in zip(ops, dims)]
        out = _Einsum.apply(",".join(terms) + "->" + b + ein.output, format, n_init, *moved,
                            *tensors[len(ops):])
        return out, 0

    @staticmethod
    def jvp(ctx, _equation, _format, _n_init, *tangents):
        """Forward mode: the einsum is linear in each operand, so the output's tangent is the sum
        over operands of the einsum with that operand replaced by its tangent (+ the init's)."""
        tensors = ctx.inputs
        ops = tuple(map(_unwrapped, tensors[:len(tensors) - ctx.n_init]))
        tangents = [None if t is None or (isinstance(t, SparseTensor) and not bool(t._vals.any()))
                    else _unwrapped(t) for t in tangents]   # (no tangent: torch hands a SparseTensor zeros)
        # the differentiable einsum under torch.func, or when an operand or tangent requires grad (the
        # tangent of lin(dual x) is in W's graph: the raw kernel left it out, and its grad raised)
        tracked = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                  for t in (*ops, *tangents))
        run = einsum if _functorch_level() is not None or tracked else driver.einsum
        out = _tangent_sum(run, ctx.equation, ctx.format, ops, tangents)
        if isinstance(out, SparseTensor):
            raise NotSupportedError(f"einsum {ctx.equation!r}: forward-mode AD of a sparse result is not supported")
        return out

    @staticmethod
    def backward(ctx, grad):
        saved = iter(ctx.saved_tensors)
        tensors = [next(saved) if keep else _stood_in(stand) for keep, stand in zip(ctx.needed, ctx.stand_ins)]
        ops, init = tensors[:len(tensors) - ctx.n_init], tensors[len(tensors) - ctx.n_init:]
        ein = parse(ctx.equation, [tuple(x.shape) for x in ops])
        if any(len(set(t)) != len(t) for t in ein.inputs):
            raise NotSupportedError(f"einsum {ctx.equation!r}: the gradient of a repeated index (a diagonal) "
                                    "is not supported yet")
        need = ctx.needs_input_grad[3:]
        grads = tuple(_grad_of(ein, ops, k, grad) if need[k] else None for k in range(len(ops)))
        grads += tuple(_sum_to(grad, t) if need[len(ops) + u] else None for u, t in enumerate(init))
        return (None, None, None) + grads


def _stand_in(t):
    """What a backward needs of an operand whose values it does not read: a sparse one's pattern
    (its index arrays; not its values, which activation checkpointing would otherwise keep alive),
    a dense one's shape and dtype (a meta tensor).  :func:`_stood_in` gives the tensor back."""
    if type(t) is SparseTensor:
        return _Pattern(t._format, t._shape, t._pos, t._crd, t._stored, tuple(t._vals.shape), t._vals.dtype)
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


@dataclasses.dataclass(frozen=True)
class _Pattern:
    fmt: Format
    shape: tuple
    pos: tuple
    crd: tuple
    stored: int
    vshape: tuple
    dtype: torch.dtype


def _stood_in(x):
    """The operand a :func:`_stand_in` stands for: a pattern holds zeros (its values unread)."""
    if isinstance(x, _Pattern):
        return SparseTensor(x.fmt, x.shape, x.pos, x.crd, torch.zeros(x.vshape, dtype=x.dtype), nnz=x.stored)
    return x


def _sum_to(grad, t):
    """``grad`` summed over the dims that ``t`` was broadcast along, in ``t``'s shape and dtype."""
    lead = grad.dim() - t.dim()
    g = grad.sum(dim=tuple(range(lead))) if lead else grad
    dims = tuple(d for d, n in enumerate(t.shape) if n == 1 and g.shape[d] != 1)
    return (g.sum(dim=dims, keepdim=True) if dims else g).to(t.dtype)


def _grad_of(ein, ops, k, grad):
    """The gradient of operand ``k`` (a sparse one in its pattern); under grad mode -- a backward
    with ``create_graph=True`` -- through the differentiable einsum, so it can be differentiated
    again (Hessian-vector products, gradient penalties)."""
    t_k, out = ein.inputs[k], ein.output
    others = [(t, x) for j, (t, x) in enumerate(zip(ein.inputs, ops)) if j != k]
    x = ops[k]
    # autograd.grad(..., is_grads_batched=True): grad is batched by torch's old vmap, whose tensors have no
    # data for a kernel -- the gradient densely by tensordots (a sparse operand's: dense, 0 off its pattern)
    batched = _legacy_vmap()
    # (under torch.func the differentiable einsum has the vmap rule)
    run = einsum if torch.is_grad_enabled() or _functorch_level() is not None else driver.einsum
    if isinstance(x, SparseTensor) and not batched:
        mask = x._like(values=torch.ones_like(x._vals), nnz=x._stored)
        terms = [t_k, out] + [t for t, _ in others]
        g = run(",".join(terms) + "->" + t_k, mask, grad, *[o for _, o in others])
        return in_pattern(x, project(g, x).to(x.dtype))
    have = set(out) | {c for t, _ in others for c in t}
    kept = "".join(c for c in t_k if c in have)
    terms = [out] + [t for t, _ in others]
    if batched:
        g = _batched_einsum(",".join(terms) + "->" + kept, grad, [o for _, o in others])
    else:
        g = run(",".join(terms) + "->" + kept, grad, *[o for _, o in others], format="dense")
    size = ein.size
    if kept != t_k:  # indices only this operand has: the gradient is constant along them
        g = g.reshape([size[c] if c in kept else 1 for c in t_k]).expand([size[c] for c in t_k])
    broadcast = [d for d, n in enumerate(x.shape) if n == 1 and size[t_k[d]] != 1]
    if broadcast:
        g = g.sum(dim=broadcast, keepdim=True)
    if isinstance(x, SparseTensor):   # (batched) read at the pattern: 1 where x stores an entry
        check_dense_size("is_grads_batched=True gives a sparse operand a dense gradient, and", [x])
        g = g * x._like(values=torch.ones_like(x._vals), nnz=x._stored).to_dense()
    return g.to(x.dtype)


def _batched_einsum(equation: str, grad, others):
    """``equation`` over ``grad`` and the other operands densified (within the dense size limit) by
    pairwise ``tensordot``s, which torch's old vmap batches (its einsum has no batching rule): a
    gradient for a batch of outputs at once.  An index two operands share and the result keeps (a
    batch index) has no tensordot: refused, pointing at torch.func."""
    check_dense_size("is_grads_batched=True densifies the other operands, and", others)
    ins, out = equation.split("->")
    terms = ins.split(",")
    cur, ct = grad, terms[0]
    for k, (t, x) in enumerate(zip(terms[1:], others), start=2):
        later = set(out).union(*terms[k:])
        shared = [c for c in ct if c in t]
        kept = [c for c in shared if c in later]
        if kept:
            raise NotSupportedError(f"einsum {equation!r}: is_grads_batched=True over a batch index ({kept[0]!r}) is "
                                    "not supported; use torch.func.vmap over torch.func.vjp's function instead")
        cur = torch.tensordot(cur, x.to_dense() if isinstance(x, SparseTensor) else x,
                              dims=([ct.index(c) for c in shared], [t.index(c) for c in shared]))
        ct = "".join(c for c in ct + t if c not in shared)
    extra = [d for d, c in enumerate(ct) if c not in out]
    if extra:
        cur, ct = cur.sum(dim=extra), "".join(c for c in ct if c in out)
    return cur.permute([ct.index(c) for c in out])


class ToDense(torch.autograd.Function):
    """``x.to_dense()`` for a SparseTensor that requires grad: the gradient is the dense
    gradient read at ``x``'s stored positions."""

    @staticmethod
    def forward(ctx, x):
        ctx.pattern = _stand_in(x)   # (its pattern only: a later write into x's values changes nothing here)
        return x.to_dense()

    @staticmethod
    def backward(ctx, grad):
        x = _stood_in(ctx.pattern)
        return in_pattern(x, project(grad, x).to(x.dtype))

    @staticmethod
    def jvp(ctx, x_t):
        """Forward mode: the tangent densified."""
        return _unwrapped(x_t).to_dense() if isinstance(x_t, SparseTensor) else x_t


class ViewOf(torch.autograd.Function):
    """``pattern`` holding ``x``'s values array itself (the same entries in the same order: a view
    -- ``x.t()``, a reshape, an index-width change); its gradient is ``x``'s in ``x``'s pattern.  The
    view's values are ``x``'s own tensor, not a view of it made here (a view made inside a custom
    Function could not be read again once ``x`` is written in place: a transposed weight held
    across optimizer steps)."""

    @staticmethod
    def forward(x, pattern):
        return pattern._like(values=x._vals, nnz=pattern._stored)

    @staticmethod
    def setup_context(ctx, inputs, output):   # (the form torch.func's transforms need)
        ctx.x, ctx.pattern = inputs

    @staticmethod
    def vmap(info, in_dims, x, pattern):
        """Under torch.func.vmap (jacfwd, hessian, per-sample gradients) with the view's base not
        batched -- a weight the function closes over: the view itself, unbatched."""
        if any(d is not None for d in in_dims):
            raise NotSupportedError("vmap over a SparseTensor that is viewed (x.t(), reshape...) is not supported; "
                                    "vmap over the dense operands")
        return ViewOf.apply(x, pattern), None

    @staticmethod
    def jvp(ctx, x_t, pattern_t):
        """Forward mode: the view of the base's tangent (no tangent: none)."""
        if x_t is None or (isinstance(x_t, SparseTensor) and not bool(x_t._vals.any())):
            return None
        return ctx.pattern._like(values=_unwrapped(x_t)._vals, nnz=ctx.pattern._stored)

    @staticmethod
    def backward(ctx, grad):
        return in_pattern(ctx.x, project(grad, ctx.pattern)), None


class FromValues(torch.autograd.Function):
    """``x.with_values(v)``: the pattern of ``x`` holding ``v``, differentiable w.r.t. ``v``."""

    @staticmethod
    def forward(x, values):
        return x._like(values=values, nnz=x._stored)

    @staticmethod
    def setup_context(ctx, inputs, output):   # (the form torch.func's transforms need)
        ctx.pattern = inputs[0]

    @staticmethod
    def vmap(info, in_dims, x, values):
        """Under torch.func.vmap with the values not batched: the tensor itself, unbatched; batched
        values would make a batch of sparse tensors (jacfwd / jacrev w.r.t. them)."""
        if any(d is not None for d in in_dims):
            raise NotSupportedError("vmap over a SparseTensor's values (x.with_values(v) with v batched: jacfwd / "
                                    "jacrev w.r.t. v) is not supported; use torch.func.jvp / vjp per direction, or "
                                    "torch.autograd.functional.jacobian")
        return FromValues.apply(x, values), None

    @staticmethod
    def backward(ctx, grad):
        return None, project(grad, _unwrapped(ctx.pattern))

    @staticmethod
    def jvp(ctx, x_t, values_t):
        """Forward mode: the pattern holding the values' tangent (the pattern's own tangent does not
        reach the values: they are replaced)."""
        pattern = _unwrapped(ctx.pattern)
        return None if values_t is None else pattern._like(values=values_t, nnz=pattern._stored)


class Values(torch.autograd.Function):
    """``x.values()`` of a SparseTensor that requires grad (its gradient keeps the pattern)."""

    @staticmethod
    def forward(ctx, x):
        ctx.pattern = x
        return x._vals.view_as(x._vals)

    @staticmethod
    def backward(ctx, grad):
        return in_pattern(ctx.pattern, grad)

    @staticmethod
    def jvp(ctx, x_t):
        """Forward mode: the tangent read at the stored positions."""
        x_t = _unwrapped(x_t)
        return project(x_t.to_dense() if isinstance(x_t, SparseTensor) else x_t, ctx.pattern).to(ctx.pattern.dtype)
