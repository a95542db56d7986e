"""pytest plugin: run HyperONNX's own tests against ``hyperexport.compat.hyperonnx``.

Loaded with ``-p hyperonnx_alias`` in the subprocess that :mod:`tests.compat.test_hyperonnx_suite`
starts on HyperONNX's published tests. Every adaptation lives here, none in their files:

1. ``hyperonnx`` and its submodules (``hyperonnx.transformers``,
   ``hyperonnx.transformers.attention``, ``.cache``, ``.patch``, ``hyperonnx.auto``,
   ``hyperonnx.hyper_export``, ``hyperonnx.utils``) are aliases of the compatibility module; no
   package named ``hyperonnx`` is installed.
2. ``torchvision`` (which does not work with this torch build) is a stand-in module whose
   ``models.resnet18`` / ``models.vit_b_16`` are transformers' ResNet and ViT at the same shapes
   (ResNet-18: basic blocks, depths 2-2-2-2, widths 64-512, 1000 classes; ViT-B/16: 224 px,
   patch 16, 12 layers of width 768, 12 heads, MLP 3072, 1000 classes), with seeded random
   weights, built on first use. ``BasicBlock``/``Bottleneck``/``EncoderBlock`` are
   stateless subclasses of transformers' ``ResNetBasicLayer``/``ResNetBottleNeckLayer``/
   ``ViTLayer`` carrying torchvision's names (the model's blocks are retyped to them, so the
   function names the tests look for are torchvision's); ``ResNet`` is the model class and
   ``Encoder`` a module holding the ViT layers and the final norm (transformers has no encoder
   class). Both models return the logits tensor and take ``x``, as torchvision's do.
3. ``torch.onnx._constants.ONNX_MAX_OPSET`` reads 20 (the TorchScript exporter's maximum on
   torch 2.13): HyperONNX's attention test exports with ``dynamo=False`` at that constant,
   which on torch 2.13 is 23, beyond what the TorchScript exporter accepts (its dynamo=True
   case then also exports at 20).
4. Tests listed in :data:`EXCLUDED` (and, for one release's tests, ``EXCLUDED_IN_RELEASE``,
   keyed by ``HYPERONNX_RELEASE``) are skipped with their reason.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
import types
from typing import Any

import pytest
import torch
from torch import nn

_BEAMS = (
    "HyperONNX's StaticCache.reorder_cache reorders the layer axis; hyperexport's reorders the "
    "batch (beam) axis, as transformers' reorder_cache does (beam_idx has one entry per beam)"
)

#: ``test id substring -> reason``: HyperONNX tests whose expectation hyperexport does not meet
#: on purpose, or that test HyperONNX's internals.
EXCLUDED: dict[str, str] = {
    "test_export_vit_with_encoder_and_encoderblock": (
        "counts HyperONNX's files in external_directory (15, one per module) and 4 function "
        "types; hyperexport keeps one file per exported unit under units/, and its folded "
        "leftover functions are all of type 'Leftover' (3 types); the export itself matches "
        "torch in ONNX Runtime"
    ),
    "test_export_module_with_2_levels": (
        "counts 3 function types: HyperONNX also folds the nodes between calls inside a "
        "function body (ModuleLvl1's Conv head) into a function of their own; hyperexport's "
        "fold_leftovers folds the main graph only (the export itself matches ORT: "
        "tests/library/compat/test_hyperonnx_api.py)"
    ),
    "TestReorderCache::test_reorders_layers_when_data_present": _BEAMS,
    "TestReorderCache::test_identity_reorder_leaves_cache_unchanged": _BEAMS,
}


_LAYOUT = (
    "HyperONNX 1.0.x returned attention_interface's output as (batch, heads, seq, dim); 2.0.x, "
    "which the compatibility module follows, returns transformers' (batch, seq, heads, dim)"
)

#: Exclusions that apply to the tests of one HyperONNX release only (``HYPERONNX_RELEASE``).
EXCLUDED_IN_RELEASE: dict[str, dict[str, str]] = {
    "1.0.3": {
        "test_attention.py::test_attention_opset24_forward": _LAYOUT,
        "test_attention.py::test_attention_function_supports_gqa": _LAYOUT,
    },
}


def _alias_hyperonnx() -> None:
    from hyperexport.library.compat import hyperonnx

    for name in (
        "hyperonnx",
        "hyperonnx.transformers",
        "hyperonnx.transformers.attention",
        "hyperonnx.transformers.cache",
        "hyperonnx.transformers.patch",
        "hyperonnx.auto",
        "hyperonnx.hyper_export",
        "hyperonnx.utils",
    ):
        sys.modules[name] = hyperonnx


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


class ResNet(nn.Module):
    """transformers' ResNet-18-shaped classifier; returns the logits tensor."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import ResNetConfig
        from transformers.models.resnet.modeling_resnet import ResNetForImageClassification

        config = ResNetConfig(
            layer_type="basic",
            depths=[2, 2, 2, 2],
            hidden_sizes=[64, 128, 256, 512],
            embedding_size=64,
            num_labels=1000,
        )
        self.net = ResNetForImageClassification(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=x).logits


