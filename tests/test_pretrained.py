"""Every model saves and loads itself (``wmrl.pretrained``): a fresh process reads back the
same outputs bit for bit, and a flipped byte in any file is refused by name."""

import subprocess
import sys

import pytest
import torch
from wmrl.config import get_profile
from wmrl.pretrained import PretrainedError

TINY = get_profile("tiny")


def _models():
    from wmrl.policy.model import FlowPolicy
    from wmrl.worldmodel.model import FrameWorldModel
    from wmrl.worldmodel.reward import RewardModel

    torch.manual_seed(0)
    wm = FrameWorldModel(TINY.wm.wrist)
    wm.set_proprio_stats({"mean": torch.arange(8.0), "std": torch.full((8,), 2.0)})
    reward = RewardModel(TINY.reward)
    reward.threshold.fill_(0.3)
    return {"FlowPolicy": FlowPolicy(TINY.policy), "FrameWorldModel": wm, "RewardModel": reward}


# The same forward pass, in this process and in a fresh one: fixed inputs, fixed noise.
FORWARD = '''
import torch
def forward(name, m):
    g = torch.Generator().manual_seed(1)
    if name == "FlowPolicy":
        prefix = m.encode(torch.rand(2, 3, 64, 64, generator=g) * 2 - 1, torch.rand(2, 3, 64, 64, generator=g) * 2 - 1,
                          torch.randn(2, 384, generator=g), torch.randn(2, 8, generator=g))
        return m.velocity(prefix, torch.randn(2, 8, 7, generator=g), torch.tensor(0.5))
    if name == "FrameWorldModel":
        frame, p = m.generate(torch.rand(2, 3, 3, 64, 64, generator=g) * 2 - 1,
                              torch.rand(2, 8 * m.cfg.action_chunks, 7, generator=g),  # past chunks, then the current
                              m.normalize_proprio(torch.randn(2, 8, generator=g)), generator=g)
        return torch.cat([frame.flatten(), p.flatten(), m.proprio_mean])
    return torch.cat([m(torch.rand(2, 3, 64, 64, generator=g) * 2 - 1), m.threshold.reshape(1)])
'''


@pytest.mark.parametrize("name", ["FlowPolicy", "FrameWorldModel", "RewardModel"])
def test_a_fresh_process_reads_back_the_same_outputs(name, tmp_path, root):
    ns: dict = {}
    exec(FORWARD, ns)
    model = _models()[name].eval()
    folder = model.save_pretrained(tmp_path / name, meta={"note": "test", "by_step": {5: 1.0, 10: 2.0}})
    with torch.no_grad():
        here = ns["forward"](name, model)
    torch.save(here, tmp_path / "here.pt")
    code = (f"import sys, torch; sys.path.insert(0, 'python')\n{FORWARD}\n"
            f"from wmrl.policy.model import FlowPolicy\nfrom wmrl.worldmodel.model import FrameWorldModel\n"
            f"from wmrl.worldmodel.reward import RewardModel\n"
            f"m = {name}.from_pretrained({str(folder)!r})\n"
            f"with torch.no_grad():\n    there = forward({name!r}, m)\n"
            f"print(torch.equal(there, torch.load({str(tmp_path / 'here.pt')!r})), m.saved_meta['note'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "test"], out.stderr[-2000:]


@pytest.mark.parametrize("name", ["FlowPolicy", "FrameWorldModel", "RewardModel"])
def test_a_flipped_byte_is_refused_by_name(name, tmp_path):
    model = _models()[name]
    folder = model.save_pretrained(tmp_path / name)
    cls = type(model)
    for f in ("model.safetensors", "config.json"):
        original = (folder / f).read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        (folder / f).write_bytes(bytes(data))
        with pytest.raises(PretrainedError, match=f.replace(".", r"\.")):
            cls.from_pretrained(folder)
        (folder / f).write_bytes(original)
    cls.from_pretrained(folder)  # intact again: loads


def test_a_model_of_another_kind_is_refused(tmp_path):
    from wmrl.worldmodel.reward import RewardModel

    folder = _models()["FlowPolicy"].save_pretrained(tmp_path / "policy")
    with pytest.raises(PretrainedError, match="not a wmrl-reward/2 model"):
        RewardModel.from_pretrained(folder)


def test_a_killed_writer_leaves_no_temporary_folder_for_long(tmp_path):
    """Hidden ``.name.tmp-PID`` folders of a dead writer are removed by the next write; a living
    writer's are left alone."""
    import os

    dead = tmp_path / ".global_step_1.tmp-99999999"
    alive = tmp_path / f".global_step_2.tmp-{os.getpid()}"
    for d in (dead, alive):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    _models()["RewardModel"].save_pretrained(tmp_path / "global_step_3")
    assert not dead.exists() and alive.exists() and (tmp_path / "global_step_3" / "config.json").is_file()
