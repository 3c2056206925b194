"""shmload's version: here only (pyproject.toml reads it, ``shmload.__version__`` re-exports it)."""

__version__ = "0.1.0"
