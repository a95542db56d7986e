"""What the stages hand the library, made from their recipe slice: the model
(:mod:`.model`), the :class:`~hyperexport.library.options.ExportOptions` (:mod:`.export_options`) and
the check's settings (:mod:`.check_settings`). Not stages themselves: each stage imports the one
it needs, so its key covers only that one.
"""
