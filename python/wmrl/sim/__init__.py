"""LIBERO-Spatial in the real simulator: tasks, chunked env, scripted expert, worker pool."""