class Encoder(nn.Module):
    """The ViT layers and the final norm (torchvision's ``Encoder`` without the embeddings)."""

    def __init__(self, layers: nn.ModuleList, norm: nn.Module) -> None:
        super().__init__()
        self.layers = layers
        self.ln = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.ln(x)


class VisionTransformer(nn.Module):
    """transformers' ViT-B/16-shaped classifier; returns the logits tensor."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import ViTConfig
        from transformers.models.vit.modeling_vit import ViTModel

        config = ViTConfig(
            image_size=224,
            patch_size=16,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            attn_implementation="eager",
        )
        vit = ViTModel(config, add_pooling_layer=False)
        self.embeddings = vit.embeddings
        self.encoder = Encoder(vit.layers, vit.layernorm)
        self.heads = nn.Linear(768, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.encoder(self.embeddings(x))[:, 0])


def _renamed(base: type, name: str) -> type:
    """A subclass of ``base`` named as torchvision's class, with no state of its own."""
    return type(name, (base,), {"__module__": __name__})


def _retype(model: nn.Module, renames: dict[type, type]) -> None:
    """Give the stand-in's blocks torchvision's class names (the function names follow)."""
    for module in model.modules():
        if type(module) in renames:
            module.__class__ = renames[type(module)]


@functools.cache
def _torchvision() -> types.ModuleType:
    from transformers.models.resnet.modeling_resnet import ResNetBasicLayer, ResNetBottleNeckLayer
    from transformers.models.vit.modeling_vit import ViTLayer

    basic = _renamed(ResNetBasicLayer, "BasicBlock")
    bottleneck = _renamed(ResNetBottleNeckLayer, "Bottleneck")
    block = _renamed(ViTLayer, "EncoderBlock")

    def resnet18(**_: Any) -> ResNet:
        _seeded(0)
        model = ResNet()
        _retype(model, {ResNetBasicLayer: basic, ResNetBottleNeckLayer: bottleneck})
        return model

    def vit_b_16(**_: Any) -> VisionTransformer:
        _seeded(0)
        model = VisionTransformer()
        _retype(model, {ViTLayer: block})
        return model

    root = types.ModuleType("torchvision")
    models = types.ModuleType("torchvision.models")
    resnet = types.ModuleType("torchvision.models.resnet")
    vision = types.ModuleType("torchvision.models.vision_transformer")
    resnet.ResNet, resnet.BasicBlock, resnet.Bottleneck = (  # type: ignore[attr-defined]
        ResNet,
        basic,
        bottleneck,
    )
    resnet.resnet18 = resnet18  # type: ignore[attr-defined]
    vision.Encoder, vision.EncoderBlock = Encoder, block  # type: ignore[attr-defined]
    vision.vit_b_16 = vit_b_16  # type: ignore[attr-defined]
    models.resnet, models.vision_transformer = resnet, vision  # type: ignore[attr-defined]
    models.resnet18, models.vit_b_16 = resnet18, vit_b_16  # type: ignore[attr-defined]
    root.models = models  # type: ignore[attr-defined]
    return root


class _LazyModule(types.ModuleType):
    """A stand-in module whose names are built on first use (transformers' ResNet and ViT
    modules take seconds to import; most of HyperONNX's test files never touch them)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        built = _torchvision()
        module = built
        for part in self.__name__.split(".")[1:]:
            module = getattr(module, part)
        return getattr(module, name)


def pytest_configure(config: pytest.Config) -> None:
    _alias_hyperonnx()
    for name in (
        "torchvision",
        "torchvision.models",
        "torchvision.models.resnet",
        "torchvision.models.vision_transformer",
    ):
        stand_in = _LazyModule(name)
        # A spec without a loader, so that importlib.util.find_spec answers (transformers 4.57
        # asks it at import, and raises ValueError on a module whose __spec__ is None); with no
        # distribution metadata, transformers then counts torchvision as not installed.
        stand_in.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = stand_in
    import torch.onnx._constants as constants

    constants.ONNX_MAX_OPSET = 20  # type: ignore[misc]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    release = os.environ.get("HYPERONNX_RELEASE", "")
    excluded = {**EXCLUDED, **EXCLUDED_IN_RELEASE.get(release, {})}
    for item in items:
        for key, reason in excluded.items():
            if key in item.nodeid:
                item.add_marker(pytest.mark.skip(reason=f"hyperexport differs: {reason}"))
