"""The tasks a recipe's ``task`` selects: one :class:`~hyperexport.library.tasks.task.Task` protocol for
``forward``, ``text-generation``, ``text2text-generation`` and ``automatic-speech-recognition``.

Every stage reads a task's declaration (:mod:`.registry`: graphs, files); each stage calls its
own part, in its own module, so that its key covers only that part: the trace and export
:mod:`.models` (torch: the step modules of :mod:`.steps`, the reference decode of
:mod:`.reference`), the evaluate stage :mod:`.decode` (one greedy loop in ONNX Runtime;
onnxruntime-genai in :mod:`.genai_runtime`), the check :mod:`.judge` (one comparison of
decodes, numpy). Shared by the tasks: the KV cache's names and input specs (:mod:`.kv`),
prompts (:mod:`.prompts`), ``.npz`` records (:mod:`.arrays`), ``genai_config.json``
(:mod:`.genai_config`). Nothing is imported here.
"""
