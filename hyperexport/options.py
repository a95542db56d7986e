"""The frozen options object of the library API.

Everything beyond HyperONNX's flat signature goes here, not into new keyword flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FunctionMode = Literal["per_instance", "per_type"]


@dataclass(frozen=True)
class CustomOpSymbolic:
    """A user symbolic for the TorchScript path: ``register_custom_op_symbolic(name, fn, opset)``.

    Attributes:
        name: The aten-style qualified op name, ``"domain::op"``.
        symbolic: Import path of the symbolic function, ``"package.module:function"``.
        opset: The opset version the symbolic is registered for.
    """

    name: str
    symbolic: str
    opset: int


@dataclass(frozen=True)
class RewriteOptions:
    """Which rewrite passes run after the functions are composed.

    Attributes:
        fold_leftovers: Fold the top-level nodes between function calls into functions of their own.
        fuse_constants: Move constants fed to a function call into the function body (off by
            default: it freezes values such as masks and position embeddings at the traced shape).
        optimize: Run onnxscript's optimizer with functions kept (not inlined). Off by default:
            on a 4-layer tiny Llama it costs several times the export itself.
    """

    fold_leftovers: bool = False
    fuse_constants: bool = False
    optimize: bool = False


@dataclass(frozen=True)
class AttentionOptions:
    """Attention handling (see hyperexport.transformers.attention).

    Attributes:
        implementation: Name registered in transformers' AttentionInterface, or None to leave the
            model's attention alone.
        promote_opset24: Rewrite attention nodes to default-domain ONNX ``Attention`` (opset 24).
    """

    implementation: str | None = None
    promote_opset24: bool = False


@dataclass(frozen=True)
class ExportOptions:
    """Options of :func:`hyperexport.export_hyper_onnx` beyond its HyperONNX-compatible signature.

    Attributes:
        functions: ``per_instance`` bakes each instance's weights into its own function;
            ``per_type`` shares one function per module structure and passes weights as inputs.
        fallback: If the chosen export path fails, try the other one (logged at WARNING and
            recorded in the model's metadata).
        custom_ops: User symbolics registered for the TorchScript path during export.
        rewrite: Rewrite-pass switches.
        attention: Attention registration and promotion.
        external_data_threshold: Tensors at least this many bytes go to the external data file
            when external data is on.
        dynamic_axes: ``{input name: {axis: dim name}}``, on both paths. The model then runs a
            second time at another shape (the probe) to find which dimensions of every hiera
            call are dynamic; the check stage compares the export with torch at that shape.
        probe_shapes: ``{input name: shape}`` of that second run (default: each dynamic
            dimension grows by a small amount).
        method: Name of the model method to export, when it is not ``forward``.
    """

    functions: FunctionMode = "per_instance"
    fallback: bool = False
    custom_ops: tuple[CustomOpSymbolic, ...] = ()
    rewrite: RewriteOptions = field(default_factory=RewriteOptions)
    attention: AttentionOptions = field(default_factory=AttentionOptions)
    external_data_threshold: int = 1024
    dynamic_axes: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()
    probe_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    method: str = "forward"
