"""The export manifest: which module call became which function call, and with which inputs.

It is written beside the exported model and read by the check stage, which runs every function
alone on the tensors captured for its module call. No torch and no onnx here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# Defined in names.py; re-exported here, where importers have always found them.
from hyperexport.base.contracts.names import FUNCTION_DOMAIN as FUNCTION_DOMAIN
from hyperexport.base.contracts.names import META_EXPORT_PATH as META_EXPORT_PATH
from hyperexport.base.contracts.names import META_FALLBACK as META_FALLBACK
from hyperexport.base.contracts.names import META_FUNCTION_MODE as META_FUNCTION_MODE
from hyperexport.base.contracts.names import NO_FUSION
from hyperexport.base.contracts.names import PLACEHOLDER_DOMAIN as PLACEHOLDER_DOMAIN


@dataclass(frozen=True)
class FunctionEntry:
    """One ONNX local function made from a hiera module.

    Attributes:
        domain: Function domain.
        name: Function name (stable, readable: derived from class and module path).
        class_name: Qualified class of the module(s) it was made from.
        module_paths: Paths of the instances that call it (one in per-instance mode).
        split_reason: Per-type mode, when instances of its class got separate functions: what
            differs from the first function of the class (an attribute read in forward and its
            two values, a submodule's class, an input shape); empty otherwise.
        fused_ops: With ``rewrite.fuse``: ``(op, nodes)`` of the fused kernels in its body
            (``contracts.names.FUSED_OPS``, ``domain::op``); empty otherwise (and then absent
            from the JSON).
    """

    domain: str
    name: str
    class_name: str
    module_paths: tuple[str, ...]
    split_reason: str = ""
    fused_ops: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class CallSite:
    """One call of a function, tied back to the captured module call.

    Attributes:
        call_id: ``ModuleCall.call_id`` of the captured call.
        module_path: Module path of the instance.
        domain: Domain of the called function.
        name: Name of the called function.
        data_inputs: For each function input that carries module data, the capture tensor key
            fed to it (in the function's input order, before weight inputs).
        weight_inputs: For each remaining function input (per-type mode), the name of the
            main-graph initializer that holds the instance's weight.
        outputs: For each function output, the capture tensor key of the module's output.
    """

    call_id: str
    module_path: str
    domain: str
    name: str
    data_inputs: tuple[str, ...]
    weight_inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class ExportManifest:
    """What the export and rewrite stages made, in terms the check stage can verify.

    Attributes:
        dynamo: Which export path produced the model (also in the model's metadata_props).
        opset: The default-domain opset of the exported model.
        function_mode: ``per_instance`` or ``per_type``.
        graph_inputs: Capture tensor keys fed to the main graph's inputs, in order.
        graph_outputs: Capture tensor keys that the main graph's outputs reproduce, in order.
        functions: Every function made from a hiera module.
        calls: Every call site, in module execution order.
        fallback_from: Set when the other path failed and this one was used instead.
        probe_inputs: With dynamic axes: capture keys of the graph inputs at a second shape.
        probe_outputs: The reference outputs at that shape.
        fusion: ``rewrite.fuse``: ``none``, ``standard`` (ONNX's fused ops only: a portable
            model) or ``onnxruntime`` (ONNX Runtime's contrib kernels: the model runs in ONNX
            Runtime only). ``none`` is absent from the JSON (manifests from before the field
            read as ``none``).
        kv_buffers: With a generation step's pasts made onnxruntime-genai's shared buffers
            (``library/passes/share_kv_buffer.py``): ``(owner, input positions)`` of the buffer inputs,
            owner ``""`` the main graph, else a function's name. The check feeds them padded
            (``library/check/kv_buffer.py``). Empty otherwise, and then absent from the JSON.
    """

    dynamo: bool
    opset: int
    function_mode: str
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]
    functions: tuple[FunctionEntry, ...]
    calls: tuple[CallSite, ...]
    fallback_from: str | None = None
    probe_inputs: tuple[str, ...] = ()
    probe_outputs: tuple[str, ...] = ()
    fusion: str = "none"
    kv_buffers: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def buffers_of(self, owner: str) -> tuple[int, ...]:
        """The buffer input positions of ``owner`` (``""``: the main graph); empty if none."""
        return dict(self.kv_buffers).get(owner, ())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # Without a fusion the JSON is what it was before the fields existed, byte for byte.
        if self.fusion == NO_FUSION:
            del data["fusion"]
        if self.kv_buffers:
            data["kv_buffers"] = {owner: list(inputs) for owner, inputs in self.kv_buffers}
        else:
            del data["kv_buffers"]
        for entry in data["functions"]:
            if entry["fused_ops"]:
                entry["fused_ops"] = dict(entry["fused_ops"])
            else:
                del entry["fused_ops"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExportManifest:
        return cls(
            dynamo=data["dynamo"],
            opset=data["opset"],
            function_mode=data["function_mode"],
            graph_inputs=tuple(data["graph_inputs"]),
            graph_outputs=tuple(data["graph_outputs"]),
            functions=tuple(
                FunctionEntry(
                    f["domain"],
                    f["name"],
                    f["class_name"],
                    tuple(f["module_paths"]),
                    f.get("split_reason", ""),
                    tuple(sorted((op, int(n)) for op, n in f.get("fused_ops", {}).items())),
                )
                for f in data["functions"]
            ),
            calls=tuple(
                CallSite(
                    c["call_id"],
                    c["module_path"],
                    c["domain"],
                    c["name"],
                    tuple(c["data_inputs"]),
                    tuple(c["weight_inputs"]),
                    tuple(c["outputs"]),
                )
                for c in data["calls"]
            ),
            fallback_from=data.get("fallback_from"),
            probe_inputs=tuple(data.get("probe_inputs", ())),
            probe_outputs=tuple(data.get("probe_outputs", ())),
            fusion=data.get("fusion", "none"),
            kv_buffers=tuple(
                (owner, tuple(int(i) for i in inputs))
                for owner, inputs in sorted(data.get("kv_buffers", {}).items())
            ),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, indent=1)

    @classmethod
    def loads(cls, text: str) -> ExportManifest:
        return cls.from_json(json.loads(text))
