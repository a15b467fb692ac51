"""wmrl.device: the process group is released when it is destroyed."""

from __future__ import annotations

import os
import subprocess
import sys

# Two gloo ranks make the group, an optimizer (whose first use imports torch._dynamo), leave
# together and report whether anything still holds the group afterwards.
TWO_RANKS = """
import gc, sys, weakref
import torch, torch.distributed as dist
from wmrl.device import before_process_group
if sys.argv[1:] == ["prepared"]:
    before_process_group()
dist.init_process_group("gloo")
rank, group = dist.get_rank(), weakref.ref(dist.group.WORLD)
torch.optim.AdamW(torch.nn.Linear(4, 4).parameters(), lr=1e-3)
dist.barrier()
dist.destroy_process_group()
gc.collect()
print(f"rank {rank}:", "held" if group() is not None else "released")
"""


def _two_ranks(tmp_path, root, mode: str) -> str:
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "python")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), mode], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_a_group_made_after_before_process_group_is_released_by_destroy(tmp_path, root):
    """Without the call (torch 2.13), torch._dynamo, imported by the optimizer, keeps the group
    alive past destroy_process_group into interpreter shutdown, where its gloo threads now and
    then abort the finished process; the two-rank GRPO and SFT runs rely on this."""
    out = _two_ranks(tmp_path, root, "prepared")
    assert out.count("released") == 2, out
