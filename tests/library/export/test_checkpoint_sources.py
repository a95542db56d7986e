"""The checkpoint locator on a real transformers checkpoint: every weight of a model loaded in
the stored dtype is placed (tied ones, and with the base model's prefix stripped), the export's
``units/weights.data`` is then exactly the declared ranges of the checkpoint on both export
paths, and a model loaded in another dtype places nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from hyperexport import ExportOptions
from hyperexport.base.contracts.weight_index import read_weight_index
from hyperexport.engine.sourced import matching_digest
from hyperexport.library.api import capture_model, export_units
from hyperexport.library.export.checkpoint_sources import CheckpointLocator
from hyperexport.library.export.weights import INLINE_LIMIT, WEIGHTS_FILE, WeightSources
from hyperexport.library.models.pretrained import pretrained
from hyperexport.product.stages.export import file_sources
from tests.helpers.checkpoints import save_tiny_llama
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.release_skips import NEEDS_BFLOAT16_SDPA_MASK

PATHS = [pytest.param(False, id="torchscript"), pytest.param(True, id="dynamo")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 tiny Llama with tied embeddings, saved as safetensors."""
    folder = save_tiny_llama(tmp_path_factory.mktemp("ckpt"), tied=True)
    assert [p.name for p in folder.glob("*.safetensors")] == ["model.safetensors"]
    return folder


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))


def _export(model: torch.nn.Module, locate: CheckpointLocator, dynamo: bool, out: Path) -> list:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    capture = capture_model(model, (_ids(),), hiera=[LlamaDecoderLayer], dynamo=dynamo)
    declared: list[tuple[Path, WeightSources]] = []
    export_units(
        model,
        capture,
        opset=TEST_OPSET,
        dynamo=dynamo,
        options=ExportOptions(functions="per_type"),
        out_dir=out,
        locate=locate,
        declare_sources=lambda path, sources: declared.append((path, sources)),
    )
    return declared


@pytest.mark.parametrize("auto_class", ["AutoModelForCausalLM", "AutoModel"])
def test_every_large_weight_is_placed(checkpoint: Path, auto_class: str) -> None:
    model = pretrained(str(checkpoint), auto_class=auto_class)
    locate = CheckpointLocator(model, checkpoint)
    index = read_weight_index(checkpoint)
    # AutoModel loads the base model: the checkpoint's "model." prefix is not in its names.
    assert ("model.norm.weight" in dict(model.named_parameters())) == (auto_class != "AutoModel")
    assert locate.refused == {}
    for name, p in model.named_parameters():
        if p.nbytes >= INLINE_LIMIT:
            where = locate(p)
            assert where is not None, name
            assert where.source == str((checkpoint / "model.safetensors").resolve())
            assert where.nbytes == p.nbytes
    stored = {(w.offset, w.nbytes) for w in locate.placed.values()}
    assert stored == {(t.offset, t.nbytes) for t in index.tensors.values()}
    assert locate(torch.zeros(16, 64)) is None  # another storage: not placed


def test_tied_weights_are_placed_under_the_stored_name(checkpoint: Path) -> None:
    model = pretrained(str(checkpoint), auto_class="AutoModelForCausalLM")
    index = read_weight_index(checkpoint)
    assert "lm_head.weight" not in index.tensors  # stored once, as the embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    embedding = index.tensors["model.embed_tokens.weight"]
    assert CheckpointLocator(model, checkpoint)(model.lm_head.weight) == (
        str((checkpoint / embedding.file).resolve()),
        embedding.offset,
        embedding.nbytes,
    )


@pytest.mark.parametrize("dynamo", PATHS)
def test_the_exported_weights_are_the_declared_ranges(
    checkpoint: Path, tmp_path: Path, dynamo: bool
) -> None:
    model = pretrained(str(checkpoint), auto_class="AutoModel")
    declared = _export(model, CheckpointLocator(model, checkpoint), dynamo, tmp_path)
    data = tmp_path / "units" / WEIGHTS_FILE
    assert [path for path, _ in declared] == [data]
    sources = file_sources(declared[0][1], data)
    assert sources is not None
    assert {p.source for p in sources.pieces} == {str((checkpoint / "model.safetensors").resolve())}
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert matching_digest(data, sources) == digest
    assert sources.digest == digest  # compared and hashed as written: the cache reads nothing


@pytest.mark.parametrize(
    "dynamo",
    [pytest.param(False, id="torchscript", marks=NEEDS_BFLOAT16_SDPA_MASK), PATHS[1]],
)
def test_a_model_loaded_in_another_dtype_places_nothing(
    checkpoint: Path, tmp_path: Path, dynamo: bool
) -> None:
    model = pretrained(str(checkpoint), auto_class="AutoModel", dtype="bfloat16")
    locate = CheckpointLocator(model, checkpoint)
    assert locate.placed == {}
    assert set(locate.refused.values()) == {"stored as F32, loaded as torch.bfloat16"}
    assert _export(model, locate, dynamo, tmp_path) == []
    assert (tmp_path / "units" / WEIGHTS_FILE).stat().st_size > 0
