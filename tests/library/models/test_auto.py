"""``hiera: auto`` and ``inputs: auto`` on real transformers architectures (tiny configs, no export)."""

from __future__ import annotations

from typing import Any

import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.library.models.auto import auto_hiera, auto_inputs, resolve_auto
from hyperexport.zoo import random_transformer

TEXT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
WHISPER = {
    "vocab_size": 64,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_mel_bins": 8,
    "max_source_positions": 12,
    "max_target_positions": 16,
    "pad_token_id": 0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "decoder_start_token_id": 0,
}


def _short(paths: tuple[str, ...]) -> list[str]:
    return [p.rsplit(".", 1)[-1] for p in paths]


@pytest.mark.parametrize(
    ("model_class", "config", "submodule", "expected"),
    [
        # BERT declares its embeddings (never in a ModuleList) and the layer.
        ("BertModel", {**TEXT, "intermediate_size": 64}, None, ["BertLayer"]),
        # Whisper's hint lists a decoder layer that never runs in its encoder.
        ("WhisperModel", WHISPER, "encoder", ["WhisperEncoderLayer"]),
        # T5's block holds a ModuleList of sub-layers with as many calls: the hinted block wins.
        (
            "T5EncoderModel",
            {
                "vocab_size": 64,
                "d_model": 32,
                "d_kv": 8,
                "d_ff": 64,
                "num_layers": 2,
                "num_heads": 2,
            },
            None,
            ["T5Block"],
        ),
        # wav2vec2 declares nothing; its conv feature layers tie on calls, the encoder layers
        # are the larger blocks.
        (
            "Wav2Vec2Model",
            {
                **TEXT,
                "intermediate_size": 64,
                "conv_dim": (8, 8),
                "conv_stride": (5, 4),
                "conv_kernel": (10, 4),
                "num_conv_pos_embeddings": 8,
                "num_conv_pos_embedding_groups": 2,
            },
            None,
            ["Wav2Vec2EncoderLayer"],
        ),
    ],
)
def test_auto_hiera_picks_the_repeated_stack_that_runs(
    model_class: str, config: dict[str, Any], submodule: str | None, expected: list[str]
) -> None:
    model = random_transformer(model_class, config, submodule=submodule)
    specs, _ = auto_inputs(model, dynamic=False)
    classes, reason = auto_hiera(model, specs)
    assert _short(classes) == expected
    assert expected[0] in reason and "calls from nn.ModuleList" in reason


def test_auto_hiera_on_a_model_without_blocks_names_the_field() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    spec = {"x": {"shape": [2, 4], "dtype": "float32", "low": 0.0, "high": 1.0, "seed": 0}}
    with pytest.raises(RecipeError) as info:
        resolve_auto(
            {"inputs": spec, "hiera": "auto"},
            _Wrapped(model),
            "/r/recipe.yaml",
        )
    assert info.value.field == "hiera" and info.value.recipe == "/r/recipe.yaml"
    assert "no repeated blocks" in info.value.reason and "\n" not in str(info.value)


