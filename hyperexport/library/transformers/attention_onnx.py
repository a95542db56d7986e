"""ONNX lowering of ``hyperexport::attention`` on both export paths.

Both paths emit the same node, ``hyperexport.attention::Attention`` (inputs ``Q, K, V[, mask]``;
attributes ``is_causal``, ``scale``, and when set ``softcap``, ``q_num_heads``,
``kv_num_heads``, ``causal_hint``), which :class:`hyperexport.library.passes.promote_attention.PromoteAttentionToOpset24Pass`
turns into default-domain ``Attention`` at opset 24.

* TorchScript (``dynamo=False``): a symbolic registered with
  ``torch.onnx.register_custom_op_symbolic`` inside :func:`torchscript_attention_symbolic`.
* dynamo (``dynamo=True``): an onnxscript function in the table of
  :func:`attention_translation_table`, passed as ``custom_translation_table``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import onnx
import onnxscript
import torch
from torch.onnx import symbolic_helper

from hyperexport.base.contracts.names import ATTENTION_DOMAIN
from hyperexport.library.transformers.attention_op import QUALIFIED_NAME, attention_op

log = logging.getLogger(__name__)

ATTENTION_OP_TYPE = "Attention"
ATTENTION_DOMAIN_VERSION = 1
# A TorchScript symbolic registered at opset N serves every export opset >= N.
SYMBOLIC_OPSET = 9

_attention_opset = onnxscript.values.Opset(ATTENTION_DOMAIN, ATTENTION_DOMAIN_VERSION)


def _attention_schema() -> onnx.defs.OpSchema:
    """The custom node's schema, used only to build the node (it is never registered)."""
    schema = onnx.defs.OpSchema
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"]
    optional = schema.FormalParameterOption.Optional
    return schema(
        ATTENTION_OP_TYPE,
        ATTENTION_DOMAIN,
        ATTENTION_DOMAIN_VERSION,
        inputs=[
            schema.FormalParameter("Q", "T"),
            schema.FormalParameter("K", "T"),
            schema.FormalParameter("V", "T"),
            schema.FormalParameter("attn_mask", "U", param_option=optional),
        ],
        outputs=[schema.FormalParameter("Y", "T")],
        type_constraints=[("T", floats, "float tensors"), ("U", [*floats, "tensor(bool)"], "mask")],
        attributes=[
            schema.Attribute("is_causal", schema.AttrType.INT, "", required=False),
            schema.Attribute("scale", schema.AttrType.FLOAT, "", required=False),
            schema.Attribute("softcap", schema.AttrType.FLOAT, "", required=False),
            schema.Attribute("q_num_heads", schema.AttrType.INT, "", required=False),
            schema.Attribute("kv_num_heads", schema.AttrType.INT, "", required=False),
            schema.Attribute("causal_hint", schema.AttrType.INT, "", required=False),
        ],
    )


# No schema is registered for the custom domain, so the op is built from a local one.
_attention_node = onnxscript.values.Op(_attention_opset, ATTENTION_OP_TYPE, _attention_schema())


def _node_attributes(
    is_causal: bool,
    scale: float,
    softcap: float,
    q_num_heads: int,
    kv_num_heads: int,
    causal_hint: bool,
) -> dict[str, Any]:
    """The attributes of the emitted node: defaults (0) are left out, except ``scale``."""
    attributes: dict[str, Any] = {"is_causal": int(bool(is_causal)), "scale": float(scale)}
    if softcap:
        attributes["softcap"] = float(softcap)
    if q_num_heads:
        attributes["q_num_heads"] = int(q_num_heads)
        attributes["kv_num_heads"] = int(kv_num_heads)
    if causal_hint:
        attributes["causal_hint"] = 1
    return attributes


@symbolic_helper.parse_args("v", "v", "v", "v", "b", "f", "f", "i", "i", "b")
def attention_symbolic(
    g: Any,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    is_causal: bool,
    scale: float,
    softcap: float,
    q_num_heads: int,
    kv_num_heads: int,
    causal_hint: bool,
) -> Any:
    """TorchScript symbolic: one ``hyperexport.attention::Attention`` node."""
    inputs = [query, key, value]
    if attn_mask is not None and not attn_mask.node().mustBeNone():
        inputs.append(attn_mask)
    attributes = _node_attributes(is_causal, scale, softcap, q_num_heads, kv_num_heads, causal_hint)
    suffixed = {
        f"{name}_{'f' if isinstance(value, float) else 'i'}": value
        for name, value in attributes.items()
    }
    output = g.op(f"{ATTENTION_DOMAIN}::{ATTENTION_OP_TYPE}", *inputs, **suffixed)
    output.setType(query.type())
    return output


_symbolic_lock = threading.Lock()
_symbolic_depth = 0


@contextmanager
def torchscript_attention_symbolic() -> Iterator[None]:
    """Register the TorchScript symbolic of ``hyperexport::attention`` for the duration.

    Re-entrant: nested uses register once; the outermost exit unregisters.
    """
    global _symbolic_depth
    attention_op()
    with _symbolic_lock:
        if _symbolic_depth == 0:
            torch.onnx.register_custom_op_symbolic(
                QUALIFIED_NAME, attention_symbolic, SYMBOLIC_OPSET
            )
            log.debug("registered TorchScript symbolic for %s", QUALIFIED_NAME)
        _symbolic_depth += 1
    try:
        yield
    finally:
        with _symbolic_lock:
            _symbolic_depth -= 1
            if _symbolic_depth == 0:
                torch.onnx.unregister_custom_op_symbolic(QUALIFIED_NAME, SYMBOLIC_OPSET)
                log.debug("unregistered TorchScript symbolic for %s", QUALIFIED_NAME)


def attention_translation(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    is_causal: bool = False,
    scale: float = 0.0,
    softcap: float = 0.0,
    q_num_heads: int = 0,
    kv_num_heads: int = 0,
    causal_hint: bool = False,
) -> Any:
    """dynamo translation (traced onnxscript function): the same node as the symbolic."""
    inputs = [query, key, value]
    if attn_mask is not None:
        inputs.append(attn_mask)
    attributes = _node_attributes(is_causal, scale, softcap, q_num_heads, kv_num_heads, causal_hint)
    return _attention_node(*inputs, **attributes)


def attention_translation_table() -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` entries for ``torch.onnx.export(..., dynamo=True)``.

    Defines the custom op if needed; merge the result into the exporter's table.
    """
    return {attention_op(): attention_translation}
