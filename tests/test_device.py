"""wmrl.device: the process group is released when it is destroyed."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import child_env

# Two gloo ranks make the group, an optimizer (whose first use imports torch._dynamo), leave
# together and report whether anything still holds the group afterwards.
TWO_RANKS = """
import gc, weakref
import torch, torch.distributed as dist
from wmrl.device import before_process_group
before_process_group()
dist.init_process_group("gloo")
rank, group = dist.get_rank(), weakref.ref(dist.group.WORLD)
torch.optim.AdamW(torch.nn.Linear(4, 4).parameters(), lr=1e-3)
dist.barrier()
dist.destroy_process_group()
gc.collect()
print(f"rank {rank}:", "held" if group() is not None else "released")
"""


def test_a_group_made_after_before_process_group_is_released_by_destroy(tmp_path):
    """Without the call (torch 2.13), torch._dynamo, imported by the optimizer, keeps the group
    alive past destroy_process_group into interpreter shutdown, where its gloo threads now and
    then abort the finished process; the two-rank GRPO and SFT runs rely on this."""
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                       capture_output=True, text=True, timeout=300, env=child_env(OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("released") == 2, r.stdout
