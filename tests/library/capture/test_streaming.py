"""A capture with streamed weights equals the capture of the loaded model, bit for bit.

The streamed model is built with every parameter on the meta device; hiera instances get their
weights from the mapped checkpoint only while they run (``capture/streaming.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from hyperexport import zoo
from hyperexport.base import versions
from hyperexport.base.contracts.weight_index import read_weight_index
from hyperexport.library import progress
from hyperexport.library.api import capture_model
from hyperexport.library.capture.container import Capture
from hyperexport.library.capture.streaming import (
    MappedCheckpoint,
    StreamedWeights,
    StreamingError,
    attach_checkpoint,
    is_stand_in,
    parameters_on_meta,
    stand_in,
    streamed_run,
)


def _ids(vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (1, 8), generator=torch.Generator().manual_seed(0))


def _assert_same(eager: Capture, streamed: Capture) -> None:
    assert eager.record == streamed.record
    assert set(eager.arrays) == set(streamed.arrays)
    for key, array in eager.arrays.items():
        other = streamed.arrays[key]
        assert array.dtype == other.dtype and np.array_equal(array, other), key


def _streamed(
    folder: Path, build: Callable[[], torch.nn.Module], hiera: tuple[type, ...]
) -> tuple[torch.nn.Module, StreamedWeights]:
    with parameters_on_meta():
        model = build().eval()
    assert all(p.is_meta for p in model.parameters())
    weights = StreamedWeights(model, MappedCheckpoint(folder, read_weight_index(folder)), hiera)
    weights.bind_outside()
    return model, weights


def _llama_checkpoint(folder: Path, dtype: torch.dtype, tied: bool = False) -> None:
    model = zoo.tiny_llama(num_layers=2, causal_lm=True)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()
    model.to(dtype).save_pretrained(folder)


def _llama_from(folder: Path, dtype: torch.dtype) -> Callable[[], torch.nn.Module]:
    from transformers import AutoConfig, AutoModelForCausalLM

    def build() -> torch.nn.Module:
        config = AutoConfig.from_pretrained(folder)
        config.use_cache = False
        return AutoModelForCausalLM.from_config(config, **{versions.dtype_keyword(): dtype})

    return build


def _eager_llama(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, **{versions.dtype_keyword(): dtype})
    model.config.use_cache = False
    return model.eval()


def _layer() -> type:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return LlamaDecoderLayer


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize(
    ("stored", "loaded", "tied"),
    [
        (torch.bfloat16, torch.bfloat16, False),
        (torch.bfloat16, torch.float32, False),
        (torch.float32, torch.float32, True),
    ],
    ids=["bf16", "bf16-as-f32", "tied"],
)
def test_streamed_llama_capture_is_bitwise_the_loaded_ones(
    tmp_path: Path, dynamo: bool, stored: torch.dtype, loaded: torch.dtype, tied: bool
) -> None:
    _llama_checkpoint(tmp_path, stored, tied)
    expected = capture_model(
        _eager_llama(tmp_path, loaded), (_ids(),), hiera=[_layer()], dynamo=dynamo
    )
    model, weights = _streamed(tmp_path, _llama_from(tmp_path, loaded), (_layer(),))
    if tied:
        assert weights.stored_name("lm_head.weight") == "model.embed_tokens.weight"
    with weights.hooks():
        streamed = capture_model(model, (_ids(),), hiera=[_layer()], dynamo=dynamo)
    _assert_same(expected, streamed)
    assert weights.calls == 2 and weights.bound_bytes == 0
    # Afterwards every layer parameter is on the meta device again.
    assert all(p.is_meta for p in model.model.layers.parameters())
    layer_bytes = sum(p.numel() for p in model.model.layers[0].parameters()) * stored.itemsize
    assert weights.bound_peak == layer_bytes


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.inner = Inner()
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(self.norm(x))) + x


class Nested(torch.nn.Module):
    def __init__(self, peek: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList([Outer(), Outer()])
        self.peek = peek

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        if self.peek:  # reads a hiera instance's weight outside its call
            h = h * self.blocks[0].out.weight.sum()
        return h


def _nested_checkpoint(folder: Path, peek: bool = False) -> Nested:
    torch.manual_seed(0)
    model = Nested(peek).eval()
    save_file(model.state_dict(), folder / "model.safetensors")
    return model


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_nested_hiera_instances_bind_only_their_own(tmp_path: Path, dynamo: bool) -> None:
    eager = _nested_checkpoint(tmp_path)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    expected = capture_model(eager, (x,), hiera=[Outer, Inner], dynamo=dynamo)
    model, weights = _streamed(tmp_path, Nested, (Outer, Inner))
    seen: list[tuple[bool, bool]] = []

    def record(module: torch.nn.Module, args: object) -> None:  # inside blocks.0.inner's call
        seen.append((module.proj.weight.is_meta, model.blocks[0].out.weight.is_meta))

    handle_hooks = weights.hooks()
    with handle_hooks:
        model.blocks[0].inner.register_forward_pre_hook(record)
        streamed = capture_model(model, (x,), hiera=[Outer, Inner], dynamo=dynamo)
    _assert_same(expected, streamed)
    # The inner instance's pre-hook runs after the streaming one: both levels are bound then.
    assert seen and seen[0] == (False, False)
    assert weights.calls == 4
    assert all(p.is_meta for p in model.blocks.parameters())
    assert not model.embed.weight.is_meta


def test_a_weight_read_outside_its_module_fails_loudly(tmp_path: Path) -> None:
    _nested_checkpoint(tmp_path, peek=True)
    model, weights = _streamed(tmp_path, lambda: Nested(peek=True), (Outer,))
    x = torch.randn(2, 4)
    with weights.hooks(), pytest.raises(Exception, match="meta"):
        capture_model(model, (x,), hiera=[Outer], dynamo=False)
    assert weights.bound_bytes == 0  # released although the call raised


def test_bound_binds_one_instance_for_the_duration(tmp_path: Path) -> None:
    _nested_checkpoint(tmp_path)
    model, weights = _streamed(tmp_path, Nested, (Outer, Inner))
    with weights.bound("blocks.1") as block:
        assert block is model.blocks[1]
        assert not block.out.weight.is_meta and block.inner.proj.weight.is_meta
        assert model.blocks[0].out.weight.is_meta
        block.out(torch.ones(1, 8))  # re-entry inside the bound scope keeps it bound
        assert not block.out.weight.is_meta
    assert block.out.weight.is_meta


def test_one_program_binds_the_units_and_stands_in_for_the_rest(tmp_path: Path) -> None:
    _nested_checkpoint(tmp_path)
    model, weights = _streamed(tmp_path, Nested, (Outer, Inner))
    block_bytes = sum(p.numel() * p.element_size() for p in Outer().parameters())
    inner_bytes = sum(p.numel() * p.element_size() for p in Inner().parameters())
    # The units of one program: the root, blocks.0 (its body) and blocks.0.inner (its child's).
    with weights.bound_with_stand_ins(["", "blocks.0", "blocks.0.inner"]):
        first, second = model.blocks
        assert not first.out.weight.is_meta and not is_stand_in(first.out.weight)
        assert not first.inner.proj.weight.is_meta and not is_stand_in(first.inner.proj.weight)
        for weight in (second.out.weight, second.norm.weight, second.inner.proj.weight):
            assert is_stand_in(weight) and not weight.is_meta
        assert second.out.weight.shape == first.out.weight.shape
        assert second.out.weight.dtype == first.out.weight.dtype
        assert weights.bound_bytes == block_bytes  # blocks.0 with its inner: one block's bytes
        # A stand-in mixes with real inputs (the exporter's need) and computes zeros.
        assert torch.count_nonzero(second.out(torch.ones(1, 8))) == 0
    assert all(p.is_meta for p in model.blocks.parameters())
    assert weights.bound_bytes == 0 and block_bytes > inner_bytes > 0
    assert not model.embed.weight.is_meta  # outside: bound for the object's life


def test_mismatches_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    model = _nested_checkpoint(tmp_path)
    state = model.state_dict()
    index_of = lambda: read_weight_index(tmp_path)  # noqa: E731
    for broken, message in [
        (
            {k: v for k, v in state.items() if k != "blocks.1.out.bias"},
            "'blocks.1.out.bias'.*does not",
        ),
        ({**state, "extra.weight": torch.zeros(2)}, "'extra.weight'.*no such weight"),
        ({**state, "embed.bias": torch.zeros(3)}, r"'embed.bias'.*shape \[3\]"),
    ]:
        save_file(broken, tmp_path / "model.safetensors")
        with parameters_on_meta():
            skeleton = Nested()
        with pytest.raises(StreamingError, match=message):
            StreamedWeights(skeleton, MappedCheckpoint(tmp_path, index_of()), (Outer,))


def test_stand_ins_hold_one_element() -> None:
    tensor = stand_in((128, 64), torch.bfloat16)
    assert tensor.shape == (128, 64) and tensor.dtype == torch.bfloat16
    assert is_stand_in(tensor) and tensor.untyped_storage().nbytes() == 2
    assert not is_stand_in(torch.zeros(128, 64)) and not is_stand_in(torch.zeros(1).expand(1))


def test_a_streamed_run_reports_each_instance_with_the_memory_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _llama_checkpoint(tmp_path, torch.bfloat16)
    with parameters_on_meta():
        model = _llama_from(tmp_path, torch.bfloat16)().eval()
    attach_checkpoint(model, MappedCheckpoint(tmp_path, read_weight_index(tmp_path)))
    monkeypatch.setenv("HYPEREXPORT_PROGRESS", "lines")
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    caplog.set_level(logging.INFO, logger=progress.__name__)
    with streamed_run(model, [_layer()]), torch.no_grad():
        model(_ids())
        model(_ids())  # a second pass binds nothing new
    lines = [r.getMessage() for r in caplog.records if r.name == progress.__name__]
    assert [line.split(",")[0] for line in lines[:2]] == [
        "running hiera instances: 1 instances of 2 instances (50%)",
        "running hiera instances: 2 instances of 2 instances (100%)",
    ]
    assert len(lines) == 3 and all(
        " MiB anonymous" in line or " GiB anonymous" in line for line in lines
    )
