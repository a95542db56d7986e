"""Where published models find ``RootHolder`` by name (``capture.root``); the capture's code is
in :mod:`hyperexport.library.capture`. Nothing is imported here.
"""
