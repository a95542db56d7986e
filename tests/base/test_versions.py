"""hyperexport/base/versions.py is the one place that knows library versions.

(a) No other module compares library versions (read from the sources with ``ast``): no
    ``packaging.version`` / ``packaging.specifiers``, no library's ``__version__``, no version
    read inside a comparison. Reading a version to report it is fine.
(b) A known-broken combination is refused before export, in one line naming both versions.
(c) The transformers hooks resolve on the installed release.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import hyperexport
from hyperexport.base import versions
from hyperexport.base.errors import VersionsError
from hyperexport.library.export.registry import path_for
from hyperexport.library.transformers.masks import never_gqa
from hyperexport.library.transformers.patches import patches_for

PACKAGE = Path(hyperexport.__file__).parent
BRIDGE = PACKAGE / "base" / "versions.py"
_VERSION_MODULES = ("packaging.version", "packaging.specifiers", "pkg_resources")
_VERSION_READS = {"version", "distribution_version", "installed_version", "transformers_version"}


def _called_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _reads_version(node: ast.AST) -> bool:
    """Whether ``node`` is a library version: ``x.__version__`` (not hyperexport's own) or a
    call to a version-reading function."""
    if isinstance(node, ast.Attribute) and node.attr == "__version__":
        return not (isinstance(node.value, ast.Name) and node.value.id == "hyperexport")
    return _called_name(node) in _VERSION_READS


def version_comparisons(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for every version comparison in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(n.startswith(_VERSION_MODULES) for n in names):
                yield node.lineno, f"imports {node.module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(_VERSION_MODULES):
                    yield node.lineno, f"imports {alias.name}"
        elif (
            isinstance(node, ast.Attribute) and node.attr == "__version__" and _reads_version(node)
        ):
            yield node.lineno, "reads a library's __version__"
        elif isinstance(node, ast.Compare):
            for part in (node.left, *node.comparators):
                if any(_reads_version(n) for n in ast.walk(part)):
                    yield node.lineno, "compares a version"
                    break


def test_no_module_but_versions_py_compares_library_versions() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != BRIDGE
        for line, what in version_comparisons(path.read_text(encoding="utf-8"))
    ]
    assert not found, "version checks belong in hyperexport/base/versions.py:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nif torch.__version__ >= '2.11': pass",
        "from packaging.version import Version",
        "from importlib.metadata import version\nok = version('onnx') < '1.19'",
    ],
)
def test_the_scan_finds_a_version_comparison(source: str) -> None:
    assert list(version_comparisons(source))


def test_the_scan_allows_reading_a_version_to_report_it() -> None:
    assert not list(version_comparisons("from importlib.metadata import version\nv = version('x')"))


def _installed(monkeypatch: pytest.MonkeyPatch, found: dict[str, str]) -> None:
    monkeypatch.setattr(versions, "installed_version", lambda name: found.get(name))


def test_an_onnxscript_before_0_6_2_is_refused_before_a_dynamo_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, {"torch": "2.13.0+cpu", "onnxscript": "0.5.7"})
    with pytest.raises(VersionsError) as caught:
        path_for(True)
    message = str(caught.value)
    assert "\n" not in message
    assert "torch 2.13.0+cpu" in message and "onnxscript 0.5.7" in message
    assert "onnxscript>=0.6.2" in message
    assert path_for(False).dynamo is False  # the TorchScript path does not import onnxscript's APIs


def test_torch_2_11_with_an_onnx_ir_without_schemas_is_refused_before_a_dynamo_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, {"torch": "2.11.0", "onnxscript": "0.6.2", "onnx-ir": "0.1.15"})
    [problem] = versions.unsupported(True)
    assert "torch 2.11.0" in problem and "onnx-ir 0.1.15" in problem
    assert "onnx-ir>=0.1.16" in problem and "onnx_ir.schemas" in problem
    assert versions.unsupported(False) == []


def test_older_torch_or_newer_onnxscript_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, {"torch": "2.8.0", "onnxscript": "0.6.2", "onnx-ir": "0.1.15"})
    assert versions.unsupported(True) == []
    _installed(monkeypatch, {"torch": "2.13.0", "onnxscript": "0.6.2", "onnx-ir": "0.1.16"})
    assert versions.unsupported(True) == []
    # 0.5.7's version converter refuses the models of every torch the dynamo path takes (the
    # torch-2.9.1 and torch-2.8.0 legs with it, and 2.6.0 checked)
    for torch_release in ("2.6.0", "2.9.1"):
        _installed(monkeypatch, {"torch": torch_release, "onnxscript": "0.5.7", "onnx-ir": "1.1.0"})
        [problem] = versions.unsupported(True)
        assert "onnxscript>=0.6.2" in problem and "The model contains functions" in problem


def test_release_in() -> None:
    assert versions.release_in("4.57.6", ">=4.54")
    assert versions.release_in("2.13.0+cpu", ">=2.11")
    assert not versions.release_in("4.40.0", ">=4.54")


def test_installed_versions_are_the_recorded_libraries_in_order() -> None:
    found = versions.installed_versions()
    assert list(found) == [n for n in versions.RECORDED_DISTRIBUTIONS if n in found]
    assert {"torch", "onnx", "hyperexport"} <= set(found)


def test_transformers_hooks_resolve_on_the_installed_release() -> None:
    pytest.importorskip("transformers")
    if not versions.has_masking_utils():
        from transformers import modeling_attn_mask_utils

        # the older mask helpers decide alone (every model's masks before masking_utils)
        flags = [(modeling_attn_mask_utils, "is_torchdynamo_compiling")]
        assert versions.masking_export_flags() == flags
        assert versions.vmapped_sdpa_masks() is None
        pytest.skip(f"transformers {versions.transformers_version()} has no masking_utils")
    from transformers import masking_utils
    from transformers.integrations import sdpa_attention

    flags = versions.masking_export_flags()
    assert flags and all(callable(getattr(owner, name)) for owner, name in flags)
    assert flags[0][0] is masking_utils
    if "sdpa_without_enable_gqa" in [p.name for p in patches_for(False)]:
        # the hook that patch replaces (4.53.3 has none: its layers repeat key and value)
        assert callable(sdpa_attention.use_gqa_in_sdpa)
    assert never_gqa(None, None) is False
    assert never_gqa(None, None, None) is False


def test_a_transformers_class_of_a_later_release_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    router = "transformers.models.mixtral.modeling_mixtral.MixtralTopKRouter"
    _installed(monkeypatch, {"transformers": "4.57.6"})
    message = versions.missing_transformers_class(router)
    assert message is not None and "\n" not in message
    assert "transformers 4.57.6 has no MixtralTopKRouter" in message
    assert "transformers>=5" in message
    assert versions.missing_transformers_class("transformers.models.llama.X") is None
    _installed(monkeypatch, {"transformers": "5.24.0"})
    assert versions.missing_transformers_class(router) is None


def test_the_later_classes_exist_where_the_installed_release_has_them() -> None:
    pytest.importorskip("transformers")
    from transformers.models.mixtral import modeling_mixtral

    for name in ("MixtralTopKRouter", "MixtralExperts"):
        missing = versions.missing_transformers_class(f"{modeling_mixtral.__name__}.{name}")
        assert (missing is None) == hasattr(modeling_mixtral, name)


def test_the_zoo_release_predicates_name_the_release_of_each_change() -> None:
    assert versions.masks_built_by_vmap("4.57.6") and not versions.masks_built_by_vmap("5.24.0")
    assert not versions.masks_built_by_vmap("4.48.3")  # no masking_utils: masks per model


def test_the_zoo_release_predicates_match_the_installed_transformers() -> None:
    pytest.importorskip("transformers")
    import importlib.util

    has_module = importlib.util.find_spec("transformers.masking_utils") is not None
    assert versions.has_masking_utils() == has_module
    if not has_module:
        assert not versions.masks_built_by_vmap()
        return
    from transformers import masking_utils

    assert versions.masks_built_by_vmap() == hasattr(masking_utils, "sdpa_mask_recent_torch")


# -- torch's TorchScript exporter and the dynamo path's floor --------------------------------------


def test_the_dynamo_keyword_is_passed_only_where_torch_onnx_export_takes_it() -> None:
    assert versions.torchscript_export_keywords("2.2.2") == {}
    assert versions.torchscript_export_keywords("2.4.1") == {}
    assert versions.torchscript_export_keywords("2.5.1") == {"dynamo": False}
    assert versions.torchscript_export_keywords("2.13.0+cpu") == {"dynamo": False}


def test_torch_2_2_caps_the_torchscript_opset_at_17() -> None:
    assert versions.torchscript_opset_cap("2.2.2") == 17
    assert versions.torchscript_opset_cap("2.3.0") is None
    assert versions.torchscript_opset_cap("2.13.0+cpu") is None


def test_an_opset_named_by_no_caller_is_lowered_to_the_cap_only_where_torch_has_one() -> None:
    assert versions.torchscript_opset(18, "2.2.2") == 17
    assert versions.torchscript_opset(16, "2.2.2") == 16
    assert versions.torchscript_opset(18, "2.3.0") == 18
    assert versions.torchscript_opset(20, "2.13.0+cpu") == 20


def test_torch_library_defines_operators_from_functions_from_2_4() -> None:
    assert not versions.torch_library_has_custom_op("2.2.2")
    assert not versions.torch_library_has_custom_op("2.3.1")
    assert versions.torch_library_has_custom_op("2.4.1")


def test_the_custom_op_fact_matches_the_installed_torch() -> None:
    import torch

    assert versions.torch_library_has_custom_op() == callable(
        getattr(torch.library, "custom_op", None)
    )


def test_the_opset_caps_agree_with_the_installed_torchs_own_constant() -> None:
    from torch.onnx import _constants

    from hyperexport.base.contracts.names import TORCHSCRIPT_MAX_OPSET

    own = _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    assert (versions.torchscript_opset_cap() or TORCHSCRIPT_MAX_OPSET) == min(
        own, TORCHSCRIPT_MAX_OPSET
    )


def test_torch_before_2_5_reads_a_given_sdpa_scale_as_a_float() -> None:
    assert versions.sdpa_symbolic_reads_scale_as_float("2.2.2")
    assert versions.sdpa_symbolic_reads_scale_as_float("2.4.1")
    assert not versions.sdpa_symbolic_reads_scale_as_float("2.5.1")


def test_torch_before_2_9_exports_nan_for_a_fully_masked_sdpa_row() -> None:
    assert versions.sdpa_symbolic_leaves_masked_rows_nan("2.2.2")
    assert versions.sdpa_symbolic_leaves_masked_rows_nan("2.8.0")
    assert not versions.sdpa_symbolic_leaves_masked_rows_nan("2.9.1")


def test_torch_before_2_8_fails_the_dynamo_translation_of_an_eval_batch_norm() -> None:
    assert versions.dynamo_fails_eval_batch_norm("2.6.0")
    assert not versions.dynamo_fails_eval_batch_norm("2.8.0")


@pytest.mark.parametrize(
    ("torch", "refuses"),
    [("2.6.0", True), ("2.8.0", False), ("2.9.1", True), ("2.11.0", False), ("2.13.0", False)],
)
def test_the_releases_whose_export_refuses_the_one_token_guard(torch: str, refuses: bool) -> None:
    assert versions.export_refuses_one_token_guards(torch) == refuses


@pytest.mark.skipif(not versions.has_masking_utils(), reason="no transformers.masking_utils here")
def test_transformers_builds_masks_without_packed_sequences_below_torch_2_6() -> None:
    assert versions.masks_without_packed_sequences("2.5.1")
    assert not versions.masks_without_packed_sequences("2.6.0")


def test_transformers_masks_fix_fully_masked_rows_in_place_below_torch_2_5() -> None:
    assert versions.masks_fixed_in_place("2.4.1", "4.57.6")
    assert versions.masks_fixed_in_place("2.4.1", "4.53.3")
    assert not versions.masks_fixed_in_place("2.5.1", "4.57.6")
    assert not versions.masks_fixed_in_place("2.4.1", "4.48.3")  # no masking_utils
    assert versions.masks_without_packed_sequences("2.5.1", "4.57.6")
    assert not versions.masks_without_packed_sequences("2.5.1", "4.48.3")


def test_torch_before_2_5_gives_nan_for_a_fully_masked_sdpa_row() -> None:
    assert versions.sdpa_nan_on_fully_masked_rows("2.4.1")
    assert not versions.sdpa_nan_on_fully_masked_rows("2.5.1")


def test_torch_before_2_3_lacks_the_wide_unsigned_dtypes() -> None:
    assert versions.torch_lacks_wide_unsigned_dtypes("2.2.2")
    assert not versions.torch_lacks_wide_unsigned_dtypes("2.3.0")


def test_the_wide_unsigned_fact_matches_the_installed_torch() -> None:
    import torch

    assert versions.torch_lacks_wide_unsigned_dtypes() == (not hasattr(torch, "uint16"))


def test_a_dynamo_build_below_the_lowest_working_torch_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, {"torch": "2.2.2", "onnxscript": "0.6.2", "onnx-ir": "0.1.16"})
    [problem] = versions.unsupported(True)
    assert "\n" not in problem
    assert "torch 2.2.2" in problem and f"torch>={versions.DYNAMO_PATH_FROM_TORCH}" in problem
    assert versions.unsupported(False) == []
    with pytest.raises(VersionsError, match=r"torch 2\.2\.2"):
        path_for(True)
    assert path_for(False).dynamo is False
    _installed(monkeypatch, {"torch": "2.6.0", "onnxscript": "0.6.2", "onnx-ir": "0.1.16"})
    assert versions.unsupported(True) == []


def test_hyperexport_attention_needs_transformers_4_53() -> None:
    problem = versions.attention_registration_missing("4.48.3")
    assert problem is not None and "\n" not in problem
    assert "transformers 4.48.3" in problem and ">=4.53" in problem
    assert versions.attention_registration_missing("4.57.6") is None
    assert versions.attention_registration_missing("5.0.0") is None


def test_transformers_takes_the_dtype_as_dtype_from_4_56() -> None:
    assert versions.dtype_keyword("4.48.3") == "torch_dtype"
    assert versions.dtype_keyword("4.55.4") == "torch_dtype"
    assert versions.dtype_keyword("4.56.0") == "dtype"
    assert versions.dtype_keyword("5.24.0") == "dtype"


def test_torch_2_2_refuses_a_bfloat16_sdpa_mask_on_the_torchscript_path() -> None:
    assert versions.sdpa_symbolic_refuses_bfloat16_mask("2.2.2")
    assert not versions.sdpa_symbolic_refuses_bfloat16_mask("2.13.0+cpu")


def test_the_decoding_tasks_are_refused_below_transformers_4_57() -> None:
    problem = versions.decoding_task_missing("text-generation", "4.48.3")
    assert problem is not None and "\n" not in problem
    assert "transformers 4.48.3" in problem and "text-generation" in problem
    assert versions.decoding_task_missing("text-generation", "4.57.6") is None
    assert versions.decoding_task_missing("text2text-generation", "5.24.0") is None


def test_torch_compiler_flags_by_release() -> None:
    assert versions.torch_compiler_flags("2.2.2") == (False, False)
    assert versions.torch_compiler_flags("2.6.0") == (False, True)
    assert versions.torch_compiler_flags("2.13.0+cpu") == (True, True)


def test_the_torch_compiler_flags_match_the_installed_torch() -> None:
    import torch

    assert versions.torch_compiler_flags() == (
        hasattr(torch.compiler, "is_exporting"),
        hasattr(torch.compiler, "is_compiling"),
    )


def test_torch_2_6_builds_one_torchlib_registry_and_inserts_no_guards_fn() -> None:
    assert not versions.torchlib_registry_takes_opset("2.6.0")
    assert versions.torchlib_registry_takes_opset("2.9.1")
    assert not versions.release_in("2.6.0", versions.EXPORT_INSERTS_GUARDS_FN)
    assert versions.release_in("2.9.1", versions.EXPORT_INSERTS_GUARDS_FN)


@pytest.mark.parametrize(
    ("transformers", "names_releases"), [("4.48.3", True), ("4.53.3", False), ("5.24.0", False)]
)
def test_a_size_int_is_refused_in_one_line_naming_the_releases_where_layers_take_it(
    transformers: str, names_releases: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(versions, "transformers_version", lambda: transformers)
    line = versions.size_int_refusal("input module 'layers.0' input['last_cache_position']")
    assert ("transformers>=4.53" in line and f"transformers {transformers}'s" in line) is (
        names_releases
    )
    assert "torch.SymInt" in line and "\n" not in line
    other = versions.size_int_refusal("input module 'layers.0' input['offset']")
    assert "transformers" not in other and "dynamo: false" in other


def test_the_bridge_names_the_encoder_decoder_tasks_the_registry_has() -> None:
    from hyperexport.library.tasks.registry import TASKS

    graphs = {name for name, task in TASKS.items() if task.graphs}
    assert set(versions.ENCODER_DECODER_TASKS) == graphs
    refusal = versions.decoding_task_missing("text2text-generation", "5.5.4")
    assert refusal and "transformers 5.5.4" in refusal and "transformers>=5.9" in refusal
    assert versions.decoding_task_missing("text-generation", "5.5.4") is None
    assert versions.decoding_task_missing("text2text-generation", "5.9.0") is None
