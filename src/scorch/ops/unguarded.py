"""torch functions written in Python whose bodies scorch runs with its handling on.

Such a function starts with its own torch-function guard (``if has_torch_function(args):
return handle_torch_function(...)``); once it hands a SparseTensor call over, torch expects the
handler to run the body with subclass handling off -- and then the body's inner calls (an
``F.linear`` with a sparse weight) reach the warned dense fallback.  For the functions listed
here the body runs as a copy of the function without that guard, with handling on: its inner
calls with SparseTensors reach scorch's implementations.  Only functions whose inner calls mean
the same on sparse operands are listed (``F.multi_head_attention_forward``: sparse projection
weights go through ``F.linear``; ``F.dropout1d/2d/3d``, whose channel dropout keeps the
pattern; ``F.cross_entropy`` is not -- its softmax would take
torch.sparse's semantics).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import torch

from .._dispatch import as_torch_runs, implements


def _is_guard(stmt) -> bool:
    """``if has_torch_function...(...): return handle_torch_function(...)``."""
    return (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Call) and isinstance(stmt.test.func, ast.Name)
            and stmt.test.func.id.startswith("has_torch_function") and len(stmt.body) == 1
            and isinstance(stmt.body[0], ast.Return) and isinstance(stmt.body[0].value, ast.Call)
            and getattr(stmt.body[0].value.func, "id", None) == "handle_torch_function" and not stmt.orelse)


@functools.lru_cache(maxsize=None)
def _without_guard(func):
    """A copy of ``func`` (in its own module's globals) without its top-level torch-function
    guard; None when its source is not at hand or has no such guard."""
    try:
        lines, first = inspect.getsourcelines(func)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        filename = inspect.getsourcefile(func) or "<torch>"
    except (OSError, TypeError, SyntaxError):
        return None
    ast.increment_lineno(tree, first - 1)   # tracebacks point into torch's file
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef) or not any(_is_guard(s) for s in fn.body):
        return None
    fn.body = [s for s in fn.body if not _is_guard(s)]
    fn.decorator_list = []
    scope: dict = {}
    exec(compile(tree, filename, "exec"), func.__globals__, scope)
    copy = scope[fn.name]
    copy.__defaults__, copy.__kwdefaults__ = func.__defaults__, func.__kwdefaults__
    return copy


def _unguarded(func):
    def run(*args, **kwargs):
        body = _without_guard(func)
        return body(*args, **kwargs) if body is not None else as_torch_runs(func, *args, **kwargs)
    return run


for _func in (torch.nn.functional.multi_head_attention_forward, torch.nn.functional.dropout1d,
              torch.nn.functional.dropout2d, torch.nn.functional.dropout3d):
    implements(_func)(_unguarded(_func))
