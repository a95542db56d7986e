"""bench/make_checkpoint.py writes a checkpoint transformers and safetensors read as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from hyperexport.base import versions
from tests.helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_script("bench/make_checkpoint.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    # Shards of 40 kB: the tiny model's 214 kB spread over several files and an index.
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "make_checkpoint.py"),
            str(out),
            "--shape",
            "tiny",
            "--layers",
            "3",
            "--max-shard-gb",
            "0.00004",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["shards"] > 1 and figures["tensors"] == 1 + 3 * 9 + 2
    return out


def test_transformers_loads_every_tensor_as_written(checkpoint: Path) -> None:
    import transformers
    from safetensors import safe_open

    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, **{versions.dtype_keyword(): torch.bfloat16}
    )
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    with torch.device("meta"):
        expected = type(model)(config).state_dict()
    loaded = model.state_dict()
    assert {n: tuple(t.shape) for n, t in loaded.items()} == {
        n: tuple(t.shape) for n, t in expected.items()
    }
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(expected)
    for name, file in index["weight_map"].items():
        with safe_open(str(checkpoint / file), "pt") as f:
            stored = f.get_tensor(name)
        assert stored.dtype == torch.bfloat16
        assert torch.equal(stored, loaded[name]), name
    q = loaded["model.layers.0.self_attn.q_proj.weight"].float()
    assert 0.015 < q.std().item() < 0.025 and abs(q.mean().item()) < 0.005
    assert torch.equal(loaded["model.norm.weight"], torch.ones_like(loaded["model.norm.weight"]))
    assert not torch.equal(loaded["lm_head.weight"], loaded["model.embed_tokens.weight"])
    ids = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


def test_values_do_not_depend_on_the_shard_layout(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    writer = _load()
    config = writer.llama_config("tiny", num_hidden_layers=3)
    writer.write_checkpoint(tmp_path / "one", config)  # one shard
    one = load_file(str(tmp_path / "one" / "model-00001-of-00001.safetensors"))
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    for name, file in index["weight_map"].items():
        assert torch.equal(load_file(str(checkpoint / file))[name], one[name]), name


def test_a_chunked_tensor_matches_its_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor larger than a chunk is written in several chunks, all where the header says."""
    from safetensors.torch import load_file

    writer = _load()
    monkeypatch.setattr(writer, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(writer, "FLUSH_BYTES", 4096)
    config = writer.llama_config("tiny", num_hidden_layers=1)
    writer.write_checkpoint(tmp_path / "c", config)
    tensors = load_file(str(tmp_path / "c" / "model-00001-of-00001.safetensors"))
    embed = tensors["model.embed_tokens.weight"]  # 256 x 64: 17 chunks
    assert embed.shape == (256, 64)
    chunks = embed.reshape(-1).split(1000)
    assert len(chunks) == 17 and not torch.equal(chunks[0][:24], chunks[1][:24])


def test_a_non_empty_folder_is_refused(tmp_path: Path) -> None:
    writer = _load()
    (tmp_path / "x").write_text("keep")
    with pytest.raises(SystemExit, match="not empty"):
        writer.write_checkpoint(tmp_path, writer.llama_config("tiny"))
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
