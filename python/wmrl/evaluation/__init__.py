"""Real-simulator evaluation harness (fixed initial states, success-once, per-episode evidence)."""
