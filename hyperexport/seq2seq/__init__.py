"""``task: text2text-generation`` and ``automatic-speech-recognition``: encoder-decoder models as
two graphs, ``encoder_model.onnx`` and ``decoder_model.onnx``.

Torch-free modules: :mod:`.names` (graphs, files, I/O names), :mod:`.runtime` (the greedy decode
through both graphs in ONNX Runtime), :mod:`.evaluate` and :mod:`.judge` (the evaluate and check
stages' parts). Torch modules, imported only by the trace and export stages: :mod:`.model` (the
encoder and decoder step models), :mod:`.reference` (transformers' greedy ``generate``) and
:mod:`.task` (the stages' scope per graph).
"""
