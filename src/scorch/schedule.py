"""A scheduling language for sparsity (seed 003): which tensors of an existing model are sparse,
in which format and how their entries are chosen -- kept apart from the model's code.

>>> import torch, scorch
>>> from scorch.sparsify import ScalarFractionSparsifier
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
>>> s = scorch.schedule.create_schedule(model)
>>> _ = s["0.weight"].sparsify(ScalarFractionSparsifier(0.75)).set_format("csc")
>>> _ = s["2.weight"].block(2, 2).set_format("csr", axis=[0, 1]).set_format("dense", axis=[2, 3])
>>> sparse_model = s.build()
>>> (str(sparse_model[0].weight.format), sparse_model[0].weight.nnz, str(sparse_model[2].weight.format))
('csc', 16, 'bsr2x2')

A name is a parameter (its entries chosen once, by its sparsifier: all its nonzeros by default)
or a submodule (its output sparsified on every forward by its sparsifier: dynamic sparsity).
``block(b0, b1, ...)`` splits a parameter into blocks: axes ``0..n-1`` are then the block
coordinates and ``n..2n-1`` the coordinates inside a block, and ``set_format(fmt, axis=[...])``
gives those axes the levels of ``fmt`` (a preset name or a :class:`~scorch.Format` -- a format of
your own), so formats combine into hybrids (blocked ELL over COO blocks, say).  ``build`` hands
the schedule to :class:`~scorch.sparsify.SparsityBuilder`: one mechanism rewrites models.
"""

from __future__ import annotations

from torch import nn

from .errors import ScorchTypeError, ScorchValueError
from .format import Format, check_format, resolve
from .sparsify import KeepAll, Sparsifier, SparsityBuilder, as_int, did_you_mean, parametrized_hint

__all__ = ["create_schedule", "Schedule", "TensorSchedule"]


class TensorSchedule:
    """The schedule of one tensor of the model; its methods chain (``s[name].block(4, 4)
    .set_format(...)``).  ``ndim`` is None for a submodule's output (known only when it runs)."""

    def __init__(self, name: str, ndim: int | None):
        self.name, self.ndim = name, ndim
        self._block: tuple | None = None
        self._formats: list = []        # (axes, Format or name) in the order set
        self._sparsifier: Sparsifier | None = None
        self._scheduled = False         # set by block / set_format / sparsify: build() skips an entry only read

    def _where(self) -> str:
        return f"schedule[{self.name!r}]"

    def block(self, *shape) -> "TensorSchedule":
        """Split the parameter into blocks of ``shape`` (one size per dim); before ``set_format``."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if self.ndim is None:
            raise ScorchValueError(f"{self._where()}.block: blocks split a parameter; {self.name!r} is a "
                                   "submodule's output")
        sizes = tuple(as_int(b) for b in shape)   # (numpy ints and 0-d int tensors are ints, as in the sparsifiers)
        if len(shape) != self.ndim or any(b is None or b < 1 for b in sizes):
            raise ScorchValueError(f"{self._where()}.block: expects {self.ndim} positive ints (one per dim), got "
                                   f"{shape}")
        if self._formats:
            raise ScorchValueError(f"{self._where()}.block: call block before set_format (the axes it names "
                                   "depend on the split)")
        self._block = sizes
        self._scheduled = True
        return self

    def set_format(self, format, axis=None) -> "TensorSchedule":
        """Store the tensor (``axis=None``) or the listed axes, in that order, in ``format``."""
        if axis is None:
            check_format(format, arg=f"{self._where()}.set_format")
            self._formats = [(None, format)]
            self._scheduled = True
            return self
        if self.ndim is None:
            raise ScorchValueError(f"{self._where()}.set_format: axis= applies to a parameter; {self.name!r} is a "
                                   "submodule's output (pass the format alone)")
        n = 2 * self.ndim if self._block else self.ndim
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        taken = {a for ax, _ in self._formats if ax is not None for a in ax}
        if not axes or any(isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < n for a in axes) \
                or len(set(axes)) != len(axes) or taken & set(axes):
            raise ScorchValueError(f"{self._where()}.set_format: axis must list distinct axes in [0, {n}) that no "
                                   f"earlier set_format took ({sorted(taken)}), got {axis!r}")
        fmt = resolve(format, len(axes), arg=f"{self._where()}.set_format")
        if fmt.block:
            raise ScorchValueError(f"{self._where()}.set_format: {fmt} is blocked itself; split with block() and "
                                   "give the axes unblocked formats")
        self._formats = [f for f in self._formats if f[0] is not None] + [(axes, fmt)]
        self._scheduled = True
        return self

    def sparsify(self, sparsifier: Sparsifier) -> "TensorSchedule":
        """Which entries to keep: once for a parameter, on every forward for a submodule's output."""
        if not isinstance(sparsifier, Sparsifier):
            raise ScorchTypeError(f"{self._where()}.sparsify: expects a scorch.sparsify Sparsifier, got "
                                  f"{type(sparsifier).__name__}")
        self._sparsifier = sparsifier
        self._scheduled = True
        return self

    def format(self):
        """The Format the parameter gets (a name, for a submodule's output: it adapts to the dims)."""
        whole = [f for ax, f in self._formats if ax is None]
        if self.ndim is None:
            return whole[0] if whole else "csr"
        n = 2 * self.ndim if self._block else self.ndim
        if whole or not self._formats:
            fmt = whole[0] if whole else "csr"
            if self._block:   # one format over every axis of the split
                return self._combined([(tuple(range(n)), resolve(fmt, n, arg=f"{self._where()}.set_format"))])
            return resolve(fmt, n, arg=f"{self._where()}.set_format")
        return self._combined(self._formats)

    def _combined(self, parts) -> Format:
        axes = [a for ax, _ in parts for a in ax]
        if sorted(axes) != list(range(2 * self.ndim if self._block else self.ndim)):
            missing = sorted(set(range(2 * self.ndim if self._block else self.ndim)) - set(axes))
            raise ScorchValueError(f"{self._where()}: axes {missing} have no format (set_format(..., axis=...))")
        levels, order = [], []
        for ax, fmt in parts:   # level k of the part stores the part's axis ax[fmt.order[k]]
            levels += fmt.levels
            order += [ax[d] for d in fmt.order]
        return Format(levels, tuple(order), self._block)

    def __repr__(self) -> str:
        what = "output" if self.ndim is None else "parameter"
        if not self._scheduled:
            return f"TensorSchedule({self.name!r} ({what}): not scheduled, build() leaves it as it is)"
        block = f", block={self._block}" if self._block else ""
        try:
            fmt = self.format()
        except ScorchValueError as err:   # (a repr never raises: a schedule still being written says so)
            fmt = f"<incomplete: {err}>"
        # (an output has no default sparsifier: build() asks for one)
        chosen = repr(self._sparsifier or KeepAll()) if self._sparsifier or self.ndim is not None \
            else "None (set one with .sparsify)"
        return f"TensorSchedule({self.name!r} ({what}): format={fmt}{block}, sparsifier={chosen})"


