"""Framework-neutral pieces: recipes, FP8 formats, capability query, configuration."""
from . import recipe  # noqa: F401
