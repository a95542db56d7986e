"""The KV cache as explicit graph inputs and outputs, named and specified once for every task.

Decoder-only models take onnxruntime-genai's names (``past_key_values.0.key`` in,
``present.0.key`` out); encoder-decoders Optimum's (``past_key_values.0.decoder.key`` for a
decoder layer's self-attention, ``.encoder.key`` for its cross-attention). No torch: the specs
are recipe ``inputs`` entries (:func:`~hyperexport.base.contracts.input_specs.input_spec`).
"""

from __future__ import annotations

from typing import Any

from hyperexport.base.contracts.input_specs import input_spec

#: Prefix of a past KV input and of a present KV output.
PAST = "past_key_values."
PRESENT = "present."
#: The two tensors of one layer's cache, in the order their inputs are seeded.
KINDS = ("key", "value")


def past_name(layer: int, kind: str, which: str | None = None) -> str:
    """A past KV input: ``past_key_values.0.key``, or with ``which`` (``decoder``, ``encoder``)
    ``past_key_values.0.decoder.key``."""
    return f"{PAST}{layer}.{kind}" if which is None else f"{PAST}{layer}.{which}.{kind}"


def as_past(name: str) -> str:
    """The past input a present output feeds on the next step (``present.0.key`` ->
    ``past_key_values.0.key``)."""
    return name.replace(PRESENT, PAST, 1)


def kv_input(
    traced: tuple[int, int, int, int],
    probe: tuple[int, int],
    dtype: str,
    seed: int,
    dynamic: dict[int, str],
) -> dict[str, Any]:
    """The input spec of one KV tensor ``(batch, heads, length, head size)``: traced at
    ``traced``, compared again at ``probe`` ``(batch, length)``, values uniform in [-1, 1)."""
    batch, heads, length, size = traced
    probe_batch, probe_length = probe
    return input_spec(
        [batch, heads, length, size],
        [probe_batch, heads, probe_length, size],
        dtype,
        -1.0,
        1.0,
        seed,
        dynamic,
    )
