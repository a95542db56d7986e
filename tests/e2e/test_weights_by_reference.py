"""A build from a safetensors checkpoint stores its export's weights by reference (issue 36):
the cache records ranges of the checkpoint instead of a second copy, so the build writes the
weights once; publishing from the cache alone assembles them again, byte-identical, and checked
in ONNX Runtime against torch as any build is."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.engine.store import CacheStore
from hyperexport.engine.verify import verify
from hyperexport.engine.workspace import ONE_COPY_MIN
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.checkpoints import save_tiny_llama
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH

HIT_ALL = dict.fromkeys(STAGE_NAMES, "hit")


def _checkpoint(directory: Path) -> Path:
    return save_tiny_llama(
        directory, tied=True, vocab_size=256, hidden_size=128, intermediate_size=256
    )


def _recipe(tmp_path: Path, checkpoint: Path, dynamo: bool) -> Path:
    recipe = tmp_path / "ckpt_forward.yaml"
    recipe.write_text(
        "# @package _global_\n"
        "name: ckpt_forward\n"
        f"model: {{_target_: hyperexport.models.pretrained, path: {checkpoint},"
        " auto_class: AutoModelForCausalLM}\n"
        "inputs: {input_ids: {shape: [1, 8], dtype: int64, low: 0, high: 256}}\n"
        "hiera: [transformers.models.llama.modeling_llama.LlamaDecoderLayer]\n"
        f"functions: per_type\nexternal_data: true\ndynamo: {str(dynamo).lower()}\n"
    )
    return recipe


def _build(tmp_path: Path, recipe: Path) -> Any:
    composed, settings = compose_recipe(
        [f"build.cache_dir={tmp_path / 'cache'}", f"build.outputs_dir={tmp_path / 'out'}"],
        recipe_file=recipe,
    )
    return run_build(composed, settings, stages=PIPELINE, load_model=model_loader(composed))


def _large_files(root: Path) -> list[Path]:
    return [
        Path(d, n)
        for d, _, names in os.walk(root)
        for n in names
        if stat.S_ISREG(os.lstat(Path(d, n)).st_mode)
        and os.lstat(Path(d, n)).st_size >= ONE_COPY_MIN
    ]


def _published_data(tmp_path: Path) -> Path:
    (data,) = (tmp_path / "out" / "ckpt_forward").glob("default/model.onnx.data")
    return data


@pytest.mark.parametrize("dynamo", [False, pytest.param(True, marks=NEEDS_DYNAMO_PATH)])
def test_the_weights_are_written_once_and_published_again_from_the_checkpoint(
    tmp_path: Path, dynamo: bool, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = _checkpoint(tmp_path / "ckpt")
    recipe = _recipe(tmp_path, checkpoint, dynamo)
    with caplog.at_level(logging.INFO):
        first = _build(tmp_path, recipe)
    assert first.exit_code == 0, first.result.error
    # Where the rewrite appends to the export's weights (TorchScript's folded rotary constant,
    # with the transformers releases that fold it) it takes the build's copy of them over,
    # since evaluate and check read only the export's reference capture; where it appends
    # nothing it links them. Never a copy.
    took = "took over the export's weight file" in caplog.text
    linked = "(the export's weight file: linked; 0 tensors appended)" in caplog.text
    assert "copied the export's weight file" not in caplog.text
    assert took != linked
    data = _published_data(tmp_path)
    size, digest = data.stat().st_size, hashlib.sha256(data.read_bytes()).hexdigest()
    assert size >= ONE_COPY_MIN

    store = CacheStore(tmp_path / "cache")
    export = first.result.entries["export"]
    (weights,) = [f for f in export.outputs if f.path.endswith("weights.data")]
    assert store.ref_path(weights.digest).is_file()
    assert not store.blob_path(weights.digest).exists()
    # The cache holds no copy of the weights: the published file is the build's one copy.
    assert [p for p in _large_files(tmp_path / "cache") if p.stat().st_size == size] == []
    # The rewrite's data file (the export's weights and the passes' small tensors after them,
    # TorchScript's folded rotary constant) is recorded too: the export's ranges and its tail.
    assert first.result.entries["rewrite"].digests()["model.onnx.data"] == digest
    assert store.ref_path(digest).is_file() or digest == weights.digest

    # Publishing again from the cache alone assembles the bytes from the checkpoint.
    data.unlink()
    again = _build(tmp_path, recipe)
    assert again.exit_code == 0, again.result.error
    assert {s.name: s.status for s in again.result.stages} == HIT_ALL
    assert hashlib.sha256(_published_data(tmp_path).read_bytes()).hexdigest() == digest
    assert verify(store, PIPELINE).ok


def test_a_changed_checkpoint_file_never_serves_a_stale_record(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "ckpt")
    recipe = _recipe(tmp_path, checkpoint, dynamo=False)
    assert _build(tmp_path, recipe).exit_code == 0
    records = len(list(CacheStore(tmp_path / "cache").ref_paths()))
    assert records >= 1  # the export's weights (and the rewrite's data file, where it appends)
    # Other weights of the same architecture: new keys, the build runs and publishes their bytes.
    _checkpoint_with_seed(checkpoint, seed=1)
    rebuilt = _build(tmp_path, recipe)
    assert rebuilt.exit_code == 0, rebuilt.result.error
    assert {s.name: s.status for s in rebuilt.result.stages}["export"] == "ran"
    # The first build's records (the export's weights, and the rewrite's data file where it
    # holds those weights plus the passes' tensors) name ranges whose bytes changed: verify
    # drops them, and the entries that named them.
    result = verify(CacheStore(tmp_path / "cache"), PIPELINE)
    assert result.corrupt_blobs == records
    assert sum("(by reference): its sources now hash to" in p for p in result.problems) == records
    assert result.dropped_entries >= records


def _checkpoint_with_seed(directory: Path, seed: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(seed)
    # Every tensor's bytes change; the values stay near the model's own (unit-normal weights
    # everywhere drove torch 2.2.2's logits past the check's tolerance on one machine).
    changed = {
        k: (v.float() + 0.02 * torch.randn(v.shape, generator=generator)).to(v.dtype)
        for k, v in tensors.items()
    }
    save_file(changed, path, metadata={"format": "pt"})
