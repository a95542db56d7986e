"""``hiera: auto`` and ``inputs: auto``: resolved on the live model, inside the trace and export stages.

Recipe validation never imports torch, so ``auto`` stays ``auto`` in the recipe (and in the stage
keys); :func:`resolve_auto` replaces it with explicit values right after a stage has loaded the
model, and records what it chose and why (``auto.json``, published beside the model).

* ``inputs: auto``: every input the forward needs, from the model's config
  (:mod:`hyperexport.library.models.auto_inputs`); the model runs once on them, and a forward that
  still fails is refused with one line naming the model class and the inputs to set.
* ``hiera: auto`` picks the model's transformer stacks: the classes of the members of
  ``nn.ModuleList`` s that actually run in forward and hold an attention module, outermost
  first (an encoder's and a decoder's layers, each tower of a two-tower model). A class nested
  inside a chosen one (T5's sub-layers, Swin's blocks inside its stages) and convolutional
  feature layers without attention (wav2vec2's feature encoder) are rejected, and
  ``auto.json`` says why for each candidate. A model without attention blocks (ResNet,
  ConvNeXt) gets its main repeated stack: transformers' ``_no_split_modules`` is only a hint
  (BERT declares none, ViT lists its embeddings, Whisper a decoder layer that never runs in
  its encoder); among running candidates, a hinted class wins, then the most calls, then the
  larger, then the outer one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import AUTO as AUTO
from hyperexport.base.contracts.names import AUTO_FILE as AUTO_FILE
from hyperexport.base.errors import RecipeError
from hyperexport.library.models.auto_inputs import auto_inputs as auto_inputs
from hyperexport.library.models.auto_inputs import dry_run, forward_refused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoResolution:
    """What ``auto`` became, and why.

    Attributes:
        hiera: The classes chosen (qualified names), or None when the recipe named them.
        hiera_reason: Why those classes (calls, container, hint).
        inputs: The input specs made (recipe ``inputs`` form), or None when the recipe gave them.
        inputs_reason: Which config fields and main input they came from.
        hiera_candidates: Every class that ran from an ``nn.ModuleList``: ``class``, ``calls``,
            ``lists``, ``chosen`` and the ``reason`` it was chosen or rejected.
    """

    hiera: tuple[str, ...] | None
    hiera_reason: str
    inputs: Mapping[str, Mapping[str, Any]] | None
    inputs_reason: str
    hiera_candidates: tuple[Mapping[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "hiera": list(self.hiera) if self.hiera is not None else None,
            "hiera_reason": self.hiera_reason,
            "hiera_candidates": [dict(c) for c in self.hiera_candidates],
            "inputs": {k: dict(v) for k, v in self.inputs.items()} if self.inputs else None,
            "inputs_reason": self.inputs_reason,
        }


def is_auto(value: Any) -> bool:
    """Whether a recipe value is the string ``auto``."""
    return isinstance(value, str) and value == AUTO


def resolve_auto(
    params: Mapping[str, Any], model: Any, recipe_file: str, out_dir: Path | None = None
) -> dict[str, Any]:
    """``params`` with ``inputs: auto`` and ``hiera: auto`` replaced by explicit values.

    Args:
        params: A stage's recipe slice (``inputs``, ``hiera``, optionally ``dynamic``/``method``).
        model: The live model.
        recipe_file: For error messages.
        out_dir: Where to write ``auto.json`` (the resolution), if anything was ``auto``.

    Raises:
        RecipeError: Naming ``inputs`` or ``hiera`` and what was found.
    """
    out = dict(params)
    want_inputs, want_hiera = is_auto(params.get("inputs")), is_auto(params.get("hiera"))
    if not (want_inputs or want_hiera):
        return out
    dynamic = is_auto(params.get("dynamic"))
    method = str(params.get("method") or "forward")
    candidates: tuple[dict[str, Any], ...] = ()
    try:
        inputs, in_reason = (
            auto_inputs(model, dynamic=dynamic) if want_inputs else (None, "given by the recipe")
        )
        if inputs is not None:
            out["inputs"] = inputs
        if want_hiera:
            classes, hiera_reason, candidates = hiera_choice(model, out["inputs"], method)
        else:
            classes, hiera_reason = None, "given by the recipe"
            if want_inputs:
                dry_run(model, out["inputs"], method)
    except RecipeError as e:
        raise RecipeError(recipe_file, e.field, e.reason) from e
    if classes is not None:
        out["hiera"] = list(classes)
    resolution = AutoResolution(classes, hiera_reason, inputs, in_reason, candidates)
    for line in (f"hiera: {hiera_reason}", f"inputs: {in_reason}"):
        log.info("auto %s", line)
    if out_dir is not None:
        from hyperexport.base.atomic import atomic_write_text

        text = json.dumps(resolution.to_json(), sort_keys=True, indent=1) + "\n"
        atomic_write_text(out_dir / AUTO_FILE, text)
    return out


# --------------------------------------------------------------------------------------------
# hiera: auto
# --------------------------------------------------------------------------------------------
@dataclass
class _Candidate:
    cls: type
    calls: int = 0
    parameters: int = 0
    depth: int = 10**6
    lists: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    attention: str | None = None
    convolution: bool = False


def auto_hiera(
    model: Any, input_specs: Mapping[str, Mapping[str, Any]], method: str = "forward"
) -> tuple[tuple[str, ...], str]:
    """The classes of the model's transformer stacks (or main repeated stack); and why.

    Raises:
        RecipeError: ``hiera``: no ``nn.ModuleList`` member runs in forward; ``inputs``: the
            forward fails on ``input_specs``.
    """
    classes, reason, _ = hiera_choice(model, input_specs, method)
    return classes, reason


def hiera_choice(
    model: Any, input_specs: Mapping[str, Mapping[str, Any]], method: str = "forward"
) -> tuple[tuple[str, ...], str, tuple[dict[str, Any], ...]]:
    """:func:`auto_hiera`, plus each candidate class with the reason it was chosen or rejected.

    Raises:
        RecipeError: As :func:`auto_hiera`.
    """
    candidates = _running_candidates(model, input_specs, method)
    if not candidates:
        raise RecipeError(
            "",
            "hiera",
            f"auto found no repeated blocks in {type(model).__name__}: no nn.ModuleList member "
            "runs in forward; name the classes in hiera",
        )
    hints = set(getattr(model, "_no_split_modules", None) or ())
    verdicts = _stacks(candidates) or _main_stack(candidates, hints)
    chosen = [c for c in candidates if verdicts[c.cls][0]]
    names = tuple(f"{c.cls.__module__}.{c.cls.__qualname__}" for c in chosen)
    parts = [f"{c.cls.__name__}: {verdicts[c.cls][1]}" for c in chosen]
    rejected = [c for c in candidates if not verdicts[c.cls][0]]
    if rejected:
        parts.append(
            "not chosen: " + ", ".join(f"{c.cls.__name__} ({verdicts[c.cls][1]})" for c in rejected)
        )
    ignored = sorted(hints - {c.cls.__name__ for c in candidates})
    if ignored:
        parts.append(f"hints that never run from a ModuleList: {', '.join(ignored)}")
    records = tuple(
        {
            "class": f"{c.cls.__module__}.{c.cls.__qualname__}",
            "calls": c.calls,
            "lists": list(c.lists),
            "chosen": verdicts[c.cls][0],
            "reason": verdicts[c.cls][1],
        }
        for c in chosen + rejected
    )
    return names, "; ".join(parts), records


def _running_candidates(
    model: Any, input_specs: Mapping[str, Mapping[str, Any]], method: str
) -> list[_Candidate]:
    """The classes of ``nn.ModuleList`` members that run in one forward, with what they hold."""
    import torch

    from hyperexport.library.models.inputs import make_inputs

    members: dict[int, tuple[str, torch.nn.Module]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            for i, child in enumerate(module):
                members.setdefault(id(child), (f"{name}.{i}" if name else str(i), child))
    ran: dict[int, int] = {}
    handles = [
        child.register_forward_pre_hook(
            lambda m, args, key=key: ran.__setitem__(key, ran.get(key, 0) + 1)
        )
        for key, (_, child) in members.items()
        if not type(child).__module__.startswith("torch.")
    ]
    try:
        with torch.no_grad():
            getattr(model, method)(**make_inputs(input_specs))
    except (ValueError, TypeError, RuntimeError, AttributeError, IndexError, KeyError) as e:
        raise forward_refused(model, input_specs, e) from e
    finally:
        for h in handles:
            h.remove()
    candidates: dict[type, _Candidate] = {}
    for key, calls in ran.items():  # first call first
        path, child = members[key]
        c = candidates.setdefault(type(child), _Candidate(type(child)))
        c.calls += calls
        c.parameters = max(c.parameters, sum(p.numel() for p in child.parameters()))
        c.depth = min(c.depth, path.count("."))
        c.paths += (path,)
        container = path.rsplit(".", 1)[0]
        if container not in c.lists:
            c.lists += (container,)
        for sub in child.modules():
            sub_name = type(sub).__name__
            if sub is not child and c.attention is None and "attention" in sub_name.lower():
                c.attention = sub_name
            if isinstance(sub, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
                c.convolution = True
    # In the order they first ran (an encoder before its decoder).
    return list(candidates.values())


_Verdicts = dict[type, tuple[bool, str]]


def _stacks(candidates: list[_Candidate]) -> _Verdicts:
    """The outermost classes holding attention, each with its reason; {} when none holds any."""
    blocks = [c for c in candidates if c.attention is not None]
    if not blocks:
        return {}
    verdicts: _Verdicts = {}
    for c in candidates:
        outer = _enclosing(c, blocks)
        if outer is not None:
            verdicts[c.cls] = (False, f"{_calls(c)}, inside {outer.cls.__name__}")
        elif c.attention is None:
            kind = "convolutional feature layers" if c.convolution else "blocks"
            verdicts[c.cls] = (False, f"{_calls(c)}, {kind} without attention")
        else:
            lists = ", ".join(repr(x) for x in c.lists)
            verdicts[c.cls] = (
                True,
                f"a transformer block ({c.attention} inside), {_calls(c)} from "
                f"nn.ModuleList {lists}",
            )
    return verdicts


def _enclosing(c: _Candidate, blocks: list[_Candidate]) -> _Candidate | None:
    for b in blocks:
        if b is not c and all(any(p.startswith(q + ".") for q in b.paths) for p in c.paths):
            return b
    return None


def _main_stack(candidates: list[_Candidate], hints: set[str]) -> _Verdicts:
    """No attention anywhere: the main repeated stack (hint, calls, size, outermost)."""
    ranked = sorted(
        candidates,
        key=lambda c: (c.cls.__name__ in hints, c.calls, c.parameters, -c.depth),
        reverse=True,
    )
    best = ranked[0]
    why = "listed in _no_split_modules, " if best.cls.__name__ in hints else ""
    lists = ", ".join(repr(x) for x in best.lists)
    verdicts: _Verdicts = {best.cls: (True, f"{why}{_calls(best)} from nn.ModuleList {lists}")}
    for c in ranked[1:]:
        # Other classes that share the winner's lists (a stack mixing two layer kinds) come along.
        if set(c.lists) & set(best.lists):
            verdicts[c.cls] = (True, f"{_calls(c)}, in the same lists as {best.cls.__name__}")
        else:
            verdicts[c.cls] = (False, f"{_calls(c)}")
    return verdicts


def _calls(c: _Candidate) -> str:
    return f"{c.calls} call{'s' if c.calls != 1 else ''}"
