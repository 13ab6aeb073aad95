"""gpuq: a GPU job queue for small teams that lives in a shared directory."""

__version__ = "0.2.0"
