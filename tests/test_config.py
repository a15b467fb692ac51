import pytest

from wmrl.config import ConfigError, EvalConfig, get_profile, override, parse_tasks, profile_names


def test_profiles_are_registered_and_tiny_is_small():
    assert {"default", "tiny"} <= set(profile_names())
    tiny, full = get_profile("tiny"), get_profile("default")
    assert tiny.sim.image_size == 64 and full.sim.image_size == 128
    assert full.eval.trials == 50 and len(full.eval.tasks) == 10 and full.sim.max_steps == 240
    assert full.wm.train.compile and not tiny.wm.train.compile  # the GPU server compiles; CPU tests stay eager
    with pytest.raises(ConfigError, match="choose one of"):
        get_profile("huge")


def test_tasks_parse_lists_ranges_and_all():
    assert parse_tasks("0,3,5") == (0, 3, 5)
    assert parse_tasks("2-4") == (2, 3, 4)
    assert parse_tasks("all") == tuple(range(10))
    assert parse_tasks(None) is None
    with pytest.raises(ConfigError, match="valid indices are 0..9"):
        parse_tasks("3,12")
    with pytest.raises(ConfigError, match="0-4"):
        parse_tasks("a")


def test_overrides_are_validated():
    cfg = override(EvalConfig(), trials=5, seed=None)
    assert cfg.trials == 5 and cfg.seed == 0
    with pytest.raises(ConfigError, match="1..50"):
        override(EvalConfig(), trials=60)


def test_collection_frame_interval_is_validated():
    from wmrl.config import CollectConfig

    assert CollectConfig().frame_interval == 1 and override(CollectConfig(), frame_interval=0).frame_interval == 0
    with pytest.raises(ConfigError, match="chunk boundaries only"):
        CollectConfig(frame_interval=-1)


def test_grpo_success_chunks_and_gradient_agreement_interval_are_validated():
    from wmrl.config import GRPOConfig

    cfg = GRPOConfig()
    assert cfg.success_chunks == 1 and override(cfg, success_chunks=2).success_chunks == 2
    for bad in (0, cfg.max_chunks + 1):
        with pytest.raises(ConfigError, match="success_chunks"):
            override(cfg, success_chunks=bad)
    with pytest.raises(ConfigError, match="grad_agreement_interval"):
        override(cfg, grad_agreement_interval=-1)
    assert cfg.world_noise == "group" and override(cfg, world_noise="rollout").world_noise == "rollout"
    with pytest.raises(ConfigError, match="world_noise='episode'"):
        override(cfg, world_noise="episode")


def test_grpo_eval_temperature_is_the_sdes_and_is_validated():
    from wmrl.config import GRPOConfig

    cfg = GRPOConfig()
    assert cfg.eval_temperature == 0.0 and override(cfg, eval_temperature=1.0).eval_temperature == 1.0
    with pytest.raises(ConfigError, match="the SDE sampler's"):
        override(cfg, eval_sampler="ode", eval_temperature=1.0)
    with pytest.raises(ConfigError, match="0..10"):
        override(cfg, eval_temperature=-1.0)


def test_grpo_full_interval_must_hold_whole_evaluation_intervals_and_the_error_names_the_fix():
    from wmrl.config import GRPOConfig

    cfg = GRPOConfig()
    with pytest.raises(ConfigError, match="pass --full-interval 8 "):
        override(cfg, eval_interval=4)  # the default full_interval 10 is not a multiple of 4
    assert override(cfg, eval_interval=4, full_interval=8).full_interval == 8
