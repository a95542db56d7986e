"""Bind call arguments to a forward signature, and split bound arguments back into a call."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


def bind(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Bind ``args``/``kwargs`` to ``fn``'s signature, in signature order, without defaults.

    Keyword arguments given out of order come back in the order the signature declares them.
    ``*args`` binds as a tuple under its own name, ``**kwargs`` as a dict under its own name.
    """
    bound = inspect.signature(fn).bind(*args, **kwargs)
    return dict(bound.arguments)


def split(
    fn: Callable[..., Any], arguments: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`bind`: the ``(args, kwargs)`` that reproduce ``arguments``."""
    params = inspect.signature(fn).parameters
    has_var_positional = any(p.kind is p.VAR_POSITIONAL for p in params.values())
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, param in params.items():
        if name not in arguments:
            continue
        value = arguments[name]
        if param.kind is param.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind is param.VAR_KEYWORD:
            kwargs.update(value)
        elif param.kind is param.POSITIONAL_ONLY or (
            has_var_positional and param.kind is param.POSITIONAL_OR_KEYWORD
        ):
            args.append(value)
        else:
            kwargs[name] = value
    return tuple(args), kwargs
