"""``task: text-generation``: a ``*ForCausalLM`` exported for onnxruntime-genai.

Torch-free modules: :mod:`.names` (file and I/O names), :mod:`.genai_config` (the
``genai_config.json`` built from the checkpoint's config as data), :mod:`.runtime` (greedy
decode in onnxruntime-genai), :mod:`.judge` (tokens and logits compared with numpy).
Torch modules, imported only by the trace and export stages: :mod:`.model` (the step model with
past/present KV as tensors) and :mod:`.reference` (transformers' greedy ``generate``).
"""
