"""Capture the arguments of an inner call (a submodule's forward, or any method) during a run.

Real pipelines do not call the module one wants to export: ``generate`` calls
``model.model.forward`` with a cache, positions and masks it built itself. This module records
those arguments, so that the inner call can be exported with the inputs a real pipeline gives it.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from hyperexport.base.errors import InputError

log = logging.getLogger(__name__)


class _CaptureDone(Exception):
    """Raised from the hook to end the run early once the wanted call was seen."""


def _resolve(model: torch.nn.Module, target: str) -> tuple[Any, str]:
    """Split ``"a.b.c"`` into the owner object (``model.a.b``) and the attribute name ``"c"``.

    An empty path, or a path naming a module, means that module's ``forward``.
    """
    owner: Any = model
    parts = [part for part in target.split(".") if part]
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise InputError(target, f"{type(owner).__name__} has no attribute {part!r}")
        owner = getattr(owner, part)
    if not parts:
        return model, "forward"
    last = parts[-1]
    if not hasattr(owner, last):
        raise InputError(target, f"{type(owner).__name__} has no attribute {last!r}")
    value = getattr(owner, last)
    if isinstance(value, torch.nn.Module):
        return value, "forward"
    if not callable(value):
        raise InputError(target, f"{type(value).__name__} is not callable")
    return owner, last


def detached_copy(value: Any) -> Any:
    """``copy.deepcopy(value)`` with every tensor copied as ``detach().clone()``.

    Tensors may sit anywhere (a transformers ``Cache`` holds them in lists of layer objects), so
    the deep copy runs with a memo that already maps each tensor reachable through containers
    and object attributes to its detached copy; deepcopy then never copies a tensor itself.
    """
    memo: dict[int, Any] = {}
    _seed_tensors(value, memo, set())
    return copy.deepcopy(value, memo)


def _seed_tensors(value: Any, memo: dict[int, Any], seen: set[int]) -> None:
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        memo[id(value)] = value.detach().clone()
        return
    if isinstance(value, dict):
        children: Any = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    elif isinstance(value, torch.nn.Module) and not _is_transformers_cache(value):
        return  # modules are shared, not copied: deepcopy copies their tensors' values itself
    else:  # a transformers 4.x Cache may be an nn.Module holding tensors in plain lists (4.48.3)
        children = list(getattr(value, "__dict__", {}).values())
        children += [
            getattr(value, s) for s in getattr(type(value), "__slots__", ()) if hasattr(value, s)
        ]
    for child in children:
        _seed_tensors(child, memo, seen)


def _is_transformers_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers KV cache (``transformers.cache_utils``): its tensors
    are the call's state, and are copied detached even where the class is an ``nn.Module``."""
    return any(c.__module__ == "transformers.cache_utils" for c in type(value).__mro__)


def capture_inner_call(
    model: torch.nn.Module,
    target: str,
    run: Callable[[], Any],
    *,
    call_index: int = 0,
    stop: bool = True,
    copy_args: bool = True,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Run ``run()`` and return the arguments of one call of ``target``.

    The method is wrapped on the instance (not the class) and the wrapper is removed in
    ``finally``, whatever ``run`` does.

    Args:
        model: The root module.
        target: Dotted path from ``model``: a submodule (its ``forward``), e.g. ``"model"``, or a
            method, e.g. ``"model.forward"`` or ``"model.embed_tokens.forward"``.
        run: What the user runs, e.g. ``lambda: model.generate(ids, max_new_tokens=2)``.
        call_index: Which call to capture (0 is the first).
        stop: End ``run`` right after the captured call, instead of letting it finish.
        copy_args: Deep-copy the arguments at call time (a cache object is mutated later).
            Tensors are copied detached (``detach().clone()``): an export needs values, and a
            tensor with autograd history cannot be deep-copied.

    Returns:
        ``(args, kwargs)`` of the captured call, without ``self``.

    Raises:
        InputError: ``target`` does not exist, or was called fewer than ``call_index + 1`` times.
    """
    owner, name = _resolve(model, target)
    original = getattr(owner, name)
    had_instance_attr = name in vars(owner)
    previous = vars(owner).get(name)
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    calls = 0

    @functools.wraps(original)
    def recorder(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if calls == call_index:
            seen.append(detached_copy((args, kwargs)) if copy_args else (args, kwargs))
            if stop:
                calls += 1
                raise _CaptureDone
        calls += 1
        return original(*args, **kwargs)

    setattr(owner, name, recorder)
    try:
        run()
    except _CaptureDone:
        log.debug("captured call %d of %s; run stopped", call_index, target)
    finally:
        if had_instance_attr:
            setattr(owner, name, previous)
        else:
            delattr(owner, name)
    if not seen:
        raise InputError(
            target, f"was called {calls} time(s) during the run; call {call_index} was wanted"
        )
    return seen[0]
