"""Where published models find the export's wrapper modules by name (``export.units``,
``export.dynamo_path``, ``export.placeholders``); the export's code is in
:mod:`hyperexport.library.export`. Nothing is imported here.
"""
