"""wmrl: world-model GRPO for a vision-language-action policy on LIBERO-Spatial."""

__version__ = "0.1.0"
