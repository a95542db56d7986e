"""Small real architectures with seeded random weights, for recipes, tests and benchmarks.

Nothing here downloads: every model is built from a small config. Each factory returns a model
in eval mode; the same arguments give bitwise-identical weights.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hyperexport.base import versions

log = logging.getLogger(__name__)

#: The recipe base of the encoder-decoder zoo (``recipes/base/seq2seq.yaml``): recipes built on
#: it export two graphs checked by decoding (tests/seq2seq), not one forward graph.
SEQ2SEQ_BASE = "/recipe_base: seq2seq"


def forward_zoo(recipes_dir: Any) -> list[str]:
    """The forward zoo's recipe names, sorted: ``zoo_*.yaml`` except the generation step models
    (``zoo_*_generate``, tests/generation) and the encoder-decoders (on :data:`SEQ2SEQ_BASE`)."""
    return sorted(
        p.stem
        for p in recipes_dir.glob("zoo_*.yaml")
        if not p.stem.endswith("_generate") and SEQ2SEQ_BASE not in p.read_text(encoding="utf-8")
    )


def seq2seq_zoo(recipes_dir: Any) -> list[str]:
    """The encoder-decoder zoo's recipe names, sorted (recipes on :data:`SEQ2SEQ_BASE`)."""
    return sorted(
        p.stem
        for p in recipes_dir.glob("zoo_*.yaml")
        if SEQ2SEQ_BASE in p.read_text(encoding="utf-8")
    )


#: Cohere on the TorchScript path, by how transformers builds masks
#: (:func:`~hyperexport.base.versions.masks_built_by_vmap`): 5.x (broadcast), 4.x (vmapped from
#: torch 2.6) and 4.x below torch 2.6 or before masking_utils (its rotary embedding's expand).
_COHERE_TORCHSCRIPT = (
    "torch.onnx.export(dynamo=False) of CohereModel itself gives a graph ONNX Runtime cannot "
    "run: with grouped-query attention the query is reshaped to the key's head count "
    "(Reshape of {2,16,64} to {2,16,2,16} in layers.0.self_attn); the dynamo path is fine"
)
_COHERE_TORCHSCRIPT_VMAPPED_MASKS = (
    "torch.onnx.export(dynamo=False) of CohereModel itself fails at export on transformers 4.x "
    "(RuntimeError: unordered_map::at, tracing its vmapped mask builder), and with hyperexport's "
    "traceable mask builder gives a graph ONNX Runtime cannot run ('invalid expand shape' in "
    "the Expand of rotary_emb); the dynamo path is fine"
)

_COHERE_TORCHSCRIPT_ROTARY_EXPAND = (
    "torch.onnx.export(dynamo=False) of CohereModel itself gives a graph ONNX Runtime cannot "
    "run: its rotary embedding expands to the traced batch ('invalid expand shape' in the "
    "Expand of rotary_emb; transformers before 5.19; below torch 2.5 it fails earlier, at export: "
    "on SDPA's scale, or first on transformers' in-place mask fix, aten::__ior_, where "
    "masking_utils builds the mask); the dynamo path is fine"
)


_RESNET_DYNAMO = (
    "torch.onnx.export(dynamo=True) of ResNet itself fails on this torch, translating an "
    "eval-mode batch norm (_native_batch_norm_legit_no_training: 'tuple' object has no "
    "attribute 'dtype'); the TorchScript path is fine"
)


def expected_failures(
    transformers: str | None = None, torch: str | None = None
) -> dict[tuple[str, bool], str]:
    """The zoo's expected failures on a transformers and torch release: ``(recipe, dynamo) ->
    why``.

    Each is a pair where torch's own plain export of the same model fails too
    (tests/library/zoo/test_fail_torch.py, tests/library/export/test_model_families.py); the
    condition on the release lives in :mod:`hyperexport.base.versions`.

    Args:
        transformers: A transformers release (``"4.57.6"``); the installed one when None.
        torch: A torch release (``"2.6.0"``); the installed one when None.
    """
    # (below torch 2.6, 4.x's masking_utils builds masks without vmap)
    if versions.masks_built_by_vmap(transformers) and not versions.masks_without_packed_sequences(
        torch, transformers
    ):
        cohere = _COHERE_TORCHSCRIPT_VMAPPED_MASKS
    elif versions.cohere_rotary_expands_to_batch(transformers):
        cohere = _COHERE_TORCHSCRIPT_ROTARY_EXPAND
    else:
        cohere = _COHERE_TORCHSCRIPT
    failures = {("zoo_cohere", False): cohere}
    if versions.dynamo_fails_eval_batch_norm(torch):
        failures[("zoo_resnet", True)] = _RESNET_DYNAMO
    return failures


#: The expected failures on the installed transformers and torch (:func:`expected_failures`): the zoo
#: tests mark each xfail (strict, so a fix shows up) and the README's table says why.
EXPECTED_FAILURES: dict[tuple[str, bool], str] = expected_failures()


