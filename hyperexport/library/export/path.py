"""The export-path interface: what every way of turning captured units into ONNX provides.

A path is chosen once, from the public ``dynamo`` flag, by :func:`hyperexport.library.export.registry.
path_for`; everything that differs between paths is asked of the path object:

* its name and the ``dynamo`` flag value it answers to (``label``, recorded in the model's
  metadata);
* the default-domain opsets it accepts (``opsets``, checked by :meth:`ExportPath.check_opset`);
* how capture runs the model for it (:meth:`ExportPath.capture`: the TorchScript path captures
  under ``torch.jit.trace``, so every ``torch.jit.is_tracing()`` branch turns as during export);
* its placeholder op (:meth:`ExportPath.apply_placeholder`), which stands for a hiera child
  while its parent unit is traced;
* the export itself (:meth:`ExportPath.export`): unit jobs in, one ``onnx_ir`` model per unit
  out, yielded as each is made.

A third path is one module with one subclass, plus one line in ``registry.py``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from hyperexport.base.errors import OpsetError
from hyperexport.library.capture.capture_model import capture_model
from hyperexport.library.capture.container import Capture

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from hyperexport.library.export.jobs import UnitJob
    from hyperexport.library.export.placeholders import Dim, ShapeFunction
    from hyperexport.library.options import ExportOptions


class ExportPath(abc.ABC):
    """One export path (TorchScript, dynamo, ...). Instances hold no state.

    Attributes:
        name: Short name (``torchscript``, ``dynamo``), as in logs.
        dynamo: The value of the public ``dynamo`` flag that selects this path.
        opsets: The default-domain opsets this path accepts on the installed torch.
        one_program: Whether :meth:`export` traces every unit in one program (all their
            modules live at once) rather than one unit per step of its generator.
    """

    name: ClassVar[str]
    dynamo: ClassVar[bool]
    opsets: ClassVar[range]
    one_program: ClassVar[bool]

    @property
    def label(self) -> str:
        """How errors, logs and the model's metadata name the path: ``dynamo=True``."""
        return f"dynamo={self.dynamo}"

    def check_opset(self, opset: int) -> None:
        """Raise :class:`OpsetError` when ``opset`` is outside :attr:`opsets`."""
        if opset not in self.opsets:
            raise OpsetError(
                f"opset {opset} is outside what the {self.label} ({self.name}) path supports "
                f"({self.opsets.start}..{self.opsets.stop - 1})"
            )

    def capture(
        self, model: torch.nn.Module, args: Any, kwargs: Mapping[str, Any] | None = None, **kw: Any
    ) -> Capture:
        """Capture ``model`` as this path will export it (see :func:`capture_model`).

        ``kw`` are :func:`capture_model`'s settings other than the path (``hiera``, ``method``,
        ``attention``, ``dynamic_axes``, ``probe_shapes``).
        """
        return capture_model(model, args, kwargs, dynamo=self.dynamo, **kw)

    @abc.abstractmethod
    def apply_placeholder(
        self,
        op_type: str,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        output_dims: Sequence[tuple[Dim, ...]] = (),
        derived: ShapeFunction | None = None,
    ) -> Sequence[torch.Tensor]:
        """Emit the placeholder node ``hyperexport.placeholder::<op_type>`` into the trace.

        Args:
            op_type: The placeholder's op type (``P3``).
            inputs: The child's live tensor inputs, then its weights.
            outputs: The child's captured outputs (shapes and dtypes to reproduce).
            output_dims: Per output, each dimension's size or how to read it off the inputs
                (None: derived by the child from its inputs' sizes).
            derived: The child's output shapes as a function of ``inputs``; given when a
                dimension is derived.

        Returns:
            Tensors standing for the child's outputs in the parent's trace.
        """

    @abc.abstractmethod
    def export(
        self,
        jobs: Sequence[UnitJob],
        *,
        model: torch.nn.Module,
        modules: Mapping[str, torch.nn.Module],
        capture: Capture,
        opset: int,
        options: ExportOptions,
    ) -> Iterator[tuple[str, ir.Model]]:
        """Export every unit job; yield ``(job name, the unit's model)`` in the jobs' order.

        A unit's weight initializers may be references to the live model's tensors
        (``ir.TorchTensor``): the caller writes each unit before asking for the next.

        Args:
            jobs: The units, root first, each with its direct hiera children as specs.
            model: The root model.
            modules: Every module of the model by its path.
            capture: The capture the jobs were made from (the children's outputs).
            opset: Default-domain opset (already checked against :attr:`opsets`).
            options: The export options (attention implementation, custom ops).

        Raises:
            ModuleExportError: The export failed; names the unit's module and the path.
        """
