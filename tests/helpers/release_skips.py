"""Skips of tests whose subject an older release lacks, each keyed to a version fact of
``hyperexport/base/versions.py`` and naming the installed release (the TorchScript-only legs of
noxfile.py: torch 2.2 with transformers 4.48). The dynamo path's are in
:mod:`tests.helpers.path_skips`."""

from __future__ import annotations

import importlib.util

import pytest

from hyperexport.base import versions

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

#: For a test that builds ``recipes/zoo_qwen3.yaml``: Qwen3 arrived in transformers 4.51.
NEEDS_QWEN3 = pytest.mark.skipif(
    importlib.util.find_spec("transformers.models.qwen3") is None,
    reason=f"transformers {versions.transformers_version()} has no Qwen3 (4.51 brought it)",
)
