"""The exporter library: capture, export, passes, check, tasks, models, the transformers
support and the library's options and defaults (the ``library`` side of ``docs/ARCHITECTURE.md``).

It imports nothing of the product or the engine, and works without a build. Its public names
keep their homes outside this folder (``hyperexport.export_hyper_onnx``,
``hyperexport.compat.hyperonnx``, ``hyperexport.models.pretrained``, ``hyperexport.zoo``,
``hyperexport.transformers.kv_layers`` and ``.static_cache``): thin modules that re-export from
here. Nothing is imported here.
"""
