"""Shims of transformers' masking and attention hooks, beside the patches that install them
(``transformers/patches.py``); whether the installed release needs them is a version fact
(:mod:`hyperexport.base.versions`)."""

from __future__ import annotations

from typing import Any

from hyperexport.base.versions import sdpa_nan_on_fully_masked_rows, vmapped_sdpa_masks


def traceable_sdpa_mask() -> Any:
    """transformers 4.x's SDPA mask builder, rewritten so that the TorchScript tracer can trace it
    at any batch size and length (and ``torch.export`` below torch 2.13, at dynamic sizes:
    :data:`~hyperexport.base.versions.VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT`).

    transformers 4.57 builds masks on torch >= 2.6 with ``sdpa_mask_recent_torch``, which vmaps
    the mask function under ``TransformGetItemToIndex`` (a custom autograd function): traced by
    ``torch.jit.trace`` it fails with ``RuntimeError: unordered_map::at``. Its
    ``sdpa_mask_older_torch`` traces, but vmap's batching rules reshape with the traced sizes
    (``Reshape`` to ``[16, 1]`` for a 16-token trace), so the model fails at any other length.
    The builder returned here does what 5.x's ``sdpa_mask`` does by default (and what Optimum
    patches into 4.x): it calls the mask function once on index tensors shaped to broadcast
    over (batch, head, query, key), so every size comes from the traced inputs. Same arguments
    and same mask as 4.57's builder (``cache_position`` gives the query indices) for mask
    functions that only index (causal, sliding-window, padding and packed-sequence masks are
    compared with 4.57's builder in tests/transformers/test_patches.py), including its
    ``allow_torch_fix`` where torch's SDPA needs it
    (:data:`~hyperexport.base.versions.TORCH_SDPA_NAN_ON_FULLY_MASKED_ROWS`).

    Returns:
        The builder, or None when the installed transformers is not 4.x-like (no vmapped
        ``sdpa_mask_recent_torch``, or none of the helpers the builder uses).
    """
    import torch

    masking_utils = vmapped_sdpa_masks()
    if masking_utils is None:
        return None  # 5.x: no vmapped builder to replace, and another signature
    nan_on_fully_masked_rows = sdpa_nan_on_fully_masked_rows()

    def sdpa_mask_by_broadcasting(
        batch_size: int,
        cache_position: torch.Tensor,
        kv_length: int,
        kv_offset: int = 0,
        mask_function: Any = masking_utils.causal_mask_function,
        attention_mask: torch.Tensor | None = None,
        local_size: int | None = None,
        allow_is_causal_skip: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor | None:
        q_length = cache_position.shape[0]
        padding_mask = masking_utils.prepare_padding_mask(
            attention_mask, kv_length, kv_offset, _slice=False
        )
        if allow_is_causal_skip and masking_utils._ignore_causal_mask_sdpa(
            padding_mask, q_length, kv_length, kv_offset, local_size
        ):
            return None
        if padding_mask is not None:
            mask_function = masking_utils.and_masks(
                mask_function, masking_utils.padding_mask_function(padding_mask)
            )
        device = cache_position.device
        kv_index = torch.arange(kv_length, device=device) + kv_offset
        mask = mask_function(
            torch.arange(batch_size, device=device)[:, None, None, None],
            torch.arange(1, device=device)[None, :, None, None],
            cache_position[None, None, :, None],
            kv_index[None, None, None, :],
        )
        mask = mask.expand(batch_size, -1, q_length, kv_length)
        if kwargs.get("allow_torch_fix", True) and nan_on_fully_masked_rows:
            # as transformers does on these releases, but not in place (see the version fact)
            mask = mask | ~mask.any(dim=-1, keepdim=True)
        return mask

    return sdpa_mask_by_broadcasting


def never_gqa(*args: Any, **kwargs: Any) -> bool:
    """Stand-in for transformers' ``sdpa_attention.use_gqa_in_sdpa``: always False.

    Takes any arguments: the hook is ``(attention_mask, key)`` in 4.57 and
    ``(attention_mask, key, value)`` in 5.x.
    """
    return False
