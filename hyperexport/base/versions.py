"""The version facts: what each release of torch, transformers, onnx, onnxscript and
onnxruntime has, and the one module that compares their versions (``tests/base/test_versions.py``).

Everything else in hyperexport asks this module

* which releases are installed (:func:`installed_versions`, read from package metadata without
  importing the libraries; what a model's metadata and a build's report record);
* whether they work together (:func:`unsupported`, asked before an export starts: one line
  naming both versions, instead of an import error from deep inside torch);
* what the installed releases have: where transformers takes the KV cache, whether it builds
  masks by vmapping, where its export flags live, whether torch's exporter rewrites guard names;
* which IR version carries a model's opsets (:func:`lowest_ir_version`, from onnx's own version
  table: what every saved model is stamped with), and what an ONNX Runtime release loads
  (:func:`onnxruntime_refusal`, asked at validation for ``target.onnxruntime``).

The shims that act on these facts sit beside what they patch: the mask builder and the
attention hooks with the transformers patches (``library/transformers/masks.py``), torch's tracing
state, dtypes and pytree in the capture (``library/capture/torch_hooks.py``), the exporters' caches and
passes in the export (``library/export/torch_exporter.py``).

It sits on the lowest layer: it imports only torch, transformers, onnx and onnxscript (lazily,
inside functions, so that torch-free layers may read versions through it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as metadata
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

#: The libraries whose versions a model records (``metadata_props``) and ``hyperexport show``
#: prints, in this order.
RECORDED_DISTRIBUTIONS = (
    "torch",
    "transformers",
    "onnxscript",
    "onnx",
    "onnxruntime",
    "hyperexport",
)


@functools.lru_cache(maxsize=64)
def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (local suffix kept), or None if absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions(names: tuple[str, ...] = RECORDED_DISTRIBUTIONS) -> dict[str, str]:
    """``{distribution: version}`` of the installed ones among ``names``, in that order."""
    found = {name: installed_version(name) for name in names}
    return {name: version for name, version in found.items() if version is not None}


def _release(name: str) -> Version | None:
    """The installed release of ``name`` without its local suffix (``2.13.0+cpu`` -> 2.13.0)."""
    text = installed_version(name)
    return Version(text.split("+")[0]) if text is not None else None


def _at_least(name: str, release: str) -> bool:
    """Whether ``name`` is installed at ``release`` or later."""
    found = _release(name)
    return found is not None and found >= Version(release)


@dataclass(frozen=True)
class Requirement:
    """``needs`` at ``at_least`` whenever ``when`` is at ``from_release`` or later.

    Attributes:
        when: The distribution whose release brings the requirement (``"torch"``).
        from_release: Its first release with the requirement.
        needs: The distribution required.
        at_least: Its lowest working release.
        paths: The export paths that need it (``"dynamo"``, ``"torchscript"``).
        reason: What fails otherwise.
    """

    when: str
    from_release: str
    needs: str
    at_least: str
    paths: tuple[str, ...]
    reason: str


#: Combinations known not to work. Each was seen failing; each message names both versions.
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        when="torch",
        from_release="2.6",
        needs="onnxscript",
        at_least="0.6.2",
        paths=("dynamo",),
        reason=(
            "torch's exporter adds unused Rank/IsScalar functions, which onnxscript's version "
            "converter refuses before 0.6.1 ('The model contains functions': 0.5.7 on torch "
            "2.6.0, 2.8.0 and 2.9.1; 0.6.0); 0.6.1's optimizer fails in its InlinePass; torch "
            "2.11's exporter imports onnxscript._framework_apis.torch_2_11 (0.6)"
        ),
    ),
    Requirement(
        when="torch",
        from_release="2.11",
        needs="onnx-ir",
        at_least="0.1.16",
        paths=("dynamo",),
        reason="torch's dynamo exporter reads onnx_ir.schemas, which onnx-ir 0.1.16 brings",
    ),
)


#: The lowest torch release whose ``torch.export`` plus ``torch.onnx.export(dynamo=True)`` can
#: serve hyperexport's dynamo path, and why no earlier one can: ``torch.onnx.export`` takes
#: ``dynamo`` from 2.5 (:data:`EXPORT_TAKES_DYNAMO_KEYWORD`) and ``custom_translation_table``
#: (hyperexport's placeholder and attention translations) from 2.6. Below it a dynamo build is
#: refused before anything runs; the TorchScript path stays open. Seen refused on 2.2.2; 2.6.0
#: is the ``torch-2.6.0`` leg's to prove (2.5.1's leg shows the refusal).
DYNAMO_PATH_FROM_TORCH = "2.6"
_DYNAMO_PATH_NEEDS = (
    "torch.onnx.export's custom_translation_table, which hyperexport's dynamo path uses"
)


def unsupported(dynamo: bool) -> list[str]:
    """One line per known-broken combination of the installed libraries on this export path."""
    path = "dynamo" if dynamo else "torchscript"
    problems = []
    torch = installed_version("torch")
    if dynamo and torch is not None and not _at_least("torch", DYNAMO_PATH_FROM_TORCH):
        problems.append(
            f"torch {torch} cannot take the dynamo path (dynamo=True): it needs "
            f"torch>={DYNAMO_PATH_FROM_TORCH} ({_DYNAMO_PATH_NEEDS}); dynamo=false (TorchScript) "
            "works on this torch"
        )
    for req in REQUIREMENTS:
        if path not in req.paths or not _at_least(req.when, req.from_release):
            continue
        if _at_least(req.needs, req.at_least):
            continue
        problems.append(
            f"{req.when} {installed_version(req.when)} needs {req.needs}>={req.at_least} on the "
            f"{path} path, found {req.needs} {installed_version(req.needs) or '(not installed)'}"
            f" ({req.reason})"
        )
    return problems


#: The onnxscript releases whose torch_lib translates ``aten.roll`` along a negative dim wrongly:
#: it takes that dim's size as ``Shape(x, start=dim, end=dim + 1)``, which for ``dims=-1`` is
#: ``end=0``, an empty shape, and ONNX Runtime then refuses the model (``Slice ...
#: ShapeInferenceError: Incorrect or missing input value for starts and ends``). Seen on 0.6.2,
#: 0.7.0 and 0.7.1 with torch 2.13 (torch's own plain dynamo export crashes in 0.6.2's rewriter
#: instead); 0.7.2 is right. Swin's shifted windows roll along dims 1 and 2, which is why the
#: zoo's Swin passes. ``library/export/dynamo_program.py`` gives torch's program the dims as
#: non-negative ones on these releases (``tests/library/export/test_dynamo_roll.py``).
ONNXSCRIPT_ROLLS_NEGATIVE_DIMS_WRONG = "<0.7.2"


def onnxscript_rolls_negative_dims_wrong(onnxscript: str | None = None) -> bool:
    """Whether onnxscript (``onnxscript``, else the installed one) is among
    :data:`ONNXSCRIPT_ROLLS_NEGATIVE_DIMS_WRONG`."""
    return _given_or_installed_in(
        onnxscript, ONNXSCRIPT_ROLLS_NEGATIVE_DIMS_WRONG, lambda: installed_version("onnxscript")
    )


# -- torch's TorchScript exporter ----------------------------------------------------------------


#: The torch releases whose ``torch.onnx.export`` takes a ``dynamo`` keyword (it arrived in 2.5).
#: Earlier releases export with TorchScript only and refuse the keyword (``TypeError: export()
#: got an unexpected keyword argument 'dynamo'``, seen on 2.2.2).
EXPORT_TAKES_DYNAMO_KEYWORD = ">=2.5"


def torchscript_export_keywords(torch: str | None = None) -> dict[str, Any]:
    """The keywords that select the TorchScript exporter in ``torch.onnx.export``:
    ``{"dynamo": False}`` where the keyword exists (:data:`EXPORT_TAKES_DYNAMO_KEYWORD`), else
    none (that release's only exporter is TorchScript).

    Args:
        torch: A torch release (``"2.2.2"``); the installed one when None.
    """
    found = torch if torch is not None else torch_version()
    if found is not None and not release_in(found, EXPORT_TAKES_DYNAMO_KEYWORD):
        return {}
    return {"dynamo": False}


#: The torch releases whose TorchScript exporter stops below hyperexport's highest TorchScript
#: opset (``contracts/names.TORCHSCRIPT_MAX_OPSET``), with the highest opset it gets right. torch
#: 2.2's says 17 (``torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET``), and at 18 it
#: writes ReduceMean's ``axes`` as an attribute (onnx's checker: ``Unrecognized attribute: axes
#: for operator ReduceMean``, torch 2.2.2); 2.3 raised its constant to 20
#: (``tests/base/test_versions.py`` compares this table with the installed torch's constant).
TORCHSCRIPT_OPSET_CAPS: tuple[tuple[str, int], ...] = (("<2.3", 17),)


def torchscript_opset_cap(torch: str | None = None) -> int | None:
    """The highest opset torch's TorchScript exporter gets right on torch (``torch``, else the
    installed one) where it is below hyperexport's own highest (:data:`TORCHSCRIPT_OPSET_CAPS`);
    None where it is not (or torch is not installed)."""
    found = torch if torch is not None else torch_version()
    if found is None:
        return None
    return next((cap for spec, cap in TORCHSCRIPT_OPSET_CAPS if release_in(found, spec)), None)


def torchscript_opset(wanted: int, torch: str | None = None) -> int:
    """``wanted``, or the torch's TorchScript cap where that is lower (:func:`torchscript_opset_cap`;
    torch 2.2: 17): the opset of a TorchScript export whose caller named none (the library's
    ``export_hyper_onnx`` defaults), and of tests where the opset is not what they test.

    Args:
        wanted: The opset asked for when the torch has no lower cap.
        torch: A torch release (``"2.2.2"``); the installed one when None.
    """
    cap = torchscript_opset_cap(torch)
    return wanted if cap is None else min(wanted, cap)


#: The torch releases whose TorchScript exporter gives ``torch.where(condition, <Python float>,
#: tensor)`` its scalar as a double constant beside a float tensor, which ONNX's ``Where`` refuses
#: ("Type parameter (T) of Optype (Where) bound to different types (tensor(double) and
#: tensor(float))"; torch's own plain export too). Seen on 2.2.2 (transformers 4.48's Gemma2
#: sliding-window mask, ``zoo_gemma2``); 2.4.1 and 2.5.1 export the constant in the tensor's
#: type; 2.3 was not checked. ``library/export/torch_exporter.repaired_where_symbolic``.
TORCHSCRIPT_WHERE_KEEPS_DOUBLE_SCALARS = "<2.4"


def torchscript_where_keeps_double_scalars(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`TORCHSCRIPT_WHERE_KEEPS_DOUBLE_SCALARS`."""
    return _given_or_installed_in(torch, TORCHSCRIPT_WHERE_KEEPS_DOUBLE_SCALARS, torch_version)


