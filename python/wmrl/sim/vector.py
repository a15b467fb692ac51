"""Run many simulator episodes in parallel worker processes.

Each worker (a ``spawn``-ed process) holds ``max_envs`` ``SpatialEnv``s (one per task, the
least recently used dropped first; 1 by default) and reuses them for later episodes of the
same task, because building an env costs 4-6 s and a reset 30-180 ms. The scheduler hands a
free worker the next episode of the task it has, and only switches it to another task (the
one with the most episodes left) when its own runs out. Many short batches over many tasks
(GRPO) keep an env per task in every worker.

Two ways to drive the episodes:

* a **step policy** by name (``"expert"``, ``"random"``) runs inside each worker and acts
  every physics step; the worker runs whole episodes on its own, no round trips.
* a **chunk policy** object (``act(list[Observation]) -> (B, chunk, 7)``) runs in the parent:
  one batched forward pass serves every episode whose observation is ready. Each worker
  keeps two such episodes in flight, so it steps one while the other waits for its actions.

Results arrive as ``EpisodeResult``s in completion order (sort by ``spec`` if order
matters); each carries the full ``Trajectory`` when ``record=True``. Episodes are a pure
function of their ``EpisodeSpec`` (task, initial state or reset seed, policy seed), so the
worker count (and episodes per worker) never changes what happens in an episode.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Iterator, Protocol

import numpy as np

from wmrl.config import SimConfig
from wmrl.data.trajectory import Trajectory, TrajectoryRecorder


@dataclass(frozen=True)
class EpisodeSpec:
    task_index: int
    init_index: int | None = None  # a fixed initial state (mode=eval); None: random placement
    seed: int = 0  # random placement seed (mode=train) and the policy's seed
    tag: int = 0  # the caller's number for it (trial, attempt)

    @property
    def mode(self) -> str:
        return "eval" if self.init_index is not None else "train"


@dataclass
class EpisodeResult:
    spec: EpisodeSpec
    success: bool
    steps: int
    wall_s: float
    worker: int
    trajectory: Trajectory | None = None
    env_built: bool = False  # the worker had to build this task's env first (4-6 s: its cache held other tasks)
    # seconds the worker computed (env build, reset, physics, cameras); the rest of wall_s it
    # waited for a chunk policy's actions, so busy_s / wall_s is how well the policy keeps pace
    busy_s: float = 0.0
    placement_redraws: int = 0  # how often its random placement was drawn again (SimConfig.max_settle_shift)


class EpisodeSource(Protocol):
    """Hands out episodes; ``preferred``: the tasks whose env the asking worker holds, most
    recently used first (an episode of one of them costs no env construction)."""

    def next(self, preferred: tuple[int, ...] = ()) -> EpisodeSpec | None: ...

    def on_result(self, result: EpisodeResult) -> None: ...


class FixedEpisodes:
    """A fixed list of episodes, handed out task by task."""

    def __init__(self, specs: list[EpisodeSpec]):
        self._by_task: dict[int, deque[EpisodeSpec]] = {}
        for s in specs:
            self._by_task.setdefault(s.task_index, deque()).append(s)
        self.total = len(specs)

    def next(self, preferred: tuple[int, ...] = ()) -> EpisodeSpec | None:
        for task in preferred:
            if self._by_task.get(task):
                return self._by_task[task].popleft()
        left = {t: q for t, q in self._by_task.items() if q}
        if not left:
            return None
        task = max(left, key=lambda t: (len(left[t]), -t))
        return left[task].popleft()

    def on_result(self, result: EpisodeResult) -> None:
        pass


class WorkerError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ worker
class _Worker:
    """One episode slot of a worker process: its envs (one per task, up to ``max_envs``), an
    optional step policy, an optional recorder."""

    def __init__(self, index: int, cfg: SimConfig, step_policy: str | None, policy_id: str, record: bool,
                 frame_interval: int = 0, action_noise: float = 0.0, max_envs: int = 1, post_success_steps: int = 0):
        self.index, self.cfg, self.step_policy_name, self.policy_id, self.record = index, cfg, step_policy, policy_id, record
        self.max_envs = max(1, max_envs)
        self.envs: dict = {}  # task -> SpatialEnv, most recently used last
        # DART: execute the step policy's action plus Gaussian noise (arm dimensions), record
        # the clean action as the label, so demonstrations show how the expert recovers.
        self.action_noise = action_noise
        # Recorded frames between chunk boundaries: every `frame_interval` steps (0: none).
        # Policies only ever see chunk-boundary frames; the extra ones are training data.
        self.frame_interval = frame_interval if record else 0
        # A recording goes on this many steps after the first success (in whole chunks): more
        # frames of the goal reached for the reward model. Success still counts once; 0: stop.
        self.post_success_steps = post_success_steps if record else 0
        self.env = None
        self.built = False
        self.policy = None

    def _env_for(self, task_index: int):
        from wmrl.sim.env import SpatialEnv

        env = self.envs.pop(task_index, None)
        self.built = env is None
        if env is None:
            while len(self.envs) >= self.max_envs:
                self.envs.pop(next(iter(self.envs))).close()
            env = SpatialEnv(task_index, self.cfg)
        self.envs[task_index] = env
        self.env = env
        return env

    def start(self, spec: EpisodeSpec):
        from wmrl.sim.policies import make_step_policy

        self.spec, self.t0 = spec, time.perf_counter()
        env = self._env_for(spec.task_index)
        self.busy_s = 0.0  # from here on; the build and reset are added below
        obs = env.reset(init_index=spec.init_index) if spec.mode == "eval" else env.reset(seed=spec.seed)
        if self.step_policy_name is not None:
            self.policy = make_step_policy(self.step_policy_name, spec.seed)
            self.policy_id = self.policy.policy_id + (f"+dart{self.action_noise:g}" if self.action_noise else "")
            self.policy.reset(env)
            self.noise_rng = np.random.default_rng([spec.seed, 0xDA27])
        self.recorder = TrajectoryRecorder() if self.record else None
        self._add_frame(obs, goal_holds=bool(env.raw._check_success()))
        obs.spec = spec
        self.busy_s = time.perf_counter() - self.t0
        return obs

    def _add_frame(self, obs, goal_holds: bool) -> None:
        if self.recorder is not None:
            self.recorder.add_frame(main=obs.main, wrist=obs.wrist, proprio=obs.proprio, state=obs.state,
                                    step=obs.step, goal_holds=goal_holds)

    def step_chunk(self, actions: np.ndarray | None):
        """Execute one chunk (from ``actions`` or the step policy); returns (obs, done)."""
        t0 = time.perf_counter()
        env = self.env
        goal = False
        for k in range(self.cfg.chunk_size):
            if actions is None:
                a = self.policy.act(env)
            elif k < len(actions):
                a = actions[k]
            else:
                break
            if k and self.frame_interval and env.steps % self.frame_interval == 0:
                self._add_frame(env.observe(), goal_holds=goal)
            a = np.clip(np.asarray(a, dtype=np.float32).reshape(7), -1.0, 1.0)
            label = None
            if actions is None and self.action_noise:
                label, a = a, a.copy()
                a[:6] = np.clip(a[:6] + self.noise_rng.normal(0.0, self.action_noise, 6), -1.0, 1.0)
            goal = env.step(a)
            if self.recorder is not None:
                self.recorder.add_action(a, label)
            if env.steps >= self.cfg.max_steps:
                break
        obs = env.observe()
        self._add_frame(obs, goal_holds=goal)
        obs.spec = self.spec
        self.busy_s += time.perf_counter() - t0
        done = env.steps >= self.cfg.max_steps or (
            env.success and env.steps - env.success_step >= self.post_success_steps)
        return obs, done

    def result(self) -> EpisodeResult:
        env, spec = self.env, self.spec
        traj = None
        if self.recorder is not None:
            import json

            from wmrl import __version__

            traj = self.recorder.finish({
                "task_index": spec.task_index, "instruction": env.task.instruction,
                "init_mode": spec.mode, "init_index": -1 if spec.init_index is None else spec.init_index,
                "seed": spec.seed, "success": env.success, "steps": env.steps, "policy_id": self.policy_id,
                "success_step": -1 if env.success_step is None else env.success_step,
                "post_success_steps": self.post_success_steps,
                "chunk_size": self.cfg.chunk_size, "image_size": self.cfg.image_size,
                "kit_version": __version__, "sim_settings": json.dumps(env.settings()),
            })
        return EpisodeResult(spec, env.success, env.steps, time.perf_counter() - self.t0, self.index, traj, self.built,
                             self.busy_s, env.placement_redraws)

    def run_episode(self, spec: EpisodeSpec) -> EpisodeResult:
        self.start(spec)
        done = False
        while not done:
            _, done = self.step_chunk(None)
        return self.result()


def _worker_main(conn, index: int, cfg: SimConfig, step_policy: str | None, policy_id: str, record: bool,
                 frame_interval: int, action_noise: float, max_envs: int, slots: int, post_success_steps: int = 0) -> None:
    """Serve the parent's commands, each tagged with a slot: ``(cmd, slot, arg)``. A slot is one
    episode in flight with its own envs; commands run in the order they arrive, so while the
    parent computes one slot's actions the worker steps another slot's physics."""
    from wmrl.gl import configure_renderer

    try:
        configure_renderer(cfg.renderer)
        runners = [_Worker(index, cfg, step_policy, policy_id, record, frame_interval, action_noise, max_envs,
                           post_success_steps) for _ in range(slots)]
        while True:
            cmd, slot, arg = conn.recv()
            worker = runners[slot]
            if cmd == "run":
                conn.send(("done", slot, worker.run_episode(arg)))
            elif cmd == "reset":
                conn.send(("obs", slot, worker.start(arg)))
            elif cmd == "step":
                obs, done = worker.step_chunk(arg)
                conn.send(("done", slot, worker.result()) if done else ("obs", slot, obs))
            elif cmd == "close":
                break
    except (EOFError, KeyboardInterrupt):
        pass
    except BaseException:
        try:
            conn.send(("error", 0, f"worker {index}:\n{traceback.format_exc()}"))
        except (BrokenPipeError, OSError):
            pass
    finally:
        for worker in locals().get("runners", []):
            for env in worker.envs.values():
                env.close()


# ------------------------------------------------------------------------------------ pool
EPISODES_PER_WORKER = 2  # chunk-policy episodes in flight per worker; see SimulatorPool


class SimulatorPool:
    """``with SimulatorPool(cfg, workers=2, step_policy="expert") as pool: pool.run(source)``

    With a chunk policy each worker keeps ``episodes_per_worker`` episodes in flight (slots,
    each with its own envs): while the parent computes the actions of one slot's chunk, the
    worker steps another slot's physics. With one slot a worker waits for every forward pass
    (on one H200 host, 16 workers computed only 71% of their episode time). A step policy runs
    inside the worker and never waits, so it uses one slot.
    """

    def __init__(self, cfg: SimConfig, workers: int, *, step_policy: str | None = None,
                 policy_id: str = "external", record: bool = False, frame_interval: int = 0,
                 action_noise: float = 0.0, max_envs: int = 1, episodes_per_worker: int = EPISODES_PER_WORKER,
                 post_success_steps: int = 0):
        from wmrl.gl import configure_renderer

        if episodes_per_worker < 1:
            raise ValueError(f"episodes_per_worker must be at least 1, got {episodes_per_worker}")
        configure_renderer(cfg.renderer)  # fails here, with the fix, if the GL library is missing
        self.cfg = cfg
        self.step_policy = step_policy
        self.slots = 1 if step_policy is not None else episodes_per_worker
        ctx = mp.get_context("spawn")
        self._conns, self._procs = [], []
        for i in range(max(1, workers)):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, daemon=True,
                            args=(child, i, cfg, step_policy, policy_id, record, frame_interval, action_noise,
                                  max_envs, self.slots, post_success_steps))
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        # the tasks each (worker, slot) holds an env for, most recently used first (mirrors _Worker._env_for)
        self._tasks_of: dict[tuple[int, int], list[int]] = {
            (w, s): [] for w in range(len(self._conns)) for s in range(self.slots)}
        self.max_envs = max(1, max_envs)
        self.batch_window_s = 0.01  # how long a ready observation waits for others to batch with

    @property
    def num_workers(self) -> int:
        return len(self._conns)

    def __enter__(self) -> "SimulatorPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(("close", 0, None))
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        self._conns, self._procs = [], []

    def _recv(self, w: int):
        """The next message of worker ``w``: (kind, slot, payload)."""
        try:
            kind, slot, payload = self._conns[w].recv()
        except (EOFError, ConnectionResetError):
            raise WorkerError(f"simulator worker {w} died (exit code {self._procs[w].exitcode})") from None
        if kind == "error":
            raise WorkerError(payload)
        return kind, slot, payload

    def _assign(self, w: int, slot: int, source: EpisodeSource, cmd: str) -> EpisodeSpec | None:
        spec = source.next(tuple(self._tasks_of[w, slot]))
        if spec is not None:
            held = [spec.task_index] + [t for t in self._tasks_of[w, slot] if t != spec.task_index]
            self._tasks_of[w, slot] = held[: self.max_envs]
            self._conns[w].send((cmd, slot, spec))
        return spec

    def run(self, source: EpisodeSource, policy=None) -> Iterator[EpisodeResult]:
        """Run every episode ``source`` hands out; yield results as they finish."""
        if policy is None:
            if self.step_policy is None:
                raise ValueError("give a chunk policy, or create the pool with step_policy='expert'|'random'")
            yield from self._run_in_workers(source)
        else:
            yield from self._run_batched(source, policy)

    def _run_in_workers(self, source: EpisodeSource) -> Iterator[EpisodeResult]:
        busy = {w for w in range(self.num_workers) if self._assign(w, 0, source, "run") is not None}
        while busy:
            ready = wait([self._conns[w] for w in busy])
            for w in [w for w in busy if self._conns[w] in ready]:
                _, _, result = self._recv(w)
                source.on_result(result)
                yield result
                if self._assign(w, 0, source, "run") is None:
                    busy.discard(w)

    def _run_batched(self, source: EpisodeSource, policy) -> Iterator[EpisodeResult]:
        """Batched chunk policy: one forward pass for every slot whose observation is ready.

        Not a strict lockstep: a worker that builds an env for a new task (4-6 s) or runs a
        slow chunk must not hold up the others, so the parent acts on whoever is ready,
        after waiting ``batch_window_s`` for stragglers to join the batch. While one batch's
        slots step the physics, the next batch's forward pass runs.
        """
        pending = {w: 0 for w in range(self.num_workers)}  # commands sent to w and not answered yet
        for slot in range(self.slots):  # slot 0 of every worker first: each starts work at once
            for w in range(self.num_workers):
                if self._assign(w, slot, source, "reset") is not None:
                    pending[w] += 1
        ready_obs: dict[tuple[int, int], object] = {}
        while any(pending.values()) or ready_obs:
            conns = {self._conns[w]: w for w, n in pending.items() if n}
            if conns and not ready_obs:
                wait(list(conns))  # block for the first one
            if conns:
                deadline = time.perf_counter() + self.batch_window_s
                while True:  # gather everyone ready now or within the window
                    for c in wait(list(conns), timeout=0):
                        w = conns[c]
                        kind, slot, payload = self._recv(w)
                        pending[w] -= 1
                        if not pending[w]:
                            del conns[c]
                        if kind == "obs":
                            ready_obs[w, slot] = payload
                            continue
                        source.on_result(payload)
                        yield payload
                        if self._assign(w, slot, source, "reset") is not None:
                            pending[w] += 1  # its first observation comes with a later batch
                            conns[c] = w
                    left = deadline - time.perf_counter()
                    if not conns or left <= 0 or not wait(list(conns), timeout=left):
                        break
            if not ready_obs:
                continue
            keys = sorted(ready_obs)
            actions = np.asarray(policy.act([ready_obs[k] for k in keys]), dtype=np.float32)
            if actions.ndim != 3 or actions.shape[0] != len(keys) or actions.shape[2] != 7:
                raise ValueError(f"policy returned actions of shape {actions.shape}; expected ({len(keys)}, chunk, 7)")
            for i, (w, slot) in enumerate(keys):
                self._conns[w].send(("step", slot, actions[i]))
                pending[w] += 1
            ready_obs.clear()
