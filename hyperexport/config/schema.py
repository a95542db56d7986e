"""Recipe and build schemas (structured configs whose defaults are the recipe defaults) and the validated, frozen results."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from hyperexport.config.paths import DEFAULT_OUTPUTS_DIR
from hyperexport.contracts.names import OPSET_RANGES as OPSET_RANGES
from hyperexport.contracts.names import PROMOTE_MIN_OPSET as PROMOTE_MIN_OPSET

DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)


FUNCTION_MODES = ("per_instance", "per_type")


FUNCTION_SCOPES = ("all", "first_instance", "none")


# Default-domain opsets each export path can produce, and the lowest export opset attention
# promotion accepts (it re-declares the model at 24 without converting other ops, and the Reduce*
# ops changed signature at 18): defined once, in hyperexport.contracts.names.


# transformers' own attention implementations: hyperexport registers its entry under another name.
BUILTIN_ATTENTION = ("eager", "sdpa", "flex_attention", "paged_attention")


BUILD_KEYS = ("build", "recipe_file")
#: ``build.remote_mode`` values.
REMOTE_MODES = ("read_write", "read_only")


# ``hiera: auto`` / ``inputs: auto`` / ``dynamic: auto``: resolved on the live model inside the
# trace and export stages (hyperexport.models.auto); validation only checks the spelling.
AUTO = "auto"
DYNAMIC_MODES = ("none", AUTO)


# --------------------------------------------------------------------------------------------
# Schemas (stored in the ConfigStore; field defaults are the recipe defaults)
# --------------------------------------------------------------------------------------------
@dataclass
class InputSpec:
    """One example input, generated deterministically from ``seed``.

    Floats are uniform in ``[low, high)``; integers uniform in ``[low, high)`` (so token ids
    need ``high`` = vocabulary size); bools are ``x < 0.5`` of a uniform draw.

    ``dynamic`` names the axes that stay symbolic in the exported model (``{0: batch, 1: seq}``).
    The model then also runs at a second shape, and the check stage compares the export with
    torch there too: ``check_shape`` (same rank as ``shape``, different only on dynamic axes),
    or by default each dynamic axis grown by a small amount.
    """

    shape: list[int] = MISSING
    dtype: str = "float32"
    low: float = 0.0
    high: float = 1.0
    seed: int = 0
    dynamic: dict[int, str] = field(default_factory=dict)
    check_shape: list[int] | None = None


@dataclass
class ToleranceSpec:
    """A per-output tolerance override; an unset value inherits ``check.atol``/``check.rtol``."""

    atol: float | None = None
    rtol: float | None = None


@dataclass
class CheckSpec:
    """What the check stage verifies.

    ``expect_ops`` maps a default-domain op type to the exact number of nodes of that type the
    final model *executes*: nodes of the main graph, plus each function's nodes times the number
    of times the function is called (nested calls multiply). ``{Attention: 4}`` on a 4-layer
    model holds whether the layers share one function (per_type) or have one each.
    """

    atol: float = 1e-4
    rtol: float = 1e-3
    per_output: dict[str, ToleranceSpec] = field(default_factory=dict)
    function_scope: str = "all"
    expect_ops: dict[str, int] = field(default_factory=dict)


@dataclass
class AttentionSpec:
    """``implementation``: the transformers attention entry to export with (``hyperexport``
    exports each attention call as one node). ``promote_opset24`` rewrites those nodes to
    default-domain ``Attention`` and makes the final model opset 24 whatever ``opset`` says:
    ``opset`` is then only the export opset."""

    implementation: str | None = None
    promote_opset24: bool = False


@dataclass
class RewriteSpec:
    """Optional rewrite passes; all off by default, as in the library's ``RewriteOptions``
    (fusing constants freezes masks and position embeddings at the traced shape; the optimizer
    costs several times the export)."""

    fold_leftovers: bool = False
    fuse_constants: bool = False
    optimize: bool = False


@dataclass
class CustomOpSpec:
    name: str = MISSING
    symbolic: str = MISSING
    opset: int = MISSING


# --- generation (issue 23): ``task`` and ``generation``; ported as one block ------------------
#: ``task`` values built today: ``forward`` (one forward graph, the default) and
#: ``text-generation`` (a ``*ForCausalLM`` step model with past/present KV, for onnxruntime-genai).
TASKS = ("forward", "text-generation")


@dataclass
class GenerationSpec:
    """The generation check of ``task: text-generation``.

    ``prompts`` are token ids (no tokenizer needed); transformers' greedy ``generate`` of
    ``max_new_tokens`` tokens for each (trace) is compared token for token with the same decode
    in onnxruntime-genai (evaluate, check). ``padded_batch`` also decodes the prompts as one
    left-padded batch.
    """

    prompts: list[list[int]] = field(default_factory=list)
    max_new_tokens: int = 16
    padded_batch: bool = True


# --- end generation block ---------------------------------------------------------------------


@dataclass
class RecipeConfig:
    """One model to export. ``model`` is ``{_target_: factory, **kwargs}``; the factory's module
    (and a local ``checkpoint``, if any, resolved relative to the recipe file) define the model.

    ``inputs: auto`` derives example inputs from the model's config and main input (with
    ``dynamic: auto``, batch and sequence or image size dynamic); ``hiera: auto`` picks the
    model's main repeated stack. Both are resolved by the stages on the live model.

    ``fallback: true`` lets the export stage retry on the other path (``dynamo``) when the chosen
    one fails; it is logged at WARNING and recorded in the model's metadata and the report.
    """

    name: str = MISSING
    model: dict[str, Any] = MISSING
    checkpoint: str | None = None
    # ``auto`` or {name: InputSpec}; ``auto`` or [import path, ...] (see AUTO above).
    inputs: Any = MISSING
    hiera: Any = MISSING
    dynamic: str = "none"
    method: str = "forward"
    opset: int = 18
    dynamo: bool = False
    fallback: bool = False
    functions: str = "per_instance"
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    rewrite: RewriteSpec = field(default_factory=RewriteSpec)
    check: CheckSpec = field(default_factory=CheckSpec)
    custom_ops: list[CustomOpSpec] = field(default_factory=list)
    external_data: bool = False
    external_data_threshold: int = 1024
    # generation (issue 23)
    task: str = "forward"
    generation: GenerationSpec = field(default_factory=GenerationSpec)


@dataclass
class BuildConfig:
    """Build settings (``build.*``); they never change what is built, only where and whether."""

    cache_dir: str | None = None
    outputs_dir: str | None = None
    dry_run: bool = False
    force: list[str] = field(default_factory=list)
    #: A remote cache tier, an fsspec URL (``s3://bucket/prefix``, ``file:///srv/cache``).
    remote: str | None = None
    #: ``read_write`` (fetch and upload) or ``read_only`` (fetch only: pull-request CI).
    remote_mode: str = "read_write"
    #: fsspec storage options of the remote (credentials, ``endpoint_url``); never reported.
    storage_options: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Validated, frozen results
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """A validated recipe.

    Attributes:
        name: ``name`` field (used in the outputs path).
        file: The recipe file it came from (for messages).
        data: The recipe with every default filled in, as JSON-compatible data.
        checkpoint: Absolute checkpoint path, if the recipe has one.
    """

    name: str
    file: str
    data: Mapping[str, Any]
    checkpoint: Path | None = None


@dataclass(frozen=True)
class BuildSettings:
    """Validated ``build.*`` settings."""

    cache_dir: str | None
    outputs_dir: Path
    dry_run: bool
    force: tuple[str, ...]
    remote: str | None = None
    remote_mode: str = "read_write"
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)


def _outputs_root(value: str | None = None) -> str:
    return str(Path(value).expanduser().resolve()) if value else str(DEFAULT_OUTPUTS_DIR)


@functools.lru_cache(maxsize=1)
def _schema() -> Any:
    # Building a structured config is slow (tens of ms); the schema is built once per process.
    schema = OmegaConf.structured(RecipeConfig)
    OmegaConf.set_readonly(schema, True)
    return schema
