"""The recipe schema, each field declared once (type, default, allowed values, check, readers),
the build settings' schema, and the validated, frozen results.

See :mod:`hyperexport.product.config.fields` for how a field is declared and what is derived from it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hyperexport.base.contracts.names import AUTO as AUTO
from hyperexport.base.contracts.names import BUILTIN_ATTENTION as BUILTIN_ATTENTION
from hyperexport.base.contracts.names import (
    CHECK,
    EVALUATE,
    EXPORT,
    FORWARD,
    NO_QUANTIZATION,
    TRACE,
    WEIGHTS_MODES,
)
from hyperexport.base.contracts.names import FUNCTION_SCOPES as FUNCTION_SCOPES
from hyperexport.base.contracts.names import OPSET_RANGES as OPSET_RANGES
from hyperexport.base.contracts.names import PROMOTE_MIN_OPSET as PROMOTE_MIN_OPSET
from hyperexport.base.versions import torchscript_opset
from hyperexport.engine.settings import REMOTE_MODES as REMOTE_MODES
from hyperexport.library.defaults import (
    ACCURACY_LEVELS,
    DECODE_GATES,
    DEFAULT_ACCURACY_LEVEL,
    DEFAULT_ATOL,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_FUNCTION_SCOPE,
    DEFAULT_MAX_REL_ERROR,
    DEFAULT_MIN_COSINE,
    DEFAULT_MIN_DECODE_COSINE,
    DEFAULT_MIN_DISTINCT,
    DEFAULT_MIN_TOKEN_AGREEMENT,
    DEFAULT_MIN_TOP1,
    DEFAULT_OPSET,
    DEFAULT_RTOL,
    QUANTIZE_METHODS,
    block_size_problem,
)
from hyperexport.library.options import (
    FUNCTION_MODES,
    FUSIONS,
    AttentionOptions,
    ExportOptions,
    RewriteOptions,
)
from hyperexport.library.tasks.registry import TASKS as REGISTERED_TASKS
from hyperexport.product.config.fields import (
    REQUIRED,
    Invalid,
    Section,
    from_json,
    option,
    reads_of,
    section,
)
from hyperexport.product.config.paths import DEFAULT_OUTPUTS_DIR

__all__ = ["BUILTIN_ATTENTION", "FUNCTION_MODES", "FUNCTION_SCOPES", "REQUIRED"]

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


# ``functions`` values and transformers' own attention implementations (hyperexport registers
# its entry under another name): defined by the library (hyperexport.library.options);
# ``check.function_scope`` values in hyperexport.base.contracts.names, shared with the check library
# (the stages that do not check must not load it: their keys would cover it).
# Default-domain opsets each export path can produce, and the lowest export opset attention
# promotion accepts (it re-declares the model at 24 without converting other ops, and the Reduce*
# ops changed signature at 18): defined once, in hyperexport.base.contracts.names.


#: The primary config's keys besides the recipe's: ``build.*`` and a recipe file outside
#: ``recipes/`` (``recipe_file=/abs/path.yaml``).
BUILD_KEYS = (BUILD, RECIPE_FILE) = ("build", "recipe_file")
#: ``build.force=all``: every stage.
FORCE_ALL = "all"


DYNAMIC_MODES = ("none", AUTO)

#: The tasks the stages implement (``library/tasks/registry.py``); a recipe asking for another is
#: refused (exit 2).
IMPLEMENTED_TASKS = tuple(REGISTERED_TASKS)
#: ``task`` values: what of the model is exported (``forward``, the default: one graph of
#: ``method``), or ``auto``: from the checkpoint's config.
TASKS = (*IMPLEMENTED_TASKS, AUTO)

#: The stages that run the model (they read what changes its behaviour: ``env``, ``task``).
MODEL_STAGES = (TRACE, EXPORT)
#: The stages that check the final model against the recipe's expectations.
CHECK_STAGES = (EVALUATE, CHECK)

#: Longest recipe ``name``: it is a folder name under the outputs root.
MAX_NAME_LENGTH = 64


# --------------------------------------------------------------------------------------------
# One-value checks (a field's ``check=``); relations between fields are in config/validate.py
# --------------------------------------------------------------------------------------------
def _name(name: str) -> None:
    """``name`` is one folder under the outputs root: no separators, no ``.``/``..``, bounded."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise Invalid(f"{name!r} may only contain letters, digits, '_', '.', '-'")
    if name.startswith("."):
        raise Invalid(f"{name!r} must not start with '.' (it names a folder of the outputs)")
    if len(name) > MAX_NAME_LENGTH:
        raise Invalid(f"is {len(name)} characters long; at most {MAX_NAME_LENGTH}")


