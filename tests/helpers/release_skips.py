"""Skips of tests whose subject an older release lacks, each keyed to a version fact of
``hyperexport/base/versions.py`` and naming the installed release (the TorchScript-only legs of
noxfile.py: torch 2.2 with transformers 4.48). The dynamo path's are in
:mod:`tests.helpers.path_skips`."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest

from hyperexport.base import versions
from hyperexport.library.passes.ort_kernels import gqa_takes_query_seqlens

#: For a test that exports on the TorchScript path at opset 18 or more because that is what it
#: tests (attention promotion's floor, the fused rewrites): skipped where torch's TorchScript
#: exporter stops below 18 (``versions.TORCHSCRIPT_OPSET_CAPS``).
NEEDS_OPSET_18 = pytest.mark.skipif(
    versions.torchscript_opset(18) < 18,
    reason=(
        f"torch {versions.torch_version()}'s TorchScript exporter stops at opset "
        f"{versions.torchscript_opset_cap()}; this test needs 18"
    ),
)

#: For a test of hyperexport's own attention (``attention.implementation: hyperexport``):
#: skipped where transformers cannot register it (``versions.HYPEREXPORT_ATTENTION_TRANSFORMERS``).
NEEDS_HYPEREXPORT_ATTENTION = pytest.mark.skipif(
    versions.attention_registration_missing() is not None,
    reason=str(versions.attention_registration_missing()),
)

#: For a test of a decoding task (``text-generation``, the encoder-decoder tasks): skipped where
#: transformers is older than their KV layers (``versions.DECODING_TASKS_TRANSFORMERS``).
NEEDS_DECODING_TASKS = pytest.mark.skipif(
    versions.decoding_task_missing("text-generation") is not None,
    reason=str(versions.decoding_task_missing("text-generation")),
)

#: For a test of an encoder-decoder task: skipped where transformers cannot serve it either
#: (``versions.ENCODER_DECODER_TASKS_REFUSED``: 5.0 to 5.8).
NEEDS_ENCODER_DECODER_TASKS = pytest.mark.skipif(
    versions.decoding_task_missing("text2text-generation") is not None,
    reason=str(versions.decoding_task_missing("text2text-generation")),
)

#: For a test that builds ``recipes/zoo_qwen3.yaml``: Qwen3 arrived in transformers 4.51.
NEEDS_QWEN3 = pytest.mark.skipif(
    importlib.util.find_spec("transformers.models.qwen3") is None,
    reason=f"transformers {versions.transformers_version()} has no Qwen3 (4.51 brought it)",
)

#: For a test of transformers' ``masking_utils`` (the mask builders hyperexport patches and the
#: flags that make them build under export): transformers brought it in 4.53
#: (``versions.TRANSFORMERS_MASKING_UTILS``).
NEEDS_MASKING_UTILS = pytest.mark.skipif(
    not versions.has_masking_utils(),
    reason=(
        f"transformers {versions.transformers_version()} has no masking_utils "
        f"(transformers{versions.TRANSFORMERS_MASKING_UTILS})"
    ),
)


#: For a test that builds a fused generation step (``rewrite.fuse: onnxruntime``: the trace's
#: batched steps of several tokens over a past): skipped where ONNX Runtime's
#: GroupQueryAttention takes no ``query_seqlens`` (the onnxruntime-floor leg), for which the
#: rewrite refuses such a step, saying so (``tests/e2e/test_fusion.py`` checks the refusal).
NEEDS_GQA_QUERY_SEQLENS = pytest.mark.skipif(
    not gqa_takes_query_seqlens(),
    reason=(
        f"onnxruntime {versions.installed_version('onnxruntime')}'s GroupQueryAttention takes no "
        "query_seqlens: a fused generation step is refused at rewrite"
    ),
)


def torchscript_export_arguments(opset: int = 18) -> dict[str, object]:
    """The keywords of a plain ``torch.onnx.export`` on the TorchScript path where the opset is
    not what the test tests: ``dynamo=False`` where torch takes the keyword
    (``versions.torchscript_export_keywords``), and ``opset``, or the installed torch's
    TorchScript cap where that is lower (``versions.torchscript_opset``; torch 2.2: 17)."""
    return {
        **versions.torchscript_export_keywords(),
        "opset_version": versions.torchscript_opset(opset),
    }


#: For a test that exports a bfloat16 transformers model on the TorchScript path (its additive
#: attention mask is bfloat16): skipped where torch's SDPA symbolic refuses such a mask
#: (``versions.SDPA_SYMBOLIC_REFUSES_BFLOAT16_MASK``; not bridged, the export fails naming its
#: module).
NEEDS_BFLOAT16_SDPA_MASK = pytest.mark.skipif(
    versions.sdpa_symbolic_refuses_bfloat16_mask(),
    reason=(
        f"torch {versions.torch_version()}'s TorchScript SDPA symbolic refuses a bfloat16 "
        f"attention mask (torch{versions.SDPA_SYMBOLIC_REFUSES_BFLOAT16_MASK})"
    ),
)


def torchscript_repairs() -> contextlib.AbstractContextManager[None]:
    """What a plain ``torch.onnx.export`` of a transformers attention needs on the TorchScript
    path of the installed torch, as hyperexport's own export has it: torch's SDPA symbolic with
    the given ``scale`` as a value where torch reads it as a float
    (``versions.SDPA_SYMBOLIC_READS_SCALE_AS_FLOAT``: torch 2.2 fails ``z_(): incompatible
    function arguments``); nothing elsewhere, so the pinned stack's export is torch's own."""
    if not versions.sdpa_symbolic_reads_scale_as_float():
        return contextlib.nullcontext()
    from hyperexport.library.export.torch_exporter import repaired_sdpa_symbolic

    return repaired_sdpa_symbolic()
