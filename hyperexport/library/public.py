"""The names published models record for the library's own classes (numpy's ``set_module``).

A published model records the class of every function it holds as ``module.QualName``
(``hyperexport.module_class``), and the dynamo path records the class of every module a node
was traced in (``pkg.torch.onnx.class_hierarchy``, ``namespace``); TorchScript names its
types the same way. Those names are ``cls.__module__``, so a class defined under
``hyperexport/library/`` would record where its file sits, and move the published bytes each
time a file moves. Each such class says instead, once, the name it is published under: a
public module outside the library folder that re-exports it (``hyperexport.transformers.
kv_layers``, ``hyperexport.tasks.steps``, ...), so the recorded name resolves by import
(``tests/library/test_public_homes.py``) and stays what it was before the library had its
folder. Nothing is imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)

#: Where the library's own code sits; never a recorded name.
LIBRARY = "hyperexport.library"


def set_module(module: str) -> Callable[[T], T]:
    """A class decorator: record the class as ``module.QualName``.

    Args:
        module: The public module that re-exports the class (outside ``hyperexport.library``).

    Returns:
        The decorator, which returns the class itself with ``__module__`` set.
    """
    if (
        not module.startswith("hyperexport.")
        or module == LIBRARY
        or module.startswith(f"{LIBRARY}.")
    ):
        raise ValueError(f"{module!r} is not a public home outside {LIBRARY}")

    def decorate(cls: T) -> T:
        cls.__module__ = module
        return cls

    return decorate