#: The suffixes of a recipe file whose stem stands in for a missing ``name``.
RECIPE_SUFFIXES = (".yaml", ".yml")


def name_from_file(recipe_file: str) -> str | None:
    """The ``name`` a recipe without one takes: its file's stem, or None if ``recipe_file`` is
    no recipe file (``<command line>``).

    Raises:
        Invalid: The stem is no safe name (``my model.yaml``); the reason says to set ``name``.
    """
    path = Path(recipe_file)
    if path.suffix not in RECIPE_SUFFIXES:
        return None
    try:
        _name(path.stem)
    except Invalid as e:
        raise Invalid(
            f"missing, and the file's stem cannot stand in for it: {e.reason}; set name:"
        ) from e
    return path.stem


def _positive(value: float) -> None:
    if value <= 0:
        raise Invalid(f"must be > 0, got {value}")


def _not_negative(value: int) -> None:
    if value < 0:
        raise Invalid("must be >= 0")


def _tolerances(per_output: Mapping[str, ToleranceSpec]) -> None:
    for out, tol in per_output.items():
        for key in ("atol", "rtol"):
            value = getattr(tol, key)
            if value is not None and value <= 0:
                raise Invalid(f"must be > 0, got {value}", at=f".{out}.{key}")


def _output_names(names: list[str]) -> None:
    for i, name in enumerate(names):
        if not name or name != name.strip():
            raise Invalid(f"{name!r} is not an output name or capture key", at=f"[{i}]")
    if len(set(names)) != len(names):
        raise Invalid("names an output twice")


def _op_counts(counts: Mapping[str, int]) -> None:
    for op, count in counts.items():
        if not re.fullmatch(r"([A-Za-z][\w.]*::)?[A-Za-z][A-Za-z0-9_]*", op):
            raise Invalid(f"{op!r} is not an ONNX op type (or domain::op)", at=f".{op}")
        if count < 0:
            raise Invalid(f"must be >= 0, got {count}", at=f".{op}")


def _not_builtin(implementation: str | None) -> None:
    if implementation in BUILTIN_ATTENTION:
        raise Invalid(
            f"{implementation!r} is a transformers built-in; hyperexport registers its "
            "attention under another name (e.g. 'hyperexport')"
        )


def _custom_op_name(name: str) -> None:
    if "::" not in name:
        raise Invalid(f"{name!r} must look like 'domain::op'")


#: Names of variables that hold secrets, never ``env``: case-insensitive ``fnmatch`` patterns of
#: one ``_``-separated part of the name (``HF_TOKEN``, ``ACCESSTOKEN``, ``aws_secret_access_key``,
#: ``DB_PASSWORD``; not ``TOKENIZERS_PARALLELISM``, which only tunes a library's threads) ...
SECRET_ENV_PARTS = ("*TOKEN", "*TOKENS", "*SECRET*", "*PASSWORD*", "*PASSWD*")
#: ... and of the whole name (``API_KEY``; not ``KEYBOARD_LAYOUT``).
SECRET_ENV_NAMES = ("*_KEY", "*_KEYS")


def _secret_pattern(name: str) -> str | None:
    """The pattern by which ``name`` looks like a secret's variable, or None."""
    upper = name.upper()
    for pattern in SECRET_ENV_NAMES:
        if fnmatch.fnmatchcase(upper, pattern):
            return pattern
    for part in upper.split("_"):
        for pattern in SECRET_ENV_PARTS:
            if fnmatch.fnmatchcase(part, pattern):
                return pattern
    return None


def _env_names(names: list[str]) -> None:
    for i, name in enumerate(names):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise Invalid(f"{name!r} is not an environment variable name", at=f"[{i}]")
        looks = _secret_pattern(name)
        if looks:
            raise Invalid(
                f"{name!r} looks like a secret ({looks}): a declared value enters the cache "
                "keys, and a key is a function of the value, so whoever reads the keys (a shared "
                "or remote cache) can check guesses of a short secret against them and sees when "
                "it changed; declare only variables that change what the model computes",
                at=f"[{i}]",
            )
    if len(set(names)) != len(names):
        raise Invalid("names a variable twice")


