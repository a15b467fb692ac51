"""LIBERO-Spatial in the real simulator: tasks, chunked env, scripted expert, worker pool."""

import logging

# robosuite warns on every import that it has no private macro file; the kit sets what it
# needs in code, so keep its console to errors.
logging.getLogger("robosuite_logs").setLevel(logging.ERROR)
