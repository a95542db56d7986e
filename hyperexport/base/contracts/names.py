"""Names that several packages must agree on, defined once: files, keys, domains, opsets.

Every stage's output files, the key prefixes of a capture's tensor store, the ONNX domains and
metadata keys hyperexport writes, and the opset ranges of the two export paths. No imports:
any package may depend on this module.
"""

from __future__ import annotations

# -- the check ----------------------------------------------------------------------------------
#: Which call sites get a per-function check (``check.function_scope``, ``CheckSettings``): every
#: one, the first call of each class, none. Here so that the recipe schema and the check library
#: share one set without one importing the other.
FUNCTION_SCOPES = (ALL_CALLS, FIRST_INSTANCE, NO_CALLS) = ("all", "first_instance", "none")

# -- the build's stages --------------------------------------------------------------------------
#: Their names, in pipeline order (``stages/pipeline.py`` builds them; a test holds the two
#: together): what ``build.force`` accepts and what reports and sweep tables list.
STAGE_NAMES = (TRACE, EXPORT, REWRITE, QUANTIZE, EVALUATE, CHECK) = (
    "trace",
    "export",
    "rewrite",
    "quantize",
    "evaluate",
    "check",
)

# -- files of the stages' outputs ---------------------------------------------------------------
#: The trace: the capture record and its tensors (numpy ``.npz``, never pickles).
CAPTURE_JSON = "capture.json"
TENSORS_NPZ = "tensors.npz"
#: The export: the bundle record and one ONNX file per unit under ``units/`` (the root unit,
#: then ``u<order of the unit's first call>``), and the weights' one data file beside them.
BUNDLE_JSON = "bundle.json"
UNITS_DIR = "units"
ROOT_UNIT = "root"
WEIGHTS_FILE = "weights.data"
#: The export: a copy of the capture record beside the bundle, so that it composes on its own.
CAPTURE_RECORD = CAPTURE_JSON
#: The export: the capture (record + tensors) its bundle was exported from, the check stage's
#: reference (the trace's, or after a fallback the one re-made for the other path).
REFERENCE_DIR = "reference"
#: The trace: the resolution of ``auto`` (published), when the recipe used it.
AUTO_FILE = "auto.json"
#: The trace: the frozen capture specification the export captures again from, never ``auto``.
CAPTURE_SPEC_JSON = "capture_spec.json"
#: A transformers checkpoint folder is one holding this file (its model config).
CHECKPOINT_CONFIG = "config.json"
#: What a recipe's ``checkpoint`` may be: safetensors (a file, or a folder of them), or a torch
#: state dict file.
SAFETENSORS = ".safetensors"
CHECKPOINT_SUFFIXES = (SAFETENSORS, ".pt", ".pth", ".bin")
#: A checkpoint's tokenizer files: keyed with the checkpoint, and copied beside a generation
#: model (so ``onnxruntime_genai.Tokenizer(model)`` works on the output folder).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
#: The rewrite: the final model (+ ``<model>.data`` with external data) and its manifest.
MODEL_FILE = "model.onnx"
MANIFEST_JSON = "manifest.json"
#: The quantize stage (``quantize.method`` other than ``none``): the quantized model (+ its
#: ``.data``) beside the float one, and its manifest (per_type weight inputs renamed).
QUANTIZED_MODEL_FILE = "model.quantized.onnx"
QUANTIZED_MANIFEST_JSON = "manifest.quantized.json"
#: The evaluate stage: what ONNX Runtime computed (``library/check/evaluation.py``) ...
EVALUATION_JSON = "evaluation.json"
EVALUATION_ARRAYS = "evaluation.npz"
#: ... the comparison of the quantized model with the float one, both run there
#: (``library/check/quantized_record.py``) ...
QUANTIZED_JSON = "quantized.json"
#: ... and the files it ran and decoded with, by digest: what the check vouches for.
EVALUATED_JSON = "evaluated.json"
#: The check: its report and the report's summary lines.
CHECK_JSON = "check.json"
CHECK_SUMMARY = "check.txt"

# -- values several packages accept ------------------------------------------------------------
#: ``hiera: auto`` / ``inputs: auto`` / ``dynamic: auto``: resolved on the live model
#: (``library/models/auto.py``); recipe validation only checks the spelling.
AUTO = "auto"
#: ``task`` values (``library/tasks/registry.py``): one forward graph (the default), and the step model
#: with past/present KV that onnxruntime-genai decodes with.
FORWARD = "forward"
TEXT_GENERATION = "text-generation"
#: ... and the encoder-decoder tasks: an encoder graph and a decoder graph.
TEXT2TEXT_GENERATION = "text2text-generation"
SPEECH_RECOGNITION = "automatic-speech-recognition"
#: Their graphs, in the order they run: the stages keep each graph's files in a folder of this
#: name and publish ``<graph>_model.onnx``; the report reads ``<graph>_manifest``/``_capture``.
SEQ2SEQ_GRAPHS = ("encoder", "decoder")
#: ``weights`` values: load the model whole, stream its weights from the checkpoint's
#: safetensors files one hiera module at a time (``docs/streaming.md``), or ``auto``: stream
#: only when loading would not fit.
WEIGHTS_MODES = (AUTO, WEIGHTS_LOAD, WEIGHTS_STREAM) = (AUTO, "load", "stream")
#: ``rewrite.fuse`` (``RewriteOptions.fuse``) that fuses nothing, the one that makes ONNX's own
#: fused ops (opset 24), and ONNX Runtime's contrib kernels; the value set is ``options.Fusion``.
NO_FUSION = "none"
STANDARD_FUSION = "standard"
ONNXRUNTIME_FUSION = "onnxruntime"
#: ``quantize.method`` that quantizes nothing (the default): the quantize stage writes nothing.
NO_QUANTIZATION = "none"
#: transformers' own attention implementations: hyperexport registers its entry under another
#: name (recipe validation, ``AttentionOptions``, ``library/transformers/attention.py``).
BUILTIN_ATTENTION = ("eager", "sdpa", "flex_attention", "paged_attention")
#: ``attention.implementation`` that exports each attention call as one node
#: (``library/transformers/attention.py`` registers it; the ONNX Runtime fusion makes it GroupQueryAttention).
HYPEREXPORT_ATTENTION = "hyperexport"

