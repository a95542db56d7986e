"""The TorchScript path's capture leaves no weight behind once the model is dropped.

torch keeps the graph of every traced function in its global compilation unit for the rest of
the process; a weight that entered such a graph as a constant outlived its model (and, for a
checkpoint loaded by memory map, kept the whole mapped file resident).
"""

from __future__ import annotations

import gc
import weakref

import torch

from hyperexport.library.capture.capture_model import capture_model
from hyperexport.library.capture.jit_trace import model_tensors
from tests.helpers.toys import Leaf, toy_inputs, toy_net


def _captured_and_dropped(dynamo: bool) -> list[weakref.ref[torch.Tensor]]:
    model = toy_net()
    refs = [weakref.ref(t) for t in model_tensors(model)]
    x, gate = toy_inputs()
    capture_model(model, (x,), {"gate": gate}, hiera=[Leaf], dynamo=dynamo)
    del model
    gc.collect()
    return refs


def test_no_weight_outlives_the_model_after_a_torchscript_capture() -> None:
    refs = _captured_and_dropped(dynamo=False)
    assert refs, "the toy model has weights"
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"{len(alive)} of {len(refs)} weights still referenced after the capture"


def test_model_tensors_names_a_tied_weight_once() -> None:
    embedding = torch.nn.Embedding(4, 3)
    head = torch.nn.Linear(3, 4, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    assert len(model_tensors(model)) == 1