#: The transformers releases whose Gemma2 decoder layers take ``last_cache_position``, an int
#: read off the mask's size (``attention_mask.shape[-1]``), which ``torch.export`` traces as a
#: ``torch.SymInt`` at a dynamic length. A SymInt cannot cross the ONNX function boundary (its
#: unit would bake one length in), so there a dynamo build of such a model stops at its first
#: layer's export in :func:`size_int_refusal`'s line. 4.53 deprecated the argument and no longer
#: passes it (seen: 4.48.3 refused, 4.53.3 not; 4.51 not checked). The TorchScript path traces
#: the layer with its captured value, as it does every int.
TRANSFORMERS_LAYERS_TAKE_LAST_CACHE_POSITION = "<4.53"
_SIZE_INT_ARGUMENT = "last_cache_position"


def size_int_refusal(where: str) -> str:
    """The one line for a ``torch.SymInt`` met at ``where`` (``input['last_cache_position']``
    of a layer) where a unit's inputs are flattened on the dynamo path: naming the transformers
    release and the one that drops the argument where
    :data:`TRANSFORMERS_LAYERS_TAKE_LAST_CACHE_POSITION` holds."""
    found = transformers_version()
    if (
        f"[{_SIZE_INT_ARGUMENT!r}]" in where
        and found is not None
        and release_in(found, TRANSFORMERS_LAYERS_TAKE_LAST_CACHE_POSITION)
    ):
        return (
            f"transformers {found}'s layers take {_SIZE_INT_ARGUMENT}, an int read off the "
            f"mask's size, which torch {torch_version()}'s torch.export makes a torch.SymInt; "
            "an int of a dynamic size cannot cross the ONNX function boundary on the dynamo path "
            "(transformers>=4.53 no longer passes it; dynamo: false traces it)"
        )
    return (
        "a torch.SymInt (an int of a dynamic size under torch.export) cannot cross the ONNX "
        "function boundary on the dynamo path: pass it as a tensor, make its axis static, or "
        "use dynamo: false"
    )