def _implemented_task(task: str) -> None:
    # auto is resolved from the checkpoint at validation (config/task_inference.py).
    if task not in (*IMPLEMENTED_TASKS, AUTO):
        raise Invalid(
            f"{task!r} is not implemented yet; implemented: {', '.join(IMPLEMENTED_TASKS)}"
        )


def _block_size(size: int) -> None:
    problem = block_size_problem(size)
    if problem is not None:
        raise Invalid(problem)


def _module_names(names: list[str]) -> None:
    for i, name in enumerate(names):
        if not name or name != name.strip():
            raise Invalid(f"{name!r} is not a module path or function name", at=f"[{i}]")


def _fraction(value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise Invalid(f"must be in [0, 1], got {value}")


def _prompts(prompts: list[list[int]]) -> None:
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise Invalid("is empty; a prompt needs at least one token id", at=f"[{i}]")
        if any(t < 0 for t in prompt):
            raise Invalid("token ids must be >= 0", at=f"[{i}]")


def _at_least_one(value: int) -> None:
    if value < 1:
        raise Invalid(f"must be >= 1, got {value}")


def _library(cls: type, name: str) -> Any:
    """The library's default of option ``name`` of ``cls``: the recipe default is the same."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


# --------------------------------------------------------------------------------------------
# Schemas: each recipe field declared once (type, default, allowed values, check, readers)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, repr=False)
class InputSpec(Section):
    """One example input, generated deterministically from ``seed``.

    Floats are uniform in ``[low, high)``; integers uniform in ``[low, high)`` (so token ids
    need ``high`` = vocabulary size); bools are ``x < 0.5`` of a uniform draw.

    ``dynamic`` names the axes that stay symbolic in the exported model (``{0: batch, 1: seq}``).
    The model then also runs at a second shape, and the check stage compares the export with
    torch there too: ``check_shape`` (same rank as ``shape``, different only on dynamic axes),
    or by default each dynamic axis grown by a small amount.
    """

    shape: list[int] = option(REQUIRED, doc="the traced shape")
    dtype: str = option("float32", choices=DTYPES, doc="the element type")
    low: float = option(
        0.0,
        doc="values are uniform in [low, high) (integers: token ids need high = vocabulary size)",
    )
    high: float = option(1.0, doc="upper bound (exclusive) of the values")
    seed: int = option(0, doc="the seed the values are generated from")
    dynamic: dict[int, str] = option(
        factory=dict, doc="axes that stay symbolic in the model: {axis: dim name}"
    )
    check_shape: list[int] | None = option(
        None, doc="the second shape the check compares at (default: each dynamic axis grown)"
    )


@dataclass(frozen=True, eq=False, repr=False)
class ToleranceSpec(Section):
    """A per-output tolerance override; an unset value inherits ``check.atol``/``check.rtol``."""

    atol: float | None = option(None, doc="absolute tolerance of this output (unset: check.atol)")
    rtol: float | None = option(None, doc="relative tolerance of this output (unset: check.rtol)")


_CHECK = ("check",)


@dataclass(frozen=True, eq=False, repr=False)
class QuantizedCheckSpec(Section):
    """``check.quantized.*``: how close the quantized model must stay to the float model it came
    from, both run in ONNX Runtime on the captured inputs. Read by ``check`` only.

    Every whole-model output and every call site run alone must reach ``min_cosine`` (cosine
    similarity) and stay under ``max_rel_error`` (``|q - f| / |f|``, L2); outputs named like
    logits must agree on the top-1 class at ``min_top1`` of the positions. The defaults hold for
    int4 blocks of 32 on the zoo's random-weight models (whose layers have no outliers; real
    checkpoints usually do better on cosine, worse on single outlier layers, which the report
    names).

    ``task: text-generation`` also decodes the quantized model (onnxruntime-genai, and the padded
    batch in ONNX Runtime), fed the float decode's tokens: at ``min_token_agreement`` of the
    steps it must pick the float decode's next token, and every step's logits must reach
    ``min_decode_cosine`` with the float model's. ``decode: report`` reports both and gates on
    neither: on random weights the float model's two best logits are often within int4's error
    (onnxruntime-genai's builder's int4 agreed on 1 of 64 free-running tokens), so agreement
    there says little; a recipe on random weights says so with ``report``.
    """

    min_cosine: float = option(
        DEFAULT_MIN_COSINE,
        readers=_CHECK,
        check=_fraction,
        doc="least cosine similarity of each output and call site, quantized vs float",
    )
    max_rel_error: float = option(
        DEFAULT_MAX_REL_ERROR,
        readers=_CHECK,
        check=_positive,
        doc="largest L2 relative error |q - f| / |f| of each output and call site",
    )
    min_top1: float = option(
        DEFAULT_MIN_TOP1,
        readers=_CHECK,
        check=_fraction,
        doc="least share of positions whose top-1 class agrees (outputs named like logits)",
    )
    min_token_agreement: float = option(
        DEFAULT_MIN_TOKEN_AGREEMENT,
        readers=_CHECK,
        check=_fraction,
        doc="text-generation: least share of decode steps picking the float decode's token",
    )
    min_decode_cosine: float = option(
        DEFAULT_MIN_DECODE_COSINE,
        readers=_CHECK,
        check=_fraction,
        doc="text-generation: least cosine of every decode step's logits with the float model's",
    )
    decode: str = option(
        DECODE_GATES[0],
        readers=_CHECK,
        choices=DECODE_GATES,
        doc="gate: the quantized decode must reach both; report: reported, not gated",
    )


@dataclass(frozen=True, eq=False, repr=False)
class GenerationCheckSpec(Section):
    """``check.generation.*``: how much the reference decode of a decoding task
    (``text-generation``, ``text2text-generation``, ``automatic-speech-recognition``) must show
    for the comparison to count. Read by ``check`` only.

    ``min_distinct``: fewest distinct token ids each reference sequence must hold. A decode that
    repeats one id proves little: an export that fixes the token (a wrong mask, a frozen position)
    repeats too, and agrees. Random weights often repeat; lowering it (``1``) accepts such a
    decode, at that risk: the tokens and every step's logits are still compared.
    """

    min_distinct: int = option(
        DEFAULT_MIN_DISTINCT,
        readers=_CHECK,
        check=_at_least_one,
        doc="fewest distinct token ids a reference decode must hold (1 accepts a decode that repeats one id)",
    )


@dataclass(frozen=True, eq=False, repr=False)
class CheckSpec(Section):
    """What the check stage verifies.

    ``expect_ops`` maps an op type (``domain::op`` outside the default domain, such as
    ``com.microsoft::GroupQueryAttention``) to the exact number of nodes of that type the final
    model *executes*: nodes of the main graph, plus each function's nodes times the number of
    times the function is called (nested calls multiply). ``{Attention: 4}`` on a 4-layer model
    holds whether the layers share one function (per_type) or have one each.

    Tolerances are read by ``check`` only (changing one reruns only ``check``); what runs
    (``function_scope``, ``expect_ops``) by ``evaluate`` too.

    ``accept_vacuous`` lists graph output names or capture keys (``<call_id>/out.<i>`` for a
    function's output) whose torch reference may prove nothing: NaN, within the tolerance of
    zero, or constant (``library/check/vacuous.py``). Any other such output fails the check, unless it
    is constant by design: exactly one value in torch and in ONNX Runtime, beside a sibling
    output that proves something (judged by equality, and said so). A name that is no output
    or key of the model is refused by the check stage (exit 2).
    """

    atol: float = option(
        DEFAULT_ATOL,
        readers=_CHECK,
        check=_positive,
        doc="absolute tolerance of every comparison with torch",
    )
    rtol: float = option(
        DEFAULT_RTOL,
        readers=_CHECK,
        check=_positive,
        doc="relative tolerance of every comparison with torch",
    )
    per_output: dict[str, ToleranceSpec] = option(
        factory=dict,
        readers=_CHECK,
        check=_tolerances,
        doc="tolerances by output name or capture key: {name: {atol, rtol}}",
    )
    function_scope: str = option(
        DEFAULT_FUNCTION_SCOPE,
        readers=CHECK_STAGES,
        choices=FUNCTION_SCOPES,
        doc="which call sites run alone against torch: all, the first of each function, none",
    )
    expect_ops: dict[str, int] = option(
        factory=dict,
        readers=CHECK_STAGES,
        check=_op_counts,
        doc="exact executed op counts: {op or domain::op: count}",
    )
    accept_vacuous: list[str] = option(
        factory=list,
        readers=_CHECK,
        check=_output_names,
        doc="outputs or capture keys whose torch reference may prove nothing (NaN, zeros, constant)",
    )
    quantized: QuantizedCheckSpec = section(QuantizedCheckSpec)
    generation: GenerationCheckSpec = section(GenerationCheckSpec)


@dataclass(frozen=True, eq=False, repr=False)
class AttentionSpec(Section):
    """``implementation``: the transformers attention entry to export with (``hyperexport``
    exports each attention call as one node, which ``rewrite.fuse`` turns into ONNX
    ``Attention`` or ONNX Runtime's attention kernels; without ``rewrite.fuse`` no runtime runs
    it, and the recipe is refused)."""

    implementation: str | None = option(
        _library(AttentionOptions, "implementation"),
        readers=(*MODEL_STAGES, "rewrite"),
        check=_not_builtin,
        doc="the transformers attention entry to export with (hyperexport: one node per attention call)",
    )


#: Recipe fields that no longer exist, and what replaces each: validation refuses them with
#: this pointer (exit 2) rather than as an unknown key.
RETIRED_FIELDS = {
    "attention.promote_opset24": (
        "rewrite.fuse: standard, which makes ONNX Attention and also fuses RMSNormalization "
        "and RotaryEmbedding (the model stays opset 24); set that instead"
    ),
}


_REWRITE = ("rewrite",)


@dataclass(frozen=True, eq=False, repr=False)
class RewriteSpec(Section):
    """Optional rewrite passes; all off by default, as in the library's ``RewriteOptions``
    (fusing constants freezes masks and position embeddings at the traced shape; the optimizer
    costs several times the export)."""

    fold_leftovers: bool = option(
        _library(RewriteOptions, "fold_leftovers"),
        readers=_REWRITE,
        doc="fold constant subgraphs the export left in the main graph",
    )
    fuse_constants: bool = option(
        _library(RewriteOptions, "fuse_constants"),
        readers=_REWRITE,
        doc="fold constants into the functions (freezes masks and positions at the traced shape)",
    )
    optimize: bool = option(
        _library(RewriteOptions, "optimize"),
        readers=_REWRITE,
        doc="run the ONNX optimizer (costs several times the export)",
    )
    #: MatMul weights as main-graph initializers ([K, N]), fed to the functions as inputs, so
    #: that ONNX Runtime's quantizers find them after inlining.
    weights_as_initializers: bool = option(
        _library(RewriteOptions, "weights_as_initializers"),
        readers=_REWRITE,
        doc="MatMul weights as main-graph initializers fed to the functions (for quantizers)",
    )
    #: Fused kernels inside the functions: ``none``, ``standard`` (ONNX's own fused ops; the
    #: final model is opset 24 whatever ``opset`` says, which is then the export opset) or
    #: ``onnxruntime`` (ONNX Runtime's contrib kernels; a generation step's pasts become
    #: onnxruntime-genai's shared buffers, so the trace reads it for ``genai_config.json``).
    #: The checks read it for the opset.
    fuse: str = option(
        _library(RewriteOptions, "fuse"),
        readers=("trace", *_REWRITE, *CHECK_STAGES),
        choices=FUSIONS,
        doc="fused kernels inside the functions: none, standard (ONNX, opset 24), onnxruntime (contrib)",
    )


_QUANTIZE = ("quantize",)


@dataclass(frozen=True, eq=False, repr=False)
class QuantizeSpec(Section):
    """``quantize.*``: the quantize stage, after rewrite (off by default).

    ``method``: ``none``, ``int8_dynamic`` (com.microsoft ``DynamicQuantizeMatMul``) or
    ``int4_block`` (com.microsoft ``MatMulNBits``); ``block_size``: K elements per int4 block
    (a power of two >= 16); ``exclude``: module paths (``lm_head``, ``layers.0.mlp``) or function
    names (``LlamaMLP``) whose MatMuls stay in float. What needs the model (an ``exclude`` naming
    no module, a method ONNX Runtime cannot run on the model's dtype) the stage refuses.
    ``accuracy_level``: ``MatMulNBits``' least activation precision (0 unset, 1 float32,
    2 float16, 3 bfloat16, 4 int8; ``int4_block`` only); 4, the default, is what
    onnxruntime-genai's builder sets on CPU (int8 kernels: int4 then runs faster than float).
    ``symmetric``: int4 blocks without zero points (``int4_block`` only; int8 is symmetric
    already), the builder's default layout; ``MatMulNBits`` runs faster without them, and a
    block's range is then its largest magnitude, either way from zero. Off by default, which
    keeps the asymmetric blocks (a range from the block's minimum to its maximum).
    ``shared_embedding``: where the embedding table is also the weight of a quantized ``MatMul``
    (tied embeddings: ``lm_head``), the embedding's ``Gather`` reads that ``MatMul``'s int4
    blocks (com.microsoft ``GatherBlockQuantized``, onnxruntime-genai's builder's
    ``shared_embeddings``) and the float table leaves the quantized model: at the Llama-3.2-1B
    shape, 1.05 GB of its 1.8 (``int4_block`` only; off by default).

    With ``task: text-generation`` the published ``genai_config.json`` names the quantized model
    (``model.quantized.onnx``); the float ``model.onnx`` stays beside it.
    """

    # evaluate runs the quantized model (whole and every call site) against the float one.
    method: str = option(
        NO_QUANTIZATION,
        readers=(*_QUANTIZE, "evaluate"),
        choices=QUANTIZE_METHODS,
        doc="none, int8_dynamic (DynamicQuantizeMatMul) or int4_block (MatMulNBits)",
    )
    block_size: int = option(
        DEFAULT_BLOCK_SIZE,
        readers=(*_QUANTIZE, "evaluate"),
        check=_block_size,
        doc="int4: K elements per block, a power of two >= 16",
    )
    exclude: list[str] = option(
        factory=list,
        readers=_QUANTIZE,
        check=_module_names,
        doc="module paths or function names whose MatMuls stay in float",
    )
    accuracy_level: int = option(
        DEFAULT_ACCURACY_LEVEL,
        readers=_QUANTIZE,
        choices=ACCURACY_LEVELS,
        doc="int4: MatMulNBits' least activation precision (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8)",
    )
    symmetric: bool = option(
        False,
        readers=_QUANTIZE,
        doc="int4: blocks without zero points (the builder's layout, faster), not min-max ones",
    )
    shared_embedding: bool = option(
        False,
        readers=_QUANTIZE,
        doc="int4: tied embeddings gather lm_head's int4 blocks (GatherBlockQuantized); "
        "the float table is dropped",
    )


@dataclass(frozen=True, eq=False, repr=False)
class CustomOpSpec(Section):
    """One custom op of ``custom_ops``: the TorchScript symbolic ``symbolic`` registered for op
    ``name`` at ``opset`` before the export runs (``dynamo: false`` only)."""

    name: str = option(REQUIRED, check=_custom_op_name, doc="the op, as domain::op")
    symbolic: str = option(
        REQUIRED, doc="import path of its TorchScript symbolic function (pkg.mod:fn)"
    )
    opset: int = option(REQUIRED, doc="the opset version the symbolic is registered for")


@dataclass(frozen=True, eq=False, repr=False)
class GenerationSpec(Section):
    """The generation check of ``task: text-generation`` (read by ``trace``, which records the
    reference decode; the decode in onnxruntime-genai and its judgement follow from it).

    ``prompts`` are token ids (no tokenizer needed); transformers' greedy ``generate`` of
    ``max_new_tokens`` tokens for each (trace) is compared token for token with the same decode
    in onnxruntime-genai (evaluate, check). ``padded_batch`` also decodes the prompts as one
    left-padded batch. Lengths against the model's context are checked by the trace, which
    reads the model's config.
    """

    prompts: list[list[int]] = option(
        factory=list,
        readers=("trace",),
        check=_prompts,
        doc="token ids the generation check decodes greedily (no tokenizer needed)",
    )
    max_new_tokens: int = option(
        16, readers=("trace",), check=_at_least_one, doc="greedy tokens decoded per prompt"
    )
    padded_batch: bool = option(
        True, readers=("trace",), doc="also decode the prompts as one left-padded batch"
    )


def _release(release: str | float | None) -> None:
    if isinstance(release, float):  # YAML and Hydra read 1.16 as a number, and 1.20 as 1.2
        raise Invalid(
            f"{release} is a number, not a release (1.20 would read as 1.2): quote it "
            '("1.16" in YAML, target.onnxruntime=\'"1.16"\' on the command line) or give the '
            "patch release (1.16.3)"
        )
    if release is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", release):
        raise Invalid(f"{release!r} is not a release (major.minor or major.minor.patch: 1.16)")


@dataclass(frozen=True, eq=False, repr=False)
class TargetSpec(Section):
    """``target.*``: where the published model must run. Checked at validation only, before
    anything runs; no stage reads it, so it enters no key (the model written does not depend on
    it: every model is written at the lowest IR version that carries its opsets).

    ``onnxruntime``: the ONNX Runtime release the model must load in (``"1.16"``); null, the
    default, is the installed one, which the evaluate stage runs it in. An opset or IR version
    that release cannot load (``versions.ONNXRUNTIME_LOADS``, ONNX Runtime's compatibility
    table: 1.16 loads opset 19 at IR 9, so no ``rewrite.fuse: standard``, whose model is opset
    24) is refused (exit 2). A release newer than that table, or ONNX Runtime's own kernels
    (``rewrite.fuse: onnxruntime``, ``quantize.method``) for a release older than the installed
    one, are not checked: validation says so at WARNING.
    """

    onnxruntime: str | float | None = option(
        None,
        check=_release,
        doc='the ONNX Runtime release the model must load in ("1.16"); null: the installed one',
    )


@dataclass(frozen=True, eq=False, repr=False)
class RecipeConfig(Section):
    """One model to export. ``model`` is ``{_target_: factory, **kwargs}``; the factory's module
    (and a local ``checkpoint``, if any, resolved relative to the recipe file) define the model.

    ``inputs: auto`` derives example inputs from the model's config and main input (with
    ``dynamic: auto``, batch and sequence or image size dynamic); ``hiera: auto`` picks the
    model's main repeated stack. Both are resolved by the stages on the live model.

    ``fallback: true`` lets the export stage retry on the other path (``dynamo``) when the chosen
    one fails; it is logged at WARNING and recorded in the model's metadata and the report.

    ``name`` (the folder under the outputs root) defaults to the recipe file's stem
    (``my_bert.yaml``: ``my_bert``). ``dynamo`` has no default: the export path is always the
    recipe's explicit choice.
    """

    name: str = option(
        REQUIRED,
        check=_name,
        doc="the folder under the outputs root (default: the recipe file's stem)",
    )
    model: dict[str, Any] = option(
        REQUIRED,
        readers=MODEL_STAGES,
        doc="{_target_: factory import path, **its keyword arguments}",
    )
    # The checkpoint is keyed by the model's fingerprint (its files' digests), not by its path.
    checkpoint: str | None = option(
        None,
        doc="a local .safetensors file, folder of them, or state dict, relative to the recipe file",
    )
    inputs: dict[str, InputSpec] | Literal["auto"] = option(
        REQUIRED,
        readers=MODEL_STAGES,
        doc="example inputs {name: InputSpec}, or auto (from the model's config)",
    )
    hiera: list[str] | Literal["auto"] = option(
        REQUIRED,
        readers=MODEL_STAGES,
        doc="module classes whose calls become ONNX functions, or auto (the main repeated stack)",
    )
    dynamic: str = option(
        "none",
        readers=MODEL_STAGES,
        choices=DYNAMIC_MODES,
        doc="auto (with inputs: auto): batch and sequence or image size symbolic",
    )
    method: str = option(
        _library(ExportOptions, "method"), readers=MODEL_STAGES, doc="the model method exported"
    )
    # 18, or 17 on torch 2.2, whose TorchScript exporter stops there (versions.torchscript_opset;
    # that torch refuses the dynamo path, which needs 18).
    opset: int = option(
        torchscript_opset(DEFAULT_OPSET),
        readers=("export", *CHECK_STAGES),
        doc="the export opset (TorchScript 7..20, dynamo 18..24)",
    )
    dynamo: bool = option(
        REQUIRED,
        readers=(*MODEL_STAGES, *CHECK_STAGES),
        doc="the export path: true torch.export, false TorchScript (required, no default)",
    )
    fallback: bool = option(
        _library(ExportOptions, "fallback"),
        readers=("export", *CHECK_STAGES),
        doc="retry on the other export path when the chosen one fails (WARNING, recorded)",
    )
    # The export makes the functions; the rewrite reads the mode from the bundle it composes.
    functions: str = option(
        _library(ExportOptions, "functions"),
        readers=("export",),
        choices=FUNCTION_MODES,
        doc="per_instance (one function per module) or per_type (one per structure, weights as inputs)",
    )
    attention: AttentionSpec = section(AttentionSpec)
    rewrite: RewriteSpec = section(RewriteSpec)
    check: CheckSpec = section(CheckSpec)
    quantize: QuantizeSpec = section(QuantizeSpec)
    custom_ops: list[CustomOpSpec] = option(
        factory=list,
        readers=("export",),
        doc="TorchScript symbolics to register: [{name, symbolic, opset}]",
    )
    # How the model files are written: by rewrite, and by quantize for the quantized model.
    external_data: bool = option(
        False,
        readers=(*_REWRITE, *_QUANTIZE),
        doc="write the weights beside the model (.onnx.data)",
    )
    external_data_threshold: int = option(
        _library(ExportOptions, "external_data_threshold"),
        readers=(*_REWRITE, *_QUANTIZE),
        check=_not_negative,
        doc="smallest tensor (bytes) written as external data",
    )
    # What the model reads besides its arguments: the values of these variables enter the keys
    # of the stages that run it (builds/fingerprint.py, model fingerprint), as digests.
    env: list[str] = option(
        factory=list,
        readers=MODEL_STAGES,
        check=_env_names,
        doc="environment variables the model reads (their values enter the keys, as digests)",
    )
    # Where the weights come from: the model loaded whole (load), or its safetensors
    # checkpoint mapped and bound one hiera module at a time (stream, docs/streaming.md); auto
    # streams only where loading would not fit. The stages that run the model read it.
    weights: str = option(
        AUTO,
        readers=MODEL_STAGES,
        choices=WEIGHTS_MODES,
        doc="load the model whole, stream it one hiera module at a time, or auto",
    )
    # What of the model is exported; the generation task also decodes in evaluate and check.
    # rewrite: which model files it writes (one, or one per graph) follows from it; quantize:
    # whether it writes a genai_config.json.
    task: str = option(
        FORWARD,
        readers=(*MODEL_STAGES, "rewrite", *_QUANTIZE, *CHECK_STAGES),
        choices=TASKS,
        check=_implemented_task,
        doc="what is exported: forward, a decoding task, or auto (from the checkpoint's config)",
    )
    generation: GenerationSpec = section(GenerationSpec)
    target: TargetSpec = section(TargetSpec)


@dataclass
class BuildConfig:
    """Build settings (``build.*``); they never change what is built, only where and whether.

    The one declaration of their defaults: ``conf/config.yaml`` takes them from here
    (``build_defaults``), and :func:`~hyperexport.product.config.validate.validate_build` fills in
    what a build leaves out from here.
    """

    #: Cache location; None: ``$HYPEREXPORT_CACHE_DIR``, else ``~/.cache/hyperexport``.
    cache_dir: str | None = None
    #: Root of the materialised artifacts; None: ``<repo>/outputs``. A build writes to
    #: ``<outputs_dir>/<recipe name>/<overrides or "default">/``.
    outputs_dir: str | None = None
    #: Print each stage's status and reason; write nothing.
    dry_run: bool = False
    #: Stages to rerun even when cached: ``build.force=[export]``, ``build.force=all``.
    force: list[str] = field(default_factory=list)
    #: A remote cache tier, an fsspec URL (``s3://bucket/prefix``, ``gs://...``,
    #: ``file:///srv/cache``): a local miss is looked up there.
    remote: str | None = None
    #: ``read_write`` (fetch, and upload computed entries) or ``read_only`` (fetch only:
    #: pull-request CI).
    remote_mode: str = REMOTE_MODES[0]
    #: fsspec storage options of the remote (credentials, ``endpoint_url``); also from the
    #: environment (``AWS_*``, ``FSSPEC_<PROTOCOL>_<OPTION>``). Never written into reports.
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
        data: The recipe with every default filled in, as JSON-compatible data (what the
            runner slices and keys).
        checkpoint: Absolute checkpoint path, if the recipe has one.
    """

    name: str
    file: str
    data: Mapping[str, Any]
    checkpoint: Path | None = None

    @functools.cached_property
    def config(self) -> RecipeConfig:
        """The recipe typed (``data`` is its :func:`~hyperexport.product.config.fields.to_json`)."""
        return from_json(RecipeConfig, self.data)


@dataclass(frozen=True)
class BuildSettings:
    """Validated ``build.*`` settings."""

    cache_dir: str | None
    outputs_dir: Path
    dry_run: bool
    force: tuple[str, ...]
    remote: str | None = BuildConfig.remote
    remote_mode: str = BuildConfig.remote_mode
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)


def _outputs_root(value: str | None = None) -> str:
    return str(Path(value).expanduser().resolve()) if value else str(DEFAULT_OUTPUTS_DIR)


def stage_reads(stage: str) -> tuple[str, ...]:
    """The recipe fields stage ``stage`` reads: those declaring it among their ``readers``."""
    return reads_of(RecipeConfig, stage)
