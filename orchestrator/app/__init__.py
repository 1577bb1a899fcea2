"""The application layer: the command line and what it runs before, around and after a run.

It is the only layer that imports the TUI.
"""
