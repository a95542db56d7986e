"""A seeded tiny Llama's generation step (``CausalLMStep``), exported with ``rewrite.fuse:
onnxruntime`` on the TorchScript path: what the fused step's passes are tested on."""

from __future__ import annotations

from pathlib import Path

LAYERS, HIDDEN, HEADS, KV_HEADS, CONTEXT, VOCAB = 2, 64, 4, 2, 96, 128


def export_fused_step(folder: Path, context_length: int) -> Path:
    """The fused step at ``folder/step_<context_length>.onnx`` (``context_length`` 0: no rotary
    tables)."""
    from hyperexport import AttentionOptions, ExportOptions, RewriteOptions, export_hyper_onnx
    from hyperexport.library.models.inputs import make_inputs
    from hyperexport.library.tasks.causal_lm import step_inputs
    from hyperexport.library.tasks.steps import CausalLMStep
    from hyperexport.library.zoo import random_transformer
    from hyperexport.transformers.kv_layers import KVStep, explicit_kv_layers

    model = random_transformer(
        "LlamaForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            max_position_embeddings=CONTEXT,
        ),
        seed=0,
    )
    specs = step_inputs(model.config.to_dict(), "float32")
    options = ExportOptions(
        functions="per_type",
        probe_shapes=tuple((n, tuple(s["check_shape"])) for n, s in specs.items()),
        attention=AttentionOptions("hyperexport"),
        rewrite=RewriteOptions(fuse="onnxruntime"),
        context_length=context_length,
    )
    path = folder / f"step_{context_length}.onnx"
    with explicit_kv_layers(model):
        export_hyper_onnx(
            CausalLMStep(model).eval(),
            (make_inputs(specs),),
            str(path),
            hiera=[KVStep],
            dynamo=False,
            dynamic_axes={n: dict(s["dynamic"]) for n, s in specs.items()},
            options=options,
        )
    return path