class _Wrapped:
    """A module whose forward takes ``x`` by keyword (as recipe inputs are passed)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def named_modules(self) -> Any:
        return self.inner.named_modules()

    def forward(self, x: Any) -> Any:
        return self.inner(x)


def test_text_inputs_stay_in_the_vocabulary_with_a_mask_and_dynamic_dims() -> None:
    from hyperexport.library.models.inputs import make_inputs

    model = random_transformer("BertModel", {**TEXT, "intermediate_size": 64})
    specs, reason = auto_inputs(model, dynamic=True)
    assert set(specs) == {"input_ids", "attention_mask"}
    tensors = make_inputs(specs)
    ids = tensors["input_ids"]
    assert int(ids.min()) >= 0 and int(ids.max()) < 100 and ids.shape[0] >= 2 and ids.shape[1] >= 2
    assert bool((tensors["attention_mask"] == 1).all())
    assert specs["input_ids"]["dynamic"] == {0: "batch", 1: "sequence"}
    assert specs["input_ids"]["check_shape"] != specs["input_ids"]["shape"]
    assert "vocab_size" in reason


def test_whisper_features_have_the_fixed_length_and_no_dynamic_sequence() -> None:
    model = random_transformer("WhisperModel", WHISPER, submodule="encoder")
    specs, _ = auto_inputs(model, dynamic=True)
    spec = specs["input_features"]
    assert spec["shape"][1:] == [8, 24]  # num_mel_bins, 2 x max_source_positions
    assert spec["dynamic"] == {0: "batch"}


def test_vision_and_audio_inputs_follow_the_config() -> None:
    vit = random_transformer(
        "ViTModel",
        {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "image_size": 24,
            "patch_size": 8,
            "num_channels": 2,
        },
    )
    specs, _ = auto_inputs(vit, dynamic=True)
    assert specs["pixel_values"]["shape"] == [2, 2, 24, 24]
    assert specs["pixel_values"]["dynamic"] == {0: "batch"}
    static, _ = auto_inputs(vit, dynamic=False)
    assert static["pixel_values"]["dynamic"] == {} and static["pixel_values"]["check_shape"] is None


def test_a_config_without_the_field_needed_names_it() -> None:
    from types import SimpleNamespace

    model = random_transformer("BertModel", {**TEXT, "intermediate_size": 64})
    model.config = SimpleNamespace(hidden_size=32)  # a config without vocab_size
    with pytest.raises(RecipeError) as info:
        resolve_auto({"inputs": "auto", "hiera": ["x.Y"]}, model, "/r/recipe.yaml")
    assert info.value.field == "inputs" and "vocab_size" in info.value.reason


def test_resolution_is_written_for_the_report(tmp_path: Any) -> None:
    import json

    model = random_transformer("BertModel", {**TEXT, "intermediate_size": 64})
    params = resolve_auto(
        {"inputs": "auto", "hiera": "auto", "dynamic": "auto"}, model, "r.yaml", tmp_path
    )
    assert _short(tuple(params["hiera"])) == ["BertLayer"]
    record = json.loads((tmp_path / "auto.json").read_text())
    assert record["hiera"] == params["hiera"] and "BertLayer" in record["hiera_reason"]
    assert set(record["inputs"]) == {"input_ids", "attention_mask"}


def test_auto_hiera_takes_the_encoder_and_decoder_stacks_and_says_why() -> None:
    from hyperexport.library.models.auto import hiera_choice

    bart = {
        "vocab_size": 64,
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "max_position_embeddings": 32,
    }
    model = random_transformer("BartModel", bart)
    specs, _ = auto_inputs(model, dynamic=False)
    assert set(specs) == {"input_ids", "attention_mask", "decoder_input_ids"}
    classes, reason, candidates = hiera_choice(model, specs)
    assert _short(classes) == ["BartEncoderLayer", "BartDecoderLayer"]  # in the order they run
    assert [c["calls"] for c in candidates] == [2, 1] and all(c["chosen"] for c in candidates)
    # BartAttention; older releases name it by implementation (4.48.3: BartSdpaAttention)
    attention = type(model.encoder.layers[0].self_attn).__name__
    assert attention.startswith("Bart") and attention.endswith("Attention")
    assert f"{attention} inside" in reason and "'decoder.layers'" in reason
    t5 = random_transformer(
        "T5Model",
        {"vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_heads": 2},
    )
    specs, _ = auto_inputs(t5, dynamic=False)
    classes, _, candidates = hiera_choice(t5, specs)
    assert _short(classes) == ["T5Block"]
    rejected = {c["class"].rsplit(".", 1)[-1]: c["reason"] for c in candidates if not c["chosen"]}
    assert rejected and all("inside T5Block" in why for why in rejected.values())
