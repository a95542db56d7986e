"""capture_inner_call: the arguments of an inner call during generate or the outer forward."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hyperexport import zoo
from hyperexport.base.errors import InputError
from hyperexport.base.versions import cache_keyword
from hyperexport.library.transformers.method_capture import capture_inner_call

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def causal_lm():
    return zoo.tiny_llama(num_layers=2, causal_lm=True)


def _ids() -> torch.Tensor:
    return torch.randint(1, 128, (1, 5), generator=torch.Generator().manual_seed(0))


def test_inner_forward_args_during_outer_forward(causal_lm):
    ids = _ids()
    args, kwargs = capture_inner_call(causal_lm, "model", lambda: causal_lm(input_ids=ids))
    assert "forward" not in vars(causal_lm.model)
    with torch.no_grad():
        replay = causal_lm.model(*args, **kwargs).last_hidden_state
        expected = causal_lm.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(replay, expected)
    assert torch.equal(kwargs["input_ids"], ids)


def test_decode_step_args_during_generate(causal_lm):
    ids = _ids()

    def generate():
        causal_lm.generate(ids, max_new_tokens=3, do_sample=False, use_cache=True, pad_token_id=0)

    _, kwargs = capture_inner_call(causal_lm, "model.forward", generate, call_index=1)
    assert kwargs["input_ids"].shape == (1, 1)
    cache = kwargs[cache_keyword()]  # past_key_values in transformers 4.57, cache in 5.x
    assert cache.get_seq_length() == 5
    assert "forward" not in vars(causal_lm.model)


def test_restored_when_run_raises(causal_lm):
    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        capture_inner_call(causal_lm, "model", boom)
    assert "forward" not in vars(causal_lm.model)


def test_missing_call_and_bad_path_are_input_errors(causal_lm):
    ids = _ids()
    with pytest.raises(InputError, match="call 5 was wanted"):
        capture_inner_call(causal_lm, "model", lambda: causal_lm(input_ids=ids), call_index=5)
    with pytest.raises(InputError, match="no attribute 'nope'"):
        capture_inner_call(causal_lm, "model.nope", lambda: None)


def _keys(cache: Any) -> torch.Tensor:
    """The first layer's keys: ``layers[0].keys`` where the cache has layers (transformers 4.57,
    5.x), ``key_cache[0]`` in 4.48.3 (whose ``DynamicCache`` is an ``nn.Module``)."""
    return cache.layers[0].keys if hasattr(cache, "layers") else cache.key_cache[0]


def test_arguments_with_autograd_history_are_copied_detached() -> None:
    """Outside no_grad, the inner call's arguments carry autograd history; deepcopy refuses
    those, so they are copied as detached clones (a cache object's tensors included)."""
    from transformers import DynamicCache

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = torch.nn.Linear(4, 4)
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
            h = self.pre(x)  # has grad_fn
            cache.update(h.unsqueeze(1), h.unsqueeze(1), 0)  # a cache holding non-leaf tensors
            return self.inner_call(h, cache)

        def inner_call(self, h: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
            return self.inner(h) + _keys(cache).sum()

    model = Outer()
    x = torch.randn(2, 4)
    args, kwargs = capture_inner_call(model, "inner_call", lambda: model(x, DynamicCache()))
    h, cache = args
    assert h.grad_fn is None and not h.requires_grad
    torch.testing.assert_close(h, model.pre(x).detach())
    keys = _keys(cache)
    assert keys.grad_fn is None
    torch.testing.assert_close(keys, h.unsqueeze(1))
    with torch.no_grad():
        torch.testing.assert_close(model.inner_call(*args, **kwargs), model(x, DynamicCache()))
