"""ONNX Runtime's default-domain contrib ops, as onnx's checker must know them.

The ``onnxruntime`` fusion writes ``SimplifiedLayerNormalization``
(``passes/load_time_fusions.py``), which ONNX Runtime registers in the default domain and onnx
does not. For such a model the
checker is told the op's schema (ONNX Runtime's: its inputs, outputs, type constraints and
attributes) for the length of one check, and forgets it after: a ``standard`` (portable) model
is checked against onnx alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from onnx import defs
from onnx.defs import OpSchema

from hyperexport.base.contracts.names import ONNXRUNTIME_FUSION

_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]


def _simplified_layer_normalization() -> OpSchema:
    parameter = OpSchema.FormalParameter
    optional = OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "SimplifiedLayerNormalization",
        "",
        1,
        doc="ONNX Runtime's RMSNorm: x / sqrt(mean(x**2) + epsilon) * scale.",
        inputs=[parameter("X", "T"), parameter("scale", "V")],
        outputs=[parameter("Y", "V"), parameter("inv_std_var", "U", param_option=optional)],
        type_constraints=[
            ("T", _FLOATS, "The input's type."),
            ("U", ["tensor(float)", "tensor(double)"], "The statistics' type."),
            ("V", _FLOATS, "The scale's and the output's type."),
        ],
        attributes=[
            OpSchema.Attribute("axis", OpSchema.AttrType.INT, "The first normalised axis."),
            OpSchema.Attribute("epsilon", OpSchema.AttrType.FLOAT, "Added to the mean square."),
            OpSchema.Attribute("stash_type", OpSchema.AttrType.INT, "The computation's type."),
        ],
    )


SCHEMAS = (_simplified_layer_normalization,)


@contextmanager
def known_to_checker(fusion: str) -> Iterator[None]:
    """While inside, onnx's schemas include ONNX Runtime's default-domain contrib ops when
    ``fusion`` is ``onnxruntime`` (an op onnx itself already has is left as onnx has it)."""
    added = []
    if fusion == ONNXRUNTIME_FUSION:
        for make in SCHEMAS:
            schema = make()
            if not defs.has(schema.name, schema.domain):
                defs.register_schema(schema)
                added.append(schema)
    try:
        yield
    finally:
        for schema in added:
            defs.deregister_schema(schema.name, schema.since_version, schema.domain)