#: The torch releases with the unsigned dtypes ``torch.uint16``, ``uint32`` and ``uint64`` (2.3).
#: onnx_ir's ``TorchTensor`` names them when it first converts a dtype, so on torch 2.2 every
#: ``TorchTensor`` fails (``AttributeError: module 'torch' has no attribute 'uint16'``, onnx-ir
#: 0.1.16 on torch 2.2.2); ``library/export/weights.py`` wraps torch tensors itself there.
TORCH_HAS_WIDE_UNSIGNED_DTYPES = ">=2.3"


def torch_lacks_wide_unsigned_dtypes(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) predates
    :data:`TORCH_HAS_WIDE_UNSIGNED_DTYPES`, so that onnx_ir's ``TorchTensor`` cannot be used."""
    found = torch if torch is not None else torch_version()
    return found is not None and not release_in(found, TORCH_HAS_WIDE_UNSIGNED_DTYPES)


#: The torch releases whose TorchScript symbolic of ``scaled_dot_product_attention`` reads a given
#: ``scale`` as a Python float and then passes it to ``g.op`` as an input, which fails
#: (``TypeError: z_(): incompatible function arguments``, torch 2.2.2; pytorch/pytorch#125158,
#: fixed in 2.5 by pytorch/pytorch#135594). transformers' attention modules always give the scale.
SDPA_SYMBOLIC_READS_SCALE_AS_FLOAT = "<2.5"


#: The torch releases with ``torch.compiler.is_exporting()`` (true only under ``torch.export``):
#: absent on 2.2.2 and 2.6.0, present on 2.9.1 and later; 2.7 brought it (2.7 and 2.8 were not
#: checked). Releases from 2.3 (:data:`TORCH_COMPILER_HAS_IS_COMPILING`) have
#: ``torch.compiler.is_compiling()``, which ``torch.export`` sets as well; 2.2 has neither, and
#: there hyperexport's dynamo path is refused. ``library/transformers/static_cache.py`` bridges it.
TORCH_COMPILER_HAS_IS_EXPORTING = ">=2.7"
#: The torch releases with ``torch.compiler.is_compiling()`` (2.3; 2.2.2's ``torch.compiler`` has
#: no ``is_*`` function).
TORCH_COMPILER_HAS_IS_COMPILING = ">=2.3"


def torch_compiler_flags(torch: str | None = None) -> tuple[bool, bool]:
    """``(has is_exporting, has is_compiling)`` of ``torch.compiler`` on torch (``torch``, else
    the installed one): :data:`TORCH_COMPILER_HAS_IS_EXPORTING`,
    :data:`TORCH_COMPILER_HAS_IS_COMPILING`."""
    found = torch if torch is not None else torch_version()
    if found is None:
        return (False, False)
    return (
        release_in(found, TORCH_COMPILER_HAS_IS_EXPORTING),
        release_in(found, TORCH_COMPILER_HAS_IS_COMPILING),
    )


#: The torch releases whose dynamo exporter builds its torchlib registry for a given opset
#: (``ONNXRegistry.from_torchlib(opset_version=18)``, seen on 2.9.1 and later); 2.6.0's takes no
#: argument (one registry). 2.7 and 2.8 were not checked: they count as the newer signature, so
#: that a wrong guess fails in the open (``TypeError``) rather than exporting at another opset.
TORCHLIB_REGISTRY_TAKES_OPSET = ">=2.7"


