"""The application layer: the command line and what it runs before, around and after a run; it alone imports the TUI."""
