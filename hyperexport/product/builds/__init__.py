"""Recipe builds on the engine: what turns a validated recipe into a build of
:mod:`hyperexport.engine` and what a build leaves behind.

The session (recipe -> runner -> publication), the model fingerprint of a recipe, publication of
the outputs, ``report.json``/``report.html``/``summary.txt`` and sweep summaries. The engine
knows none of this: it runs stages it is handed.
"""