def torchlib_registry_takes_opset(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`TORCHLIB_REGISTRY_TAKES_OPSET`."""
    return _given_or_installed_in(torch, TORCHLIB_REGISTRY_TAKES_OPSET, torch_version)


#: The torch releases whose TorchScript SDPA symbolic refuses an additive mask in bfloat16 (it
#: takes float32 and float16 ones: ``ValueError: Unsupported type for attn_mask: 15``, torch 2.2.2
#: exporting a bfloat16 Llama layer); later releases add bfloat16 to the accepted types. Seen on
#: 2.2.2; the boundary (2.3) is not measured. Not bridged: such an export fails naming its module.
SDPA_SYMBOLIC_REFUSES_BFLOAT16_MASK = "<2.3"


def sdpa_symbolic_refuses_bfloat16_mask(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`SDPA_SYMBOLIC_REFUSES_BFLOAT16_MASK`."""
    return _given_or_installed_in(torch, SDPA_SYMBOLIC_REFUSES_BFLOAT16_MASK, torch_version)


#: The torch releases whose TorchScript SDPA symbolic, given a boolean mask, turns the weights of
#: a fully masked query row (a left-padded position) into zeros as torch's own SDPA does (its
#: "safe softmax", eager since 2.5): pytorch/pytorch#159973, first released in 2.9. Before it the
#: symbolic's ``Softmax`` of a row of ``-inf`` gives NaN, and ONNX Runtime carries the NaN from
#: the padded positions' keys and values into every later layer (seen on 2.4.1, 2.5.1, 2.6.0 and
#: 2.8.0: a left-padded generation batch decoded token 0). ``export/torch_exporter.py`` bridges it.
SDPA_SYMBOLIC_ZEROES_FULLY_MASKED_ROWS = ">=2.9"


def sdpa_symbolic_leaves_masked_rows_nan(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) predates
    :data:`SDPA_SYMBOLIC_ZEROES_FULLY_MASKED_ROWS`."""
    found = torch if torch is not None else torch_version()
    return found is not None and not release_in(found, SDPA_SYMBOLIC_ZEROES_FULLY_MASKED_ROWS)


#: The torch releases whose dynamo exporter cannot translate an eval-mode batch norm
#: (``aten._native_batch_norm_legit_no_training``: ``AttributeError: 'tuple' object has no
#: attribute 'dtype'``): torch's own plain ``torch.onnx.export(dynamo=True)`` of transformers'
#: ResNet fails so on 2.6.0 (onnxscript 0.7.2), as hyperexport's export of its units does; 2.8.0
#: translates it. 2.7 was not run and counts as failing, so that the tests' strict expected
#: failure shows it if it does not. Not bridged: such a build fails naming its module.
DYNAMO_FAILS_EVAL_BATCH_NORM = "<2.8"


def dynamo_fails_eval_batch_norm(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`DYNAMO_FAILS_EVAL_BATCH_NORM`."""
    return _given_or_installed_in(torch, DYNAMO_FAILS_EVAL_BATCH_NORM, torch_version)


def sdpa_symbolic_reads_scale_as_float(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`SDPA_SYMBOLIC_READS_SCALE_AS_FLOAT`."""
    return _given_or_installed_in(torch, SDPA_SYMBOLIC_READS_SCALE_AS_FLOAT, torch_version)


#: The torch releases whose ``torch.library`` has ``custom_op`` (an operator from a decorated
#: Python function) and ``register_fake`` (its abstract implementation): 2.4 on. torch 2.2 and
#: 2.3 define an operator with ``torch.library.Library(ns, "DEF").define`` and ``impl``, and
#: register the abstract one with ``impl_abstract`` (torch 2.2.2: ``AttributeError: module
#: 'torch.library' has no attribute 'register_fake'``). hyperexport's attention op
#: (``library/transformers/attention_op.py``) registers either way; the tests of user symbolics
#: (``tests/export/test_custom_ops.py``) define theirs either way.
TORCH_LIBRARY_HAS_CUSTOM_OP = ">=2.4"


def torch_library_has_custom_op(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`TORCH_LIBRARY_HAS_CUSTOM_OP`."""
    return _given_or_installed_in(torch, TORCH_LIBRARY_HAS_CUSTOM_OP, torch_version)


# -- transformers ---------------------------------------------------------------------------------


#: transformers classes hyperexport names (zoo recipes' hiera, the MoE patch) that appeared in a
#: later release than transformers' floor, by class name: (first release, what they are).
#: 4.57's MoE blocks are one module with a router Linear and a list of expert MLPs.
TRANSFORMERS_CLASSES_SINCE: dict[str, tuple[str, str]] = {
    name: ("5", "5.x splits sparse MoE blocks into a router and an experts module")
    for name in (
        "MixtralTopKRouter",
        "MixtralExperts",
        "Qwen2MoeTopKRouter",
        "Qwen2MoeExperts",
        "OlmoeTopKRouter",
        "OlmoeExperts",
    )
}


def missing_transformers_class(path: str) -> str | None:
    """One line naming both versions when ``path`` (``transformers.models....ClassName``) is a
    class the installed transformers is too old to have (:data:`TRANSFORMERS_CLASSES_SINCE`);
    None otherwise (including when the class is unknown here: the caller's own error stands)."""
    if not path.startswith("transformers."):
        return None
    name = path.rpartition(".")[2]
    since = TRANSFORMERS_CLASSES_SINCE.get(name)
    if since is None or _at_least("transformers", since[0]):
        return None
    found = installed_version("transformers") or "(not installed)"
    return f"transformers {found} has no {name}: it needs transformers>={since[0]} ({since[1]})"


#: The transformers releases whose models switch their attention implementation with
#: ``set_attn_implementation`` (4.57.6 has it, 4.53.3 has not; 4.54 to 4.56 were not run and count
#: as lacking it). Before, a model reads ``config._attn_implementation`` at each call, and its
#: submodules share that config, so hyperexport switches the config's attribute there
#: (``transformers/attention.py``).
TRANSFORMERS_SET_ATTN_IMPLEMENTATION = ">=4.57"


def attention_switched_by_config() -> bool:
    """Whether the installed transformers predates :data:`TRANSFORMERS_SET_ATTN_IMPLEMENTATION`."""
    found = transformers_version()
    return found is not None and not release_in(found, TRANSFORMERS_SET_ATTN_IMPLEMENTATION)


#: The transformers releases where hyperexport's own attention can be registered: it goes into
#: ``AttentionInterface`` (4.51) with transformers' SDPA mask in ``AttentionMaskInterface``
#: (``masking_utils``, 4.53). On 4.48.3: ``ImportError: cannot import name 'AttentionInterface'``.
HYPEREXPORT_ATTENTION_TRANSFORMERS = ">=4.53"


def attention_registration_missing(transformers: str | None = None) -> str | None:
    """One line naming the transformers release (``transformers``, else the installed one) when
    it cannot register hyperexport's attention (:data:`HYPEREXPORT_ATTENTION_TRANSFORMERS`);
    None when it can or transformers is not installed."""
    found = transformers if transformers is not None else transformers_version()
    if found is None or release_in(found, HYPEREXPORT_ATTENTION_TRANSFORMERS):
        return None
    return (
        f"transformers {found} cannot register hyperexport's attention: it needs "
        f"transformers{HYPEREXPORT_ATTENTION_TRANSFORMERS} (AttentionInterface and "
        "AttentionMaskInterface); set attention.implementation: null"
    )


#: The transformers releases whose ``from_pretrained`` and ``from_config`` take the weights'
#: dtype as ``dtype`` (4.56, huggingface/transformers#39782, which deprecates ``torch_dtype``);
#: earlier ones take ``torch_dtype`` and hand an unknown ``dtype`` to the model's constructor
#: (4.48.3: ``TypeError: LlamaForCausalLM.__init__() got an unexpected keyword argument
#: 'dtype'``) or to its config.
TRANSFORMERS_TAKES_DTYPE_KEYWORD = ">=4.56"


def dtype_keyword(transformers: str | None = None) -> str:
    """The keyword transformers' ``from_pretrained``/``from_config`` take the dtype by:
    ``dtype`` from :data:`TRANSFORMERS_TAKES_DTYPE_KEYWORD` (and without transformers),
    ``torch_dtype`` before.

    Args:
        transformers: A transformers release (``"4.48.3"``); the installed one when None.
    """
    found = transformers if transformers is not None else transformers_version()
    if found is not None and not release_in(found, TRANSFORMERS_TAKES_DTYPE_KEYWORD):
        return "torch_dtype"
    return "dtype"


#: The transformers releases whose cache and attention modules the decoding tasks' KV layers
#: (``text-generation`` and the encoder-decoder tasks: ``library/transformers/kv_layers.py``,
#: ``seq2seq_layers.py``) are written against: ``DynamicCache.layers``, attention modules that take
#: ``past_key_values``. 4.57 and 5.x are the releases run; 4.48.3 fails in the trace
#: (``'DynamicCache' object has no attribute 'layers'``; ``BartAttention.forward() got an
#: unexpected keyword argument 'past_key_values'``); 4.49 to 4.56 were not run, so they are refused.
DECODING_TASKS_TRANSFORMERS = ">=4.57"


#: The transformers releases whose encoder-decoder models the encoder-decoder tasks
#: (``text2text-generation``, ``automatic-speech-recognition``) cannot export: 5.0 to 5.8. Their
#: BART and mBART decoders embed positions from the builtin ``input`` (fixed in 5.9), and their
#: T5, mBART and Whisper decoder steps fail on the TorchScript path (seen: the BART build fails
#: on 5.0.0, 5.2.0, 5.5.4, 5.7.0 and 5.8.1 and passes on 5.9.0 and 5.10.4; the whole seq2seq zoo
#: passes on 5.9.0 and 5.24.0).
ENCODER_DECODER_TASKS_REFUSED = ">=5.0,<5.9"
#: The task names of the encoder-decoder tasks (``library/tasks/registry.py``'s graph tasks; the
#: version bridge imports nothing of the package, ``tests/base/test_versions.py`` compares them).
ENCODER_DECODER_TASKS = ("text2text-generation", "automatic-speech-recognition")


def decoding_task_missing(task: str, transformers: str | None = None) -> str | None:
    """One line naming the transformers release (``transformers``, else the installed one) and
    ``task`` when that release cannot serve a decoding task (:data:`DECODING_TASKS_TRANSFORMERS`;
    the encoder-decoder ones, :data:`ENCODER_DECODER_TASKS_REFUSED`); None when it can or
    transformers is not installed."""
    found = transformers if transformers is not None else transformers_version()
    if found is None:
        return None
    if task in ENCODER_DECODER_TASKS and release_in(found, ENCODER_DECODER_TASKS_REFUSED):
        return (
            f"transformers {found} cannot build task {task}: its encoder-decoder models do not "
            "export from 5.0 to 5.8 (BART's decoder embeds positions from the builtin input); "
            "transformers>=5.9, or 4.57; task: forward works on this release"
        )
    if release_in(found, DECODING_TASKS_TRANSFORMERS):
        return None
    return (
        f"transformers {found} cannot build task {task}: its KV layers need "
        f"transformers{DECODING_TASKS_TRANSFORMERS} (DynamicCache.layers, attention taking "
        "past_key_values); task: forward works on this release"
    )


def transformers_version() -> str | None:
    """The installed transformers version, or None when transformers is not installed."""
    return installed_version("transformers")


def torch_version() -> str | None:
    """The installed torch version, or None when torch is not installed."""
    return installed_version("torch")


def _given_or_installed_in(
    given: str | None, specifier: str, installed: Callable[[], str | None]
) -> bool:
    """Whether release ``given``, else the installed one (``installed()``: None when the
    library is not installed), satisfies ``specifier``: what every fact's predicate asks."""
    found = given if given is not None else installed()
    return found is not None and release_in(found, specifier)


def release_in(version: str, specifier: str) -> bool:
    """Whether release ``version`` (``"4.57.6"``) satisfies ``specifier`` (``">=4.54"``)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(specifier).contains(Version(version.split("+")[0]), prereleases=True)


#: The transformers releases that skip the SDPA mask under the TorchScript tracer when nothing is
#: masked (``masking_utils._ignore_causal_mask_sdpa`` asks ``is_tracing`` only of a padding mask
#: that exists), so SDPA gets ``enable_gqa``. Before, ``is_tracing()`` answers true under
#: ``torch.jit.trace`` and the mask is always built (4.x; 5.0 to 5.17, read off each release).
TRANSFORMERS_SKIPS_MASKS_WHEN_TRACED = ">=5.18"


#: The transformers releases whose Cohere rotary embedding broadcasts the positions against the
#: inverse frequencies. Before, it expands them to ``position_ids``' batch, which the TorchScript
#: tracer records as a fixed shape: ONNX Runtime refuses torch's own plain export of Cohere
#: ("invalid expand shape" in ``rotary_emb``: 4.48.3 and 5.0.0 seen; read off each 5.x release).
#: ``zoo.expected_failures`` words Cohere's TorchScript expected failure by it.
TRANSFORMERS_COHERE_ROTARY_BROADCASTS = ">=5.19"


def cohere_rotary_expands_to_batch(transformers: str | None = None) -> bool:
    """Whether transformers (``transformers``, else the installed one) predates
    :data:`TRANSFORMERS_COHERE_ROTARY_BROADCASTS`."""
    found = transformers if transformers is not None else transformers_version()
    return found is not None and not release_in(found, TRANSFORMERS_COHERE_ROTARY_BROADCASTS)


#: The transformers releases whose models and decoder layers take the KV cache as ``cache``
#: (``past_key_values`` stays a deprecated alias, until 5.40). Before, they take
#: ``past_key_values`` and would take ``cache`` into ``**kwargs`` and ignore it (4.57, and 5.0 to
#: 5.23: read off each release's ``modeling_llama.py``; the transformers-5.0.0 leg's seq2seq
#: failures).
TRANSFORMERS_CACHE_KEYWORD = ">=5.24"


def cache_keyword() -> str:
    """The keyword transformers models and their decoder layers take the KV cache by:
    ``cache`` on :data:`TRANSFORMERS_CACHE_KEYWORD`, else ``past_key_values``."""
    keyword_is_cache = _given_or_installed_in(
        None, TRANSFORMERS_CACHE_KEYWORD, transformers_version
    )
    return "cache" if keyword_is_cache else "past_key_values"


#: The transformers releases whose MoE experts modules say what they are (``has_gate``,
#: ``has_bias``, ``is_transposed``, ``_apply_gate``; 5.3 moved them into ``integrations/moe``).
#: Before, the 5.x experts of Mixtral, OLMoE and Qwen2-MoE are gated, untransposed and bias-free,
#: with ``act_fn(gate) * up`` of the halves of ``gate_up_proj`` (read off 5.0.0 to 5.2.0).
TRANSFORMERS_EXPERTS_DESCRIBE_THEMSELVES = ">=5.3"


def experts_describe_themselves() -> bool:
    """Whether the installed transformers is one of
    :data:`TRANSFORMERS_EXPERTS_DESCRIBE_THEMSELVES`."""
    return _given_or_installed_in(
        None, TRANSFORMERS_EXPERTS_DESCRIBE_THEMSELVES, transformers_version
    )


def layers_return_tuples() -> bool:
    """Whether transformers' decoder layers return a tuple even of one tensor (4.57: their
    stacks take ``[0]``); 5.x layers return the tensor itself."""
    return not _at_least("transformers", "5")


def query_position_arguments(module: Any, length: int) -> dict[str, Any]:
    """The query's positions, for an attention module whose forward asks for them.

    transformers 4.57's attention modules take them as ``cache_position`` and (T5, whose
    cross-attention sizes its position bias by it and ignores ``cache_position``) as
    ``query_length``; 5.x removed both.

    Returns:
        ``cache_position`` (``arange(length)``) and ``query_length`` (``length``), each only if
        ``module.forward`` takes it.
    """
    import inspect

    import torch

    parameters = inspect.signature(module.forward).parameters
    found: dict[str, Any] = {}
    if "cache_position" in parameters:
        found["cache_position"] = torch.arange(length)
    if "query_length" in parameters:
        found["query_length"] = length
    return found


#: transformers model classes whose attention reaches ``AttentionInterface`` (so
#: ``attention.implementation``) only from a release on: before it, their attention modules are
#: chosen once when the model is built (4.x's ``BertSdpaSelfAttention``), and switching the
#: implementation changes nothing (the capture warns).
ATTENTION_INTERFACE_SINCE: dict[str, str] = {"BertModel": "5"}


def attention_interface_reached(model_class: str) -> bool:
    """Whether the installed transformers routes ``model_class``'s attention (a class name,
    ``"BertModel"``) through ``AttentionInterface`` (:data:`ATTENTION_INTERFACE_SINCE`)."""
    since = ATTENTION_INTERFACE_SINCE.get(model_class)
    return since is None or _at_least("transformers", since)


#: The transformers releases with ``transformers.masking_utils``, where every model's masks are
#: made (4.53 on). Earlier releases make them in each model (``_update_causal_mask``, by
#: broadcasting, which both exporters trace); on 4.48.3: ``ImportError: cannot import name
#: 'masking_utils' from 'transformers'``.
TRANSFORMERS_MASKING_UTILS = ">=4.53"


def has_masking_utils(transformers: str | None = None) -> bool:
    """Whether transformers (``transformers``, else the installed one) is one of
    :data:`TRANSFORMERS_MASKING_UTILS`."""
    return _given_or_installed_in(transformers, TRANSFORMERS_MASKING_UTILS, transformers_version)


#: The torch releases on which transformers 4.x's ``masking_utils`` builds SDPA masks with its
#: older builder (``sdpa_mask_older_torch``: 4.57.6 picks it where torch is below 2.6). It vmaps
#: over the query and key indices only, so it cannot build a mask function that indexes a
#: tensor (a packed-sequence mask: "vmap: It looks like you're calling .item() on a Tensor",
#: torch 2.5.1), and transformers applies no packed-sequence mask there: its detection
#: (``find_packed_sequence_indices``) still runs, unused, so a trace drops it with its
#: ``aten::diff``. transformers 5.x refuses these releases.
TRANSFORMERS_OLDER_TORCH_MASKS = "<2.6"


def masks_without_packed_sequences(
    torch: str | None = None, transformers: str | None = None
) -> bool:
    """Whether transformers (``transformers``, else the installed one) has ``masking_utils`` and
    builds its masks with the older builder on torch (``torch``, else the installed one), one of
    :data:`TRANSFORMERS_OLDER_TORCH_MASKS`."""
    return has_masking_utils(transformers) and _given_or_installed_in(
        torch, TRANSFORMERS_OLDER_TORCH_MASKS, torch_version
    )


#: The torch releases on which transformers 4.x's older mask builder (4.53.3 and 4.57.6 read)
#: makes rows that attend to no key attend to every key, in place (``causal_mask |= ...``, its
#: ``allow_torch_fix`` for pytorch/pytorch#110213): below 2.5. TorchScript has no symbolic for
#: the in-place or, so a plain ``torch.onnx.export(dynamo=False)`` of a decoder that builds its
#: mask there fails at export (``UnsupportedOperatorError: ... 'aten::__ior_'``, torch 2.4.1 with
#: 4.57.6); hyperexport swaps in :func:`traceable_sdpa_mask`, so only the tests and the zoo's
#: expected failures key on it.
TRANSFORMERS_MASKS_FIXED_IN_PLACE = "<2.5"


def masks_fixed_in_place(torch: str | None = None, transformers: str | None = None) -> bool:
    """Whether transformers (``transformers``, else the installed one) has ``masking_utils`` and
    torch (``torch``, else the installed one) is one of
    :data:`TRANSFORMERS_MASKS_FIXED_IN_PLACE`."""
    return has_masking_utils(transformers) and _given_or_installed_in(
        torch, TRANSFORMERS_MASKS_FIXED_IN_PLACE, torch_version
    )


#: The torch releases whose SDPA returns NaN for a query row that attends to no key (a
#: left-padded position); 2.5 brought its "safe softmax" (pytorch/pytorch#133882), zeros. On them
#: transformers' mask builders let such a row attend to every key instead (``allow_torch_fix``,
#: which does not change the result at real positions), and so does hyperexport's traceable
#: builder (``transformers/masks.py``). transformers 4.57.6's own fix is in place on an expanded
#: mask, which fails for a batch of more than one row without padding ("more than one element
#: of the written-to tensor refers to a single memory location", torch 2.4.1), and which the
#: TorchScript exporter cannot convert (``aten::__ior_``).
TORCH_SDPA_NAN_ON_FULLY_MASKED_ROWS = "<2.5"


def sdpa_nan_on_fully_masked_rows(torch: str | None = None) -> bool:
    """Whether torch (``torch``, else the installed one) is one of
    :data:`TORCH_SDPA_NAN_ON_FULLY_MASKED_ROWS`."""
    return _given_or_installed_in(torch, TORCH_SDPA_NAN_ON_FULLY_MASKED_ROWS, torch_version)


def masks_built_by_vmap(transformers: str | None = None) -> bool:
    """Whether transformers builds SDPA masks with its vmapped builder (4.x's
    ``sdpa_mask_recent_torch``, in ``masking_utils`` from :data:`TRANSFORMERS_MASKING_UTILS`;
    5.x broadcasts index tensors instead, and releases before ``masking_utils`` broadcast in each
    model).

    ``torch.jit.trace`` fails on it (``RuntimeError: unordered_map::at``), so a plain TorchScript
    export of a decoder that builds such a mask fails at export; hyperexport swaps in
    :func:`traceable_sdpa_mask`. Tests and the zoo's expected failures key on it.

    Args:
        transformers: A transformers release (``"4.57.6"``); the installed one when None.
    """
    found = transformers if transformers is not None else transformers_version()
    return found is not None and has_masking_utils(found) and release_in(found, "<5")


def masking_export_flags() -> list[tuple[Any, str]]:
    """The functions that tell transformers' mask creation it runs under ``torch.export`` (then
    it always builds the SDPA mask instead of skipping it), as ``(module, name)`` pairs.

    transformers 5.x asks ``masking_utils.is_torchdynamo_exporting()`` (5.24), or only
    ``is_tracing(tensor)`` there (5.0 to 5.17), true under ``torch.export`` too; and, while it
    has them (to 5.23), ``modeling_attn_mask_utils`` asks both in its older helpers. 4.57 asks
    ``is_torchdynamo_compiling()`` for the same decision, in ``masking_utils`` (decoders) and in
    ``modeling_attn_mask_utils`` (the older mask helpers that BERT's SDPA path still uses).
    Releases before :data:`TRANSFORMERS_MASKING_UTILS` ask it in ``modeling_attn_mask_utils``
    only, for every model (4.51.3; without it, a Llama, GPT-2 or BERT layer had one tensor input
    fewer at capture than at export).

    Returns:
        The pairs; empty without transformers, or when it has none of them.
    """
    if transformers_version() is None:
        return []
    flags: list[tuple[Any, str]] = []
    five = _at_least("transformers", "5")
    if has_masking_utils():
        from transformers import masking_utils

        if callable(getattr(masking_utils, "is_torchdynamo_exporting", None)):
            flags.append((masking_utils, "is_torchdynamo_exporting"))
        elif five and callable(getattr(masking_utils, "is_tracing", None)):
            # 5.0 to 5.17 ask is_tracing(tensor) alone, which is true under torch.export
            flags.append((masking_utils, "is_tracing"))
        elif callable(getattr(masking_utils, "is_torchdynamo_compiling", None)):
            flags.append((masking_utils, "is_torchdynamo_compiling"))
        else:
            return []
    # The older mask helpers, while transformers has them (to 5.23): every 4.x model's masks
    # before masking_utils (4.51.3: AttentionMaskConverter._ignore_causal_mask_sdpa), BERT's on
    # 4.57, Falcon's on 5.0 (which asks is_tracing there: the transformers-5.0.0 leg).
    if importlib.util.find_spec("transformers.modeling_attn_mask_utils") is None:
        return flags
    helpers: Any = importlib.import_module("transformers.modeling_attn_mask_utils")
    names = ("is_torchdynamo_compiling", "is_tracing") if five else ("is_torchdynamo_compiling",)
    flags.extend((helpers, name) for name in names if callable(getattr(helpers, name, None)))
    return flags


#: What the traceable mask builder (``library/transformers/masks.py``) builds on: transformers 4.x
#: ``masking_utils`` helpers.
_SDPA_MASK_PARTS = (
    "prepare_padding_mask",
    "_ignore_causal_mask_sdpa",
    "and_masks",
    "padding_mask_function",
    "causal_mask_function",
)


def vmapped_sdpa_masks() -> Any:
    """transformers' ``masking_utils`` when it builds SDPA masks by vmapping and has the helpers
    a traceable builder needs (4.x: ``sdpa_mask_recent_torch``); None otherwise (5.x broadcasts
    index tensors, under another signature; releases before :data:`TRANSFORMERS_MASKING_UTILS`
    have no ``masking_utils``)."""
    if not has_masking_utils():
        return None
    # Typed as Any: these are 4.x's helpers and signatures; mypy sees the pinned 5.x.
    masking_utils: Any = importlib.import_module("transformers.masking_utils")
    if not all(callable(getattr(masking_utils, name, None)) for name in _SDPA_MASK_PARTS):
        return None
    if not hasattr(masking_utils, "sdpa_mask_recent_torch"):
        return None
    return masking_utils


#: The torch releases whose ``torch.export`` cannot trace transformers 4.x's vmapped SDPA mask
#: builder at dynamic sizes, so that the dynamo path builds masks with the traceable builder
#: (``library/transformers/masks.py``) too. torch 2.9.1 with transformers 4.57.6: torch's own
#: ``torch.onnx.export(dynamo=True, dynamic_shapes=...)`` of a tiny ``LlamaModel`` fails in
#: ``sdpa_mask_recent_torch`` (the vmapped ``packed_sequence_mask[batch_idx, q_idx]`` under
#: ``TransformGetItemToIndex``) with ``RuntimeError: 8*s72 is not tracked with proxy for
#: <_ModuleStackTracer>``, with ``Dim`` and with ``Dim.AUTO`` alike; static shapes export. torch
#: 2.13.0 exports the same model (the ``cheap`` leg). 2.10 to 2.12 were not run with 4.57, so they
#: get the bridge, which builds the same mask (tests/transformers/test_patches.py).
VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT = "<2.13"


def export_fails_on_vmapped_masks() -> bool:
    """Whether torch's own ``torch.export`` of a transformers decoder with dynamic shapes fails on
    its SDPA mask with the installed pair: transformers builds masks by vmapping (4.x, where
    :func:`vmapped_sdpa_masks` finds what a builder put in its place needs) and torch is one of
    :data:`VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT`. Tests use it for a strict xfail of torch's own
    export; hyperexport's dynamo path bridges it (``broadcast_sdpa_mask_for_torch_export`` in
    :mod:`hyperexport.library.transformers.patches`)."""
    found = torch_version()
    if found is None or not release_in(found, VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT):
        return False
    return installed_version("transformers") is not None and vmapped_sdpa_masks() is not None


#: The torch releases whose ``torch.export`` fails a dynamic length that the model compares with
#: 1 (see :func:`export_refuses_one_token_guards`). Seen refused on 2.6.0 and 2.9.1, kept dynamic
#: on 2.8.0 and 2.11.0 (the same transformers 5.x); 2.7 and 2.10 were not run and count as their
#: older neighbour. Either range alone, as one ``SpecifierSet``, would be wrong on a run release.
EXPORT_REFUSES_ONE_TOKEN_GUARDS = ("<2.8", ">=2.9,<2.11")


def export_refuses_one_token_guards(torch: str | None = None) -> bool:
    """Whether ``torch.export`` fails a dynamic length that the model compares with 1.

    transformers' mask and attention code branches on a query length of 1; ``torch.export`` on
    the releases of :data:`EXPORT_REFUSES_ONE_TOKEN_GUARDS` turns that branch into a guard
    ``new_len != 1`` and refuses the dynamic dimension (``Constraints violated (new_len)``).
    Tests use it for a strict xfail of torch's own export.

    Args:
        torch: A torch release (``"2.9.1"``); the installed one when None.
    """
    found = torch if torch is not None else torch_version()
    return found is not None and any(
        release_in(found, releases) for releases in EXPORT_REFUSES_ONE_TOKEN_GUARDS
    )


#: The torch releases whose ``ExportedProgram.module()`` inserts a ``_guards_fn`` (and takes
#: ``check_guards``): 2.9 on; 2.6.0's takes no ``check_guards`` (``TypeError: ... unexpected
#: keyword argument 'check_guards'``). 2.7 and 2.8 were not checked.
EXPORT_INSERTS_GUARDS_FN = ">=2.9"


def export_guards_name_dynamo_sources() -> bool:
    """Whether torch's ``ExportedProgram.module()`` inserts a ``_guards_fn`` whose generated code
    names dynamo's ``L[...]`` sources, which ``torch.onnx.export(dynamo=True)`` then fails to run
    while it decomposes (torch 2.9, pytorch/pytorch#172903); later releases rewrite those names
    to the signature's (``_unlift._force_ep_signature_match``, present from 2.11)."""
    found = torch_version()
    if found is None or not release_in(found, EXPORT_INSERTS_GUARDS_FN):
        return False
    from torch.export import _unlift

    return not hasattr(_unlift, "_force_ep_signature_match")


# -- ONNX IR versions and the ONNX Runtime releases that load them --------------------------------


#: The lowest IR version with model-local functions (``ModelProto.functions``, onnx 1.10).
FUNCTIONS_MIN_IR_VERSION = 8

#: The column of each opset domain in ``onnx.helper.VERSION_TABLE``'s rows (release, IR version,
#: ai.onnx, ai.onnx.ml, ai.onnx.training). Other domains (``com.microsoft``, hyperexport's own)
#: are not ONNX's: their versions ask nothing of the IR version.
_VERSION_TABLE_COLUMNS = {
    "": 2,
    "ai.onnx": 2,
    "ai.onnx.ml": 3,
    "ai.onnx.training": 4,
    "ai.onnx.preview.training": 4,
}


def lowest_ir_version(opsets: Mapping[str, int], *, functions: bool) -> int:
    """The lowest IR version that carries ``opsets`` (``{domain: version}``), and local
    functions when ``functions``: read from the installed onnx's release table
    (``onnx.helper.VERSION_TABLE``, as data), whose first release with each opset gives its IR.

    Raises:
        ValueError: An ONNX opset the installed onnx's table does not reach.
    """
    from onnx import helper

    table: list[tuple[Any, ...]] = [tuple(row) for row in helper.VERSION_TABLE]
    lowest = min(int(row[1]) for row in table)
    if functions:
        lowest = max(lowest, FUNCTIONS_MIN_IR_VERSION)
    for domain, version in opsets.items():
        column = _VERSION_TABLE_COLUMNS.get(domain)
        if column is None:
            continue
        carrying = [
            int(row[1]) for row in table if len(row) > column and int(row[column]) >= version
        ]
        if not carrying:
            raise ValueError(
                f"onnx {installed_version('onnx')} knows no IR version for opset "
                f"{domain or 'ai.onnx'} {version}"
            )
        lowest = max(lowest, min(carrying))
    return lowest


@dataclass(frozen=True)
class RuntimeLoads:
    """The highest default-domain opset and IR version an ONNX Runtime release loads.

    Attributes:
        release: ``major.minor`` (``"1.16"``).
        max_opset: Its highest ``ai.onnx`` opset.
        max_ir_version: Its highest IR version.
    """

    release: str
    max_opset: int
    max_ir_version: int


#: ONNX Runtime's own compatibility table ("ONNX opset support", onnxruntime.ai/docs/reference/
#: compatibility.html; microsoft/onnxruntime gh-pages ``docs/reference/compatibility.md`` at
#: 109c0baa9367): each release from 1.16 on, its ONNX opset and ONNX IR version columns. The
#: table read ends at 1.20; a later target is not checked (validation says so at WARNING).
#: 1.16 measured too: 1.16.3 loads an opset-17 and an opset-18 model at IR 8 and refuses IR 10
#: ("max supported IR version: 9"; ``tests/e2e/test_old_runtime.py``, ``nox -s onnxruntime-1.16``).
ONNXRUNTIME_LOADS: tuple[RuntimeLoads, ...] = (
    RuntimeLoads("1.16", 19, 9),
    RuntimeLoads("1.17", 20, 9),
    RuntimeLoads("1.18", 21, 10),
    RuntimeLoads("1.19", 21, 10),
    RuntimeLoads("1.20", 21, 10),
)


def _minor(release: str) -> Version:
    """``major.minor`` of a release (``1.16.3`` -> 1.16)."""
    found = Version(release.split("+")[0])
    return Version(f"{found.major}.{found.minor}")


def onnxruntime_loads(release: str) -> RuntimeLoads | None:
    """What ONNX Runtime ``release`` (``"1.16"``, ``"1.16.3"``) loads
    (:data:`ONNXRUNTIME_LOADS`); None for a release newer than the table's last."""
    wanted = _minor(release)
    return next((row for row in ONNXRUNTIME_LOADS if Version(row.release) == wanted), None)


def onnxruntime_refusal(release: str, opset: int, ir_version: int) -> str | None:
    """Why ONNX Runtime ``release`` cannot load a model of default-domain ``opset`` at
    ``ir_version`` (one line naming both), or None when it can or the release is newer than
    :data:`ONNXRUNTIME_LOADS` knows (:func:`onnxruntime_beyond_table`)."""
    first = ONNXRUNTIME_LOADS[0].release
    if _minor(release) < Version(first):
        return f"onnxruntime {release} is older than the releases hyperexport targets ({first} on)"
    loads = onnxruntime_loads(release)
    if loads is None:
        return None
    if opset > loads.max_opset or ir_version > loads.max_ir_version:
        return (
            f"onnxruntime {release} loads opsets up to {loads.max_opset} at IR versions up to "
            f"{loads.max_ir_version}; this build writes opset {opset} at IR {ir_version}"
        )
    return None


def onnxruntime_beyond_table(release: str) -> bool:
    """Whether ONNX Runtime ``release`` is newer than :data:`ONNXRUNTIME_LOADS`'s last row."""
    return _minor(release) > Version(ONNXRUNTIME_LOADS[-1].release)


def onnxruntime_older_than_installed(release: str) -> bool:
    """Whether ONNX Runtime ``release`` is an older ``major.minor`` than the installed one
    (False when none is installed)."""
    installed = installed_version("onnxruntime")
    return installed is not None and _minor(release) < _minor(installed)
