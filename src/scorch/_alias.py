"""Make ``import scorch.X`` work for every torch submodule ``torch.X`` scorch does not define.

A meta-path finder placed after the normal ones: scorch's own modules are found
first; for any other ``scorch.a.b`` whose ``torch.a.b`` exists it returns a thin
module that forwards attribute access to the torch module (torch's own module
objects are left untouched).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _TorchAlias(types.ModuleType):
    def __init__(self, name: str, target: types.ModuleType):
        super().__init__(name, target.__doc__)
        self.__dict__["_target"] = target
        if hasattr(target, "__path__"):
            self.__path__ = []  # a package: lets `import scorch.a.b` continue below it

    def __getattr__(self, name):
        return getattr(self.__dict__["_target"], name)

    def __dir__(self):
        return sorted(set(dir(self.__dict__["_target"])) | set(self.__dict__))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: types.ModuleType):
        self.target = target

    def create_module(self, spec):
        return _TorchAlias(spec.name, self.target)

    def exec_module(self, module):
        pass


class TorchAliasFinder(importlib.abc.MetaPathFinder):
    prefix = "scorch."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.prefix):
            return None
        torch_name = "torch." + fullname[len(self.prefix):]
        try:
            if importlib.util.find_spec(torch_name) is None:
                return None
        except (ImportError, ValueError):
            return None
        module = importlib.import_module(torch_name)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module), is_package=hasattr(module, "__path__"))


def install() -> None:
    if not any(isinstance(f, TorchAliasFinder) for f in sys.meta_path):
        sys.meta_path.append(TorchAliasFinder())