def _seeded(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def tiny_llama(
    num_layers: int = 4,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 128,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    causal_lm: bool = False,
) -> torch.nn.Module:
    """A Llama decoder stack (``LlamaModel``, or ``LlamaForCausalLM``) with GQA."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    config = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=256,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    _seeded(seed)
    model = LlamaForCausalLM(config) if causal_lm else LlamaModel(config)
    return model.eval()


def tiny_qwen2(
    num_layers: int = 2, seed: int = 0, attn_implementation: str = "sdpa"
) -> torch.nn.Module:
    """A Qwen2 decoder stack (biased q/k/v projections) with GQA."""
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    _seeded(seed)
    return Qwen2Model(config).eval()


def tiny_gpt2(
    num_layers: int = 2, seed: int = 0, attn_implementation: str = "sdpa"
) -> torch.nn.Module:
    """A GPT-2 stack (fused qkv Conv1D, learned positions)."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(  # type: ignore[call-arg]
        vocab_size=128,
        n_embd=64,
        n_layer=num_layers,
        n_head=4,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    _seeded(seed)
    return GPT2Model(config).eval()


def tiny_bert(num_layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A BERT encoder stack."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    _seeded(seed)
    return BertModel(config, add_pooling_layer=False).eval()


def tiny_vit(num_layers: int = 2, image_size: int = 32, seed: int = 0) -> torch.nn.Module:
    """A ViT encoder (transformers' own) on small images."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=image_size,
        patch_size=8,
        num_channels=3,
    )
    _seeded(seed)
    return ViTModel(config, add_pooling_layer=False).eval()


def tiny_resnet(depths: tuple[int, ...] = (1, 1, 1, 1), seed: int = 0) -> torch.nn.Module:
    """A ResNet (transformers' own, since torchvision does not load beside the CPU torch)."""
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 48, 64],
        depths=list(depths),
        layer_type="basic",
    )
    _seeded(seed)
    model = ResNetModel(config).eval()
    # Random batch-norm statistics, so that BN is not an identity in parity checks.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                assert module.running_mean is not None and module.running_var is not None
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model


#: Small mixture-of-experts decoders: ``kind -> (model class, config fields)``; 4 experts, top-2.
MOE_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("MixtralModel", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "Qwen2MoeModel",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 96,
            "norm_topk_prob": False,
        },
    ),
    "olmoe": ("OlmoeModel", {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}),
}


def tiny_moe(kind: str, num_layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A small MoE decoder stack (:data:`MOE_CONFIGS`): hidden 64, GQA 4:2, vocabulary 128."""
    model_class, fields = MOE_CONFIGS[kind]
    config = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        **fields,
    }
    return random_transformer(model_class, config, seed=seed)


def random_transformer(
    model_class: str,
    config: dict[str, Any] | None = None,
    seed: int = 0,
    submodule: str | None = None,
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """Any transformers architecture from a small config, with seeded random weights.

    Args:
        model_class: A model class exported by ``transformers`` (``"LlamaModel"``); its
            ``config_class`` is built from ``config``.
        config: Config fields (small sizes); ``use_cache`` is always off.
        seed: Weight seed; batch-norm statistics are drawn from it too, so that BN is not an
            identity in parity checks.
        submodule: Return this submodule instead (``"encoder"`` of a Whisper model).
        attn_implementation: transformers' attention implementation (None: its default, sdpa
            where the architecture has it).
    """
    import transformers

    cls = getattr(transformers, model_class, None)
    if cls is None or not hasattr(cls, "config_class"):
        raise ValueError(f"transformers has no model class {model_class!r}")
    fields = dict(config or {})
    if attn_implementation is not None:
        fields["attn_implementation"] = attn_implementation
    cfg = cls.config_class(**fields)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    _seeded(seed)
    model = cls(cfg)
    _random_batch_norm(model)
    if submodule is not None:
        model = model.get_submodule(submodule)
    return model.eval()


def _random_batch_norm(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(
                module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)
            ):
                assert module.running_mean is not None and module.running_var is not None
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """A short JSON-able description (class, parameter count) for logs and reports."""
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "parameters": sum(p.numel() for p in model.parameters()),
    }


#: Real decoder shapes (random weights): ``name -> (family, config kwargs)``.
DECODER_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2_0_5b": (
        "qwen2",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
        ),
    ),
    "llama3_2_1b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
    ),
    "llama2_7b": (
        "llama",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        ),
    ),
}


def sized_decoder(
    shape: str,
    dtype: str = "float32",
    num_layers: int | None = None,
    seed: int = 0,
    attn_implementation: str = "sdpa",
) -> torch.nn.Module:
    """A decoder stack (``LlamaModel`` / ``Qwen2Model``) of a real model's shape, random weights.

    The model is built on the meta device and each parameter is then materialised directly in
    ``dtype`` and filled from one seeded generator (normal(0, 0.02); norm scales 1, biases 0), so a
    7B-shaped bf16 model never passes through a float32 copy (which alone would need ~27 GB).

    Args:
        shape: A key of :data:`DECODER_SHAPES` (``qwen2_0_5b``, ``llama3_2_1b``, ``llama2_7b``).
        dtype: ``float32``, ``float16`` or ``bfloat16``.
        num_layers: Fewer layers than the real model (tests); default: the real depth.
        seed: Seed of the weights.
        attn_implementation: transformers' attention implementation.
    """
    import transformers

    family, sizes = DECODER_SHAPES[shape]
    kwargs = dict(sizes)
    if num_layers is not None:
        kwargs["num_hidden_layers"] = num_layers
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaModel),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
    }[family]
    config = config_cls(  # type: ignore[operator]
        **kwargs,
        max_position_embeddings=4096,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    torch_dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = model_cls(config).to(torch_dtype)  # type: ignore[operator]
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
    # Non-persistent buffers (rotary frequencies) are computed at construction: make them again
    # on the CPU, in float32 as transformers keeps them.
    model.rotary_emb = type(model.rotary_emb)(config=config)
    log.info("built %s-shaped %s decoder (%s)", shape, family, dtype)
    return model.eval()
