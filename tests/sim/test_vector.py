import numpy as np
import pytest

from wmrl.config import SimConfig
from wmrl.data.trajectory import TrajectoryWriter
from wmrl.data.validate import validate_file
from wmrl.sim.vector import EpisodeSpec, FixedEpisodes, SimulatorPool, WorkerError

CFG = SimConfig(image_size=64, max_steps=24)
# task 0's seed 1,000,008: LIBERO's sampler throws its bowl while settling, so it is drawn again
SPECS = [EpisodeSpec(0, init_index=0, seed=11, tag=0), EpisodeSpec(0, seed=1_000_008, tag=1),
         EpisodeSpec(1, init_index=3, seed=5, tag=2)]


def _run(workers, policy=None, step_policy="random", specs=SPECS, **kw):
    with SimulatorPool(CFG, workers, step_policy=None if policy else step_policy, record=True, **kw) as pool:
        pool.batch_window_s = 2.0  # slow CPU workers: let every ready observation join one batch
        return sorted(pool.run(FixedEpisodes(specs), policy), key=lambda r: r.spec.tag)


@pytest.fixture(scope="module")
def one_worker():
    return _run(1)


def test_same_specs_give_the_same_episodes_whatever_the_worker_count(one_worker):
    two = _run(2)
    assert [r.spec for r in one_worker] == [r.spec for r in two] == SPECS
    assert {r.worker for r in two} == {0, 1}
    for a, b in zip(one_worker, two):
        np.testing.assert_array_equal(a.trajectory.actions, b.trajectory.actions)
        np.testing.assert_array_equal(a.trajectory.states, b.trajectory.states)
        np.testing.assert_array_equal(a.trajectory.main, b.trajectory.main)
        np.testing.assert_array_equal(a.trajectory.wrist, b.trajectory.wrist)


def test_recorded_episodes_follow_the_schema(one_worker, tmp_path):
    r = one_worker[0]
    t = r.trajectory
    assert r.steps == 24 and not r.success
    assert list(t.frame_step) == [0, 8, 16, 24] and t.actions.shape == (24, 7)
    assert t.attrs["init_mode"] == "eval" and t.attrs["init_index"] == 0
    assert one_worker[1].trajectory.attrs["init_mode"] == "train" and one_worker[1].trajectory.attrs["init_index"] == -1
    assert [r.placement_redraws > 0 for r in one_worker] == [False, True, False]  # the redraw reaches the caller
    w = TrajectoryWriter(tmp_path / "x.hdf5")
    for r in one_worker:
        w.append(r.trajectory)
    report = validate_file(w.finalize())
    assert report.ok, report.problems


def test_frames_between_chunk_boundaries_leave_the_episode_unchanged(one_worker):
    dense = _run(1, specs=SPECS[:1], frame_interval=2)[0].trajectory
    sparse = one_worker[0].trajectory
    assert list(dense.frame_step) == list(range(0, 25, 2)) and dense.actions.shape == (24, 7)
    np.testing.assert_array_equal(dense.actions, sparse.actions)
    at_boundaries = [list(dense.frame_step).index(s) for s in sparse.frame_step]
    np.testing.assert_array_equal(dense.main[at_boundaries], sparse.main)
    np.testing.assert_array_equal(dense.states[at_boundaries], sparse.states)
    assert not np.array_equal(dense.main[1], dense.main[0])  # the extra frames are real renders


def test_dart_noise_executes_perturbed_actions_and_keeps_the_clean_ones_as_labels(tmp_path):
    r = _run(1, specs=SPECS[1:2], action_noise=0.3)[0]
    t = r.trajectory
    assert t.action_labels is not None and t.action_labels.shape == t.actions.shape == (24, 7)
    assert np.abs(t.actions[:, :6] - t.action_labels[:, :6]).mean() > 0.1  # arm perturbed
    np.testing.assert_array_equal(t.actions[:, 6], t.action_labels[:, 6])  # gripper never
    assert np.abs(t.actions).max() <= 1 and t.attrs["policy_id"].endswith("+dart0.3")
    w = TrajectoryWriter(tmp_path / "dart.hdf5")
    w.append(t)
    assert validate_file(w.finalize()).ok


class ConstantPolicy:
    policy_id = "constant-down"

    def __init__(self):
        self.batches = []

    def act(self, observations):
        self.batches.append(len(observations))
        a = np.zeros((len(observations), 8, 7), np.float32)
        a[..., 2] = -0.3  # move down
        a[..., 6] = -1
        return a


def test_a_batched_policy_drives_all_workers_in_lockstep():
    policy = ConstantPolicy()
    results = _run(2, policy=policy, episodes_per_worker=1)
    assert [r.steps for r in results] == [24, 24, 24]
    assert max(policy.batches) == 2  # one forward pass served both workers
    z = results[0].trajectory.proprio[:, 2]
    assert z[-1] < z[0] - 0.02  # the end effector really moved down
    assert results[0].trajectory.attrs["policy_id"] == "external"


class RecordingPolicy(ConstantPolicy):
    """Remembers which episodes each forward pass served."""

    def __init__(self):
        super().__init__()
        self.served = []

    def act(self, observations):
        self.served.append([o.spec.tag for o in observations])
        return super().act(observations)


def test_a_worker_keeps_two_episodes_in_flight_and_they_run_as_with_one():
    specs = SPECS[:2]
    one_slot = _run(1, policy=ConstantPolicy(), specs=specs, episodes_per_worker=1)
    policy = RecordingPolicy()
    two_slots = _run(1, policy=policy, specs=specs, episodes_per_worker=2)
    calls = [tag for batch in policy.served for tag in batch]
    first_of = {t: calls.index(t) for t in (0, 1)}
    last_of = {t: len(calls) - 1 - calls[::-1].index(t) for t in (0, 1)}
    # both episodes were in flight at once in the one worker: neither waited for the other to end
    assert first_of[1] < last_of[0] and first_of[0] < last_of[1]
    for a, b in zip(one_slot, two_slots):
        assert a.spec == b.spec and a.worker == b.worker == 0
        np.testing.assert_array_equal(a.trajectory.actions, b.trajectory.actions)
        np.testing.assert_array_equal(a.trajectory.states, b.trajectory.states)
        np.testing.assert_array_equal(a.trajectory.main, b.trajectory.main)


def test_worker_errors_reach_the_caller():
    with SimulatorPool(CFG, 1, step_policy="random") as pool:
        with pytest.raises(WorkerError, match="out of range"):
            list(pool.run(FixedEpisodes([EpisodeSpec(0, init_index=99)])))


def test_bad_action_shape_is_refused():
    class Bad:
        def act(self, observations):
            return np.zeros((len(observations), 7))

    with SimulatorPool(CFG, 1) as pool:
        with pytest.raises(ValueError, match="expected"):
            list(pool.run(FixedEpisodes(SPECS[:1]), Bad()))
