"""Where published models find the step modules by name (``tasks.steps``); the tasks' code is in
:mod:`hyperexport.library.tasks`. Nothing is imported here.
"""
