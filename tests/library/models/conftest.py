from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LlamaForCausalLM saved with ``save_pretrained`` (nothing is downloaded)."""
    from hyperexport.zoo import tiny_llama

    path = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    tiny_llama(num_layers=2, causal_lm=True, seed=3).save_pretrained(path)
    return path