# -- tensor keys of a capture -------------------------------------------------------------------
#: Prefix of the tensors recorded by the second run at ``check_shape`` (dynamic axes).
PROBE_PREFIX = "probe/"


def probe_key(key: str) -> str:
    """The key of tensor ``key``'s counterpart in the run at the second shape."""
    return f"{PROBE_PREFIX}{key}"


# -- ONNX domains and metadata keys -------------------------------------------------------------
FUNCTION_DOMAIN = "hyperexport.fn"
PLACEHOLDER_DOMAIN = "hyperexport.placeholder"
ATTENTION_DOMAIN = "hyperexport.attention"
#: The attributes of its ``Attention`` node (``library/transformers/attention_onnx.py`` writes them; the
#: passes that turn the node into ONNX or ONNX Runtime attention read them).
ATTENTION_ATTRIBUTES = (
    "is_causal",
    "scale",
    "softcap",
    "q_num_heads",
    "kv_num_heads",
    "causal_hint",
)
META_EXPORT_PATH = "hyperexport.export_path"  # "dynamo=False" | "dynamo=True"
META_FALLBACK = "hyperexport.fallback_from"
META_FUNCTION_MODE = "hyperexport.function_mode"
META_MODULE_CLASS = "hyperexport.module_class"
META_MODULE_PATH = "hyperexport.module_path"
#: ``hyperexport.version.<distribution>``: the versions a model was built with (torch,
#: transformers, onnxscript, onnx, onnxruntime, hyperexport; ``versions.RECORDED_DISTRIBUTIONS``).
META_VERSION_PREFIX = "hyperexport.version."
#: The quantized ops (domain ``com.microsoft``) the quantize stage writes, and ``show`` counts.
QUANTIZED_DOMAIN = "com.microsoft"
QUANTIZED_OP_TYPES = ("MatMulNBits", "DynamicQuantizeMatMul")

#: What each ``rewrite.fuse`` writes (``library/passes/fuse_ops.py``): op types as ``domain::op``
#: (default-domain ops without a domain). ``show`` and the manifest count them per function.
FUSED_OPS = {
    "standard": ("Attention", "RMSNormalization", "RotaryEmbedding"),
    "onnxruntime": (
        "SimplifiedLayerNormalization",
        "com.microsoft::GroupQueryAttention",
        "com.microsoft::MultiHeadAttention",
        "com.microsoft::RotaryEmbedding",
        "com.microsoft::SkipSimplifiedLayerNormalization",
        "com.microsoft::SkipLayerNormalization",
        "com.microsoft::FastGelu",
        "com.microsoft::Gelu",
        "com.microsoft::QuickGelu",
    ),
}


def op_id(domain: str, op_type: str) -> str:
    """``domain::op``, or ``op`` for the default domain (as :data:`FUSED_OPS` names ops)."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


#: The name prefix of a function input that the function no longer computes itself: a value
#: every call site fed alike (the mask's arithmetic of a layer, say) is computed once in the
#: main graph and passed in (``passes/hoist_invariants.py``). The manifest lists such an input
#: as neither data nor weight; the check computes it again from the call's own inputs
#: (``check/invariant_inputs.py``).
INVARIANT_INPUT_PREFIX = "invariant."


def is_invariant_input(name: str | None) -> bool:
    """Whether a function input of this name is one the main graph computes for every call."""
    return name is not None and name.startswith(INVARIANT_INPUT_PREFIX)


# -- opsets -------------------------------------------------------------------------------------
MIN_OPSET = 7
TORCHSCRIPT_MAX_OPSET = 20
#: torch's dynamo exporter builds at opset 18 at least; asked for less, it tries onnx's version
#: converter, which fails on common graphs (ReduceMean's axes input -> attribute) and then keeps
#: opset 18 with only a log line. Below 18 the dynamo path is refused, not silently raised.
DYNAMO_MIN_OPSET = 18
DYNAMO_MAX_OPSET = 24
#: ``{dynamo: (lowest, highest)}`` default-domain opset an export path supports.
OPSET_RANGES = {
    False: (MIN_OPSET, TORCHSCRIPT_MAX_OPSET),
    True: (DYNAMO_MIN_OPSET, DYNAMO_MAX_OPSET),
}
#: Attention promotion re-declares the model at this opset ...
PROMOTED_OPSET = 24
#: ... and needs an export opset of at least this.
PROMOTE_MIN_OPSET = 18