class Schedule:
    """The schedules of a model's tensors, by name (``schedule["layer.weight"]``); :meth:`build`
    returns the sparse model (a copy: the model is left as it was)."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise ScorchTypeError(f"create_schedule: model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._entries: dict = {}

    def __getitem__(self, name: str) -> TensorSchedule:
        """The entry of ``name``, created on first use; only calling its block / set_format / sparsify
        schedules it (reading it, ``.format()`` or its repr, changes nothing ``build()`` does)."""
        if name not in self._entries:
            params = dict(self.model.named_parameters(remove_duplicate=False))
            modules = {k: m for k, m in self.model.named_modules(remove_duplicate=False) if k}
            if name in params:
                self._entries[name] = TensorSchedule(name, params[name].dim())
            elif name in modules:
                self._entries[name] = TensorSchedule(name, None)
            else:
                hint = parametrized_hint(self.model, name) or did_you_mean(name, list(params) + list(modules))
                raise ScorchValueError(f"schedule: the model has no parameter or submodule {name!r}{hint}")
        return self._entries[name]

    def __iter__(self):
        """The scheduled entries (not those only read)."""
        return iter([e for e in self._entries.values() if e._scheduled])

    def __repr__(self) -> str:
        return "Schedule(\n" + "".join(f"  {e!r},\n" for e in self) + ")"

    def build(self) -> nn.Module:
        """The model with every scheduled parameter sparse and every scheduled output sparsified."""
        builder = SparsityBuilder(self.model)
        for entry in self:
            if entry.ndim is None:
                if entry._sparsifier is None:
                    raise ScorchValueError(f"schedule[{entry.name!r}]: a submodule's output needs a sparsifier "
                                           "(.sparsify(...)) to choose its entries on each call")
                builder.set_interm(entry.name, entry._sparsifier, entry.format())
            else:
                builder.set_weight(entry.name, entry._sparsifier, entry.format())
        return builder.get_sparse_model()


def create_schedule(model: nn.Module) -> Schedule:
    """An empty schedule of ``model``'s tensors (seed 003's ``create_schedule``)."""
    return Schedule(model)
