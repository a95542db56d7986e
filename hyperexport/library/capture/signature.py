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
    aliases = renamed_keywords(fn)
    if aliases:
        kwargs = {
            aliases.get(k, k) if aliases.get(k) not in kwargs else k: v for k, v in kwargs.items()
        }
    bound = inspect.signature(fn).bind(*args, **kwargs)
    return dict(bound.arguments)


def renamed_keywords(fn: Callable[..., Any]) -> dict[str, str]:
    """``{old name: new name}`` of keywords a deprecation decorator renames before the call.

    transformers' ``deprecate_kwarg(old, version, new_name=new)`` accepts ``old`` and passes it
    on as ``new`` (``past_key_values`` -> ``cache``). Binding the old name as the parameter it
    becomes keeps inputs in signature order, as the call itself will see them. Found from the
    decorator's closure along the ``__wrapped__`` chain; nothing is called.
    """
    aliases: dict[str, str] = {}
    current: Any = getattr(fn, "__func__", fn)
    while current is not None:
        code = getattr(current, "__code__", None)
        cells = getattr(current, "__closure__", None) or ()
        if code is not None and {"old_name", "new_name"} <= set(code.co_freevars):
            values = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
            old, new = values["old_name"], values["new_name"]
            if isinstance(old, str) and isinstance(new, str):
                aliases[old] = new
        current = getattr(current, "__wrapped__", None)
    return aliases


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
