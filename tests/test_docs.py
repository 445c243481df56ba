"""The runnable examples in public docstrings are true (doctest)."""

import doctest
import importlib

import pytest

MODULES = ["scorch", "scorch.tensor", "scorch.interop", "scorch.format", "scorch.formats", "scorch.ops.einsum",
           "scorch.ops.linalg", "scorch.compiler.driver", "scorch.sparsify", "scorch.schedule"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
