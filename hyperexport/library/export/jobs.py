"""One unit to export: the wrapper module, its example inputs and names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from hyperexport.library.export.placeholders import (
    PlaceholderSpec,
)


@dataclass(frozen=True)
class UnitJob:
    """One unit to export: its wrapper module, example inputs and names.

    Attributes:
        name: The unit's name (``root``, ``u003``).
        module_path: Path of the unit's module, for error messages (``""`` for the root).
        wrapper: The module to trace: takes the flat inputs, returns the flat outputs.
        inputs: Flat example inputs.
        input_names: Graph input names of the unit's model.
        output_names: Graph output names of the unit's model.
        dynamic_axes: ``{input name: {axis: dim name}}`` (outputs' entries are ignored).
        specs: The unit's direct hiera children, in call order.
    """

    name: str
    module_path: str
    wrapper: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    specs: tuple[PlaceholderSpec, ...] = ()

    @property
    def input_axes(self) -> dict[str, Mapping[int, str]]:
        """The dynamic axes of the graph inputs."""
        return {k: v for k, v in self.dynamic_axes.items() if k in self.input_names}
