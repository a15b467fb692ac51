"""The world-model environment (Python 3.10): DeepSpeed trains and checkpoints on CPU.

Runs in .venv/wm (``make test`` routes tests/worldmodel there). World models themselves come
with their own tests; this one proves the environment the lock file builds really works.
"""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")


@pytest.fixture(scope="module")
def dist():
    from wmrl.device import free_port

    saved = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def _engine(zero_stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
           "zero_optimization": {"stage": zero_stage}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _train(engine, micro_steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(micro_steps):
        x = torch.randn(4, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def test_python_version_is_the_wm_side():
    assert sys.version_info[:2] == (3, 10)
    assert os.environ.get("DS_ACCELERATOR") == "cpu" or deepspeed.get_accelerator().device_name() in ("cpu", "cuda")


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_deepspeed_trains_and_resumes_on_cpu(dist, tmp_path, zero_stage):
    engine = _engine(zero_stage)
    losses = _train(engine, 40)
    assert sum(losses[-8:]) < 0.5 * sum(losses[:8])
    assert engine.global_steps == 20  # 40 micro batches / accumulation 2
    engine.save_checkpoint(str(tmp_path), tag="step20", client_state={"data_position": 40})
    before = [p.detach().clone() for p in engine.module.parameters()]

    fresh = _engine(zero_stage)
    _, client = fresh.load_checkpoint(str(tmp_path), tag="step20")
    assert client["data_position"] == 40 and fresh.global_steps == 20
    for a, b in zip(before, fresh.module.parameters()):
        torch.testing.assert_close(a, b)
