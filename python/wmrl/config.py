"""Typed configuration: every stage's settings, and the one named registry of them.

A profile bundles the settings of every stage: simulator, evaluation, demonstrations,
collection, policy, supervised training, world models, reward model and GRPO. ``default`` is
the full-scale setting of the original system (10 tasks x 50 episodes, 128 px, 240 steps);
``tiny`` is the same code at toy scale for CPU tests and ``make demo``.

    get_config("tiny")          the tiny profile (a ``Profile``)
    get_config("grpo")          the default profile's GRPO settings (a ``GRPOConfig``)
    get_config("grpo_tiny")     the tiny profile's; likewise policy, sft, wm, reward, ...

Dimensions shared by several models (chunk size, action and proprio dimension, cameras) are
defined once below and checked where configs meet (``Profile.__post_init__``; a checkpoint of
another chunk size is refused, not adapted). Command-line flags override single fields
(``override``, ``wmrl.cli.add_config_flags``); every override is validated by ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

NUM_SPATIAL_TASKS = 10
TRIALS_PER_TASK = 50  # LIBERO ships 50 fixed initial states per task
# Shared by the simulator, the policy, the world models and GRPO: defined here only.
CHUNK_SIZE = 8  # actions per policy call; images exist only between chunks (the original's)
ACTION_DIM = 7  # OSC_POSE delta: xyz, axis-angle, gripper (-1 open, +1 close)
PROPRIO_DIM = 8  # eef position (3), eef axis-angle (3), gripper finger positions (2)
VIEWS = ("main", "wrist")  # agentview and eye-in-hand cameras
BIMANUAL_TASKS = ("transfer_cube", "insertion")  # the scripted ALOHA tasks (wmrl.bimanual.aloha)
MAX_RESET_BASE_SEED = 4000  # reset seed = base * 1e6 + task * 1e4 + attempt must fit numpy's 32 bits
TEMPERATURE_SEED_STRIDE = 1000  # a collection's i-th extra temperature resets from seed + 1000 i (cycles add 1, 2, ...)
RENDERERS = ("auto", "osmesa", "egl", "glfw")


class ConfigError(ValueError):
    """A setting is invalid; the message says how to fix it."""


def _check_tasks(tasks: tuple[int, ...], where: str) -> None:
    if not tasks:
        raise ConfigError(f"{where}: no tasks selected; pass e.g. TASKS=0,1 (valid: 0..9)")
    bad = [t for t in tasks if not 0 <= t < NUM_SPATIAL_TASKS]
    if bad:
        raise ConfigError(
            f"{where}: unknown LIBERO-Spatial task index {bad[0]}; valid indices are 0..9"
        )


PHYSICS_LOOPS = ("split", "stock", "lean")


@dataclass(frozen=True)
class SimConfig:
    """How the real simulator is run. Training data and evaluation must agree on these."""

    image_size: int = 128  # square, both cameras
    chunk_size: int = CHUNK_SIZE  # actions executed per policy call; images rendered only between chunks
    max_steps: int = 240  # policy steps per episode (220 is the other common convention)
    settle_steps: int = 10  # no-op steps after reset while objects fall onto the table; not counted
    renderer: str = "auto"  # auto: egl with an NVIDIA GPU, osmesa without
    # "fast": no table reflection, no multisampling, buffer sized to the image (about 3x faster
    # on software rendering, pixels differ by ~4/255 from "stock"). Recorded with every result.
    render_profile: str = "fast"
    # "split": MuJoCo's mj_step1/mj_step2 per substep instead of robosuite's forward+step
    # (same trajectories, ~1.5x faster physics). "stock" keeps robosuite's loop. "lean": split
    # without the controller's own forward pass (another 1.4x; trajectories leave robosuite's by
    # ~1e-4 in joint positions within 120 steps, the solver's warm start; bench/physics_passes.py)
    physics: str = "split"
    # The loop of episodes from random placements (demonstrations, collection, GRPO rollouts);
    # "" = ``physics``. Episodes from the fixed evaluation states always run ``physics``, so a
    # faster training loop never touches a reported success rate
    train_physics: str = ""
    # Gaussian noise (radians, per arm joint) on the arm's rest pose at a random placement.
    # LIBERO's fixed initial states were recorded with robosuite's "default" initialization
    # noise (measured on them: sd 0.016-0.023 rad per joint, ~1 cm at the gripper), while the
    # wrapper LIBERO ships resets without it, so training starts held the arm at one pose the
    # evaluation never shows. 0.02 draws the evaluation's spread; 0 is the wrapper's bare reset.
    # Never applied to a fixed initial state (that holds its own joints).
    robot_init_noise: float = 0.02
    # A random placement whose objects slide more than this (metres, horizontally) while they
    # settle is drawn again. LIBERO's placement sampler can put a bowl into the plate beside it
    # (tasks 0, 2 and 8: 6-11% of seeds); the contact then throws the bowl 0.2-0.9 m, sometimes
    # off the table, a start the fixed initial states never show (their objects settle by at most
    # ~60 mm; bench/placement_shifts.py). 0: keep every draw.
    max_settle_shift: float = 0.1

    def __post_init__(self) -> None:
        if self.image_size < 16 or self.image_size > 1024:
            raise ConfigError(f"image_size={self.image_size}: use a square size in 16..1024 (128 default, 64 for tests)")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size={self.chunk_size}: must be >= 1 (8 is the original's)")
        if self.max_steps < 1:
            raise ConfigError(f"max_steps={self.max_steps}: must be >= 1 (240 default, 220 convention)")
        if self.settle_steps < 0:
            raise ConfigError(f"settle_steps={self.settle_steps}: must be >= 0")
        if self.renderer not in RENDERERS:
            raise ConfigError(f"renderer={self.renderer!r}: choose one of {', '.join(RENDERERS)}")
        if self.render_profile not in ("fast", "stock"):
            raise ConfigError(f"render_profile={self.render_profile!r}: choose 'fast' or 'stock'")
        if not 0.0 <= self.robot_init_noise <= 0.2:
            raise ConfigError(f"robot_init_noise={self.robot_init_noise}: use 0..0.2 rad (0.02, the noise of "
                              "LIBERO's fixed initial states; 0: the arm always starts at its rest pose)")
        if not 0.0 <= self.max_settle_shift <= 1.0:
            raise ConfigError(f"max_settle_shift={self.max_settle_shift}: use 0..1 m (0.1 default: a random placement "
                              "whose objects slide further while settling is drawn again; 0: keep every draw)")
        if self.physics not in PHYSICS_LOOPS or self.train_physics not in ("", *PHYSICS_LOOPS):
            raise ConfigError(f"physics={self.physics!r}, train_physics={self.train_physics!r}: choose from "
                              f"{', '.join(PHYSICS_LOOPS)} (train_physics also '': the same as physics)")

    @property
    def max_chunks(self) -> int:
        return -(-self.max_steps // self.chunk_size)


# SimConfig fields that act on random placements only (demonstrations, collection, GRPO's
# rollouts). The fixed initial states of an evaluation never see them: two evaluations that differ
# only here are the same evaluation, and one may continue the other.
TRAINING_START_FIELDS = ("train_physics", "robot_init_noise", "max_settle_shift")


def default_workers() -> int:
    """One simulator process per core (the parent mostly waits)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass(frozen=True)
class EvalConfig:
    """Real-simulator evaluation on the fixed initial states (``mode=eval``)."""

    tasks: tuple[int, ...] = tuple(range(NUM_SPATIAL_TASKS))
    trials: int = TRIALS_PER_TASK  # per task; trial i uses fixed initial state i
    workers: int = 0  # 0: one per core
    seed: int = 0  # seeds stochastic policies; the initial states are fixed
    videos: int = 0  # episodes per task saved as MP4 (main | wrist side by side)

    def __post_init__(self) -> None:
        _check_tasks(self.tasks, "evaluation")
        if not 1 <= self.trials <= TRIALS_PER_TASK:
            raise ConfigError(f"trials={self.trials}: LIBERO has {TRIALS_PER_TASK} fixed initial states per task; use 1..50")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers}: use 0 (one per core) or a positive count")
        if self.videos < 0:
            raise ConfigError(f"videos={self.videos}: must be >= 0")


@dataclass(frozen=True)
class DemoConfig:
    """Scripted-expert demonstrations from seeded random resets (``mode=train``)."""

    tasks: tuple[int, ...] = tuple(range(NUM_SPATIAL_TASKS))
    episodes: int = 50  # demonstrations kept per task (successful ones, unless keep_failures)
    workers: int = 0
    seed: int = 0
    max_attempts_factor: int = 3  # give up on a task after episodes * factor attempts
    # Record both cameras every `frame_interval` policy steps, not only at chunk boundaries:
    # 8x the training samples for supervised learning at the same episode count (rendering
    # is nearly free with EGL). 0 records chunk boundaries only (the tiny profile: OSMesa
    # renders slowly on CPUs).
    frame_interval: int = 1
    # DART (Laskey et al. 2017): std of Gaussian noise added to the expert's arm actions when
    # executed; the clean action is stored as the label (``action_labels``), so the policy
    # learns the expert's recoveries from the states its own errors lead to. 0: off.
    action_noise: float = 0.0
    # Keep failed episodes too (``episodes`` then counts every attempt): with ``action_noise``,
    # a noisy expert's successes *and* mistakes, data that shows failures before any policy
    # exists (for the reward model and the world models' agreement with the simulator)
    keep_failures: bool = False
    # Record this many more steps after an episode's first success (whole chunks; success still
    # counts once): frames of the goal reached, which the reward model otherwise sees once per
    # successful episode. 0: the episode ends with the chunk in which it succeeds.
    post_success_steps: int = 0

    def __post_init__(self) -> None:
        _check_tasks(self.tasks, "demonstrations")
        if self.post_success_steps < 0:
            raise ConfigError(f"post_success_steps={self.post_success_steps}: use 0 (stop at success) or N >= 1 steps")
        if not 0.0 <= self.action_noise <= 1.0:
            raise ConfigError(f"action_noise={self.action_noise}: a std in [0, 1] (actions live in [-1, 1]); 0 turns it off")
        if self.frame_interval < 0:
            raise ConfigError(f"frame_interval={self.frame_interval}: use 0 (chunk boundaries only) or N >= 1 "
                              "(a frame every N steps)")
        if self.episodes < 1:
            raise ConfigError(f"episodes={self.episodes}: must be >= 1")
        if not 0 <= self.seed <= MAX_RESET_BASE_SEED:
            raise ConfigError(f"demos.seed={self.seed}: use 0..{MAX_RESET_BASE_SEED} (reset seeds must stay below 2**32)")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers}: use 0 (one per core) or a positive count")
        if self.max_attempts_factor < 1:
            raise ConfigError("max_attempts_factor must be >= 1")


EVAL_SAMPLERS = ("ode", "sde")


@dataclass(frozen=True)
class PolicyConfig:
    """The flow-matching VLA policy (``wmrl.policy``): sizes, chunk, sampler settings.

    Convention (openpi/pi0): ``x_t = t * noise + (1 - t) * action``, t = 1 is pure noise,
    the network predicts ``v = noise - action`` and sampling integrates t from 1 down to 0 in
    ``denoise_steps`` equal steps. ``noise_level`` is the flow-SDE's (RLinf ``flow_sde``);
    ``temperature_eval`` multiplies the std of every SDE transition at evaluation (only with
    ``eval_sampler="sde"``; the initial noise stays N(0, I)).
    """

    chunk_size: int = CHUNK_SIZE  # actions predicted per call (= SimConfig.chunk_size)
    action_dim: int = ACTION_DIM
    proprio_dim: int = PROPRIO_DIM
    lang_dim: int = 384  # all-MiniLM-L6-v2 sentence embedding
    channels: tuple[int, ...] = (32, 64, 128, 256)  # conv stages per camera (ResNet-ish, GroupNorm)
    grid: int = 8  # image tokens per camera: grid x grid
    width: int = 256  # transformer width
    heads: int = 4
    encoder_layers: int = 2  # fuse image, language and proprio tokens (run once per observation)
    expert_layers: int = 4  # action expert: self-attention over the chunk, cross-attention to the prefix
    mlp_ratio: int = 4
    denoise_steps: int = 10  # K Euler / SDE steps
    noise_level: float = 0.5  # flow-SDE noise level (RLinf / Flow-GRPO)
    eval_sampler: str = "sde"  # "sde" (the original's stochastic evaluation) or "ode" (deterministic)
    temperature_eval: float = 1.6  # multiplies the SDE transition std at evaluation
    time_beta: tuple[float, float] = (1.5, 1.0)  # pi0: t ~ Beta(1.5, 1), more weight on noisy times
    augment_shift: float = 0.0625  # random shift (pad + crop) as a fraction of the image size
    # The gripper command snaps to the controller's three values: |g| < deadband -> 0 (hold),
    # else its sign. robosuite integrates only sign(g) (a quarter of the range per step) and the
    # demonstrations use exactly -1 / 0 / +1, so an unsnapped near-zero output would open or
    # close the gripper at random while the expert held it. 0 turns snapping off.
    gripper_deadband: float = 0.5

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.action_dim < 1 or self.proprio_dim < 1 or self.lang_dim < 1:
            raise ConfigError("policy: chunk_size, action_dim, proprio_dim and lang_dim must be >= 1")
        if not self.channels or any(c < 4 for c in self.channels):
            raise ConfigError(f"policy.channels={self.channels}: give one or more conv widths >= 4, e.g. 32,64,128,256")
        if any(c % min(8, c) for c in self.channels):
            raise ConfigError(f"policy.channels={self.channels}: each width must be divisible by 8 (GroupNorm) or be < 8")
        if self.grid < 1:
            raise ConfigError(f"policy.grid={self.grid}: must be >= 1 (8 default, 2 tiny)")
        if self.width < 8 or self.heads < 1 or self.width % self.heads:
            raise ConfigError(f"policy.width={self.width} must be >= 8 and divisible by heads={self.heads}")
        if self.encoder_layers < 0 or self.expert_layers < 1 or self.mlp_ratio < 1:
            raise ConfigError("policy: encoder_layers >= 0, expert_layers >= 1 and mlp_ratio >= 1")
        if self.denoise_steps < 1:
            raise ConfigError(f"policy.denoise_steps={self.denoise_steps}: must be >= 1 (10 default)")
        if not 0.0 <= self.noise_level <= 5.0:
            raise ConfigError(f"policy.noise_level={self.noise_level}: use a value in 0..5 (0.5 is the original's)")
        if self.eval_sampler not in EVAL_SAMPLERS:
            raise ConfigError(f"policy.eval_sampler={self.eval_sampler!r}: choose one of {', '.join(EVAL_SAMPLERS)}")
        if not 0.0 <= self.temperature_eval <= 10.0:
            raise ConfigError(f"policy.temperature_eval={self.temperature_eval}: use a value in 0..10 (1.6 is the original's)")
        if len(self.time_beta) != 2 or min(self.time_beta) <= 0:
            raise ConfigError(f"policy.time_beta={self.time_beta}: two positive Beta parameters, e.g. (1.5, 1.0)")
        if not 0.0 <= self.augment_shift < 0.5:
            raise ConfigError(f"policy.augment_shift={self.augment_shift}: a fraction of the image in 0..0.5")
        if not 0.0 <= self.gripper_deadband < 1.0:
            raise ConfigError(f"policy.gripper_deadband={self.gripper_deadband}: use a value in 0..1 (0.5 default, 0 off)")


def policy_id(step: int | str, sampler: str, denoise_steps: int | str, temperature: float | None) -> str:
    """The id a policy writes into every episode it records and every evaluation it makes
    (``PolicyRunner.policy_id``, e.g. ``flow-policy@step4000-sde-K10-T1``): its checkpoint step,
    sampler, denoising steps and, for the flow-SDE, temperature. With ``"*"`` for a part it is a
    shell pattern over such ids (``GRPOConfig.start_recorded_by``)."""
    temp = f"-T{temperature:g}" if sampler == "sde" else ""
    return f"flow-policy@step{step}-{sampler}-K{denoise_steps}{temp}"


@dataclass(frozen=True)
class SFTConfig:
    """Supervised flow-matching training on demonstrations (``python/sft.py``)."""

    steps: int = 10_000  # optimizer steps (~10 min on one H200 at batch 256, measured on synthetic 128 px data)
    batch_size: int = 256  # global (split over GPUs under torchrun)
    lr: float = 3e-4
    warmup: int = 500  # linear warmup steps, then cosine to lr * min_lr_ratio
    min_lr_ratio: float = 0.05
    weight_decay: float = 1e-4
    grad_clip: float = 1.0  # 0: off
    ema: float = 0.999  # EMA decay of the saved weights; 0: off
    save_interval: int = 2_000  # checkpoint every N steps (and the last)
    full_interval: int = 2_000  # of those, a full checkpoint (with train state) every N steps (and the last)
    eval_interval: int = 500  # validation loss every N steps
    log_interval: int = 50
    val_ratio: float = 0.1  # episodes held out for the validation loss (split by episode)
    seed: int = 0
    num_workers: int = 0  # threads decoding the HDF5 files at start (0: one per core)
    bf16: bool = True  # autocast on GPU (CPU runs in float32)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"sft.steps={self.steps}: must be >= 1")
        if self.batch_size < 1:
            raise ConfigError(f"sft.batch_size={self.batch_size}: must be >= 1")
        if not 0.0 < self.lr < 1.0:
            raise ConfigError(f"sft.lr={self.lr}: use a learning rate in (0, 1), e.g. 3e-4")
        if self.warmup < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("sft: warmup must be >= 0 and min_lr_ratio in 0..1")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("sft: weight_decay and grad_clip must be >= 0")
        if not 0.0 <= self.ema < 1.0:
            raise ConfigError(f"sft.ema={self.ema}: an EMA decay in [0, 1) (0 turns EMA off; 0.999 typical)")
        for name in ("save_interval", "full_interval", "eval_interval", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sft.{name}={getattr(self, name)}: must be >= 1")
        if self.full_interval % self.save_interval:
            raise ConfigError(f"sft.full_interval={self.full_interval} must be a multiple of save_interval={self.save_interval}")
        if not 0.0 <= self.val_ratio <= 0.5:
            raise ConfigError(f"sft.val_ratio={self.val_ratio}: use 0..0.5 (0 disables the validation loss)")
        if self.num_workers < 0:
            raise ConfigError(f"sft.num_workers={self.num_workers}: use 0 (one per core) or a positive count")


@dataclass(frozen=True)
class CollectConfig:
    """Real trajectories with the current policy (``make collect``): success and failure kept,
    seeded random placements (``mode=train``), never the fixed evaluation states."""

    tasks: tuple[int, ...] = tuple(range(NUM_SPATIAL_TASKS))
    episodes: int = 50  # per task (the original: 10 x 50 = 500 trajectories per cycle)
    workers: int = 0
    seed: int = 1  # reset seeds are seed * 1e6 + task * 1e4 + attempt (demonstrations use 0); a cycle adds its number
    sampler: str = "sde"  # the policy's stochastic sampler shows the mistakes GRPO must see
    temperature: float = 1.0  # the SDE temperature while collecting (training rollouts use 1)
    # The episodes shared with these temperatures too, each in OUT/T<t>/ with placements of its own
    # (the i-th extra temperature's reset seeds from seed + 1000 i: a held-out episode's start never
    # begins a training episode at another temperature). A hot policy's own mistakes teach the world
    # models what wrong actions do: on the H200, world models trained on the policy at T = 1 and 3
    # ranked five policies as the simulator did (Spearman 1.0), noisy-expert data did not (RESULTS.md)
    extra_temperatures: tuple[float, ...] = (3.0,)
    # Frames every N steps besides the chunk boundaries (0: boundaries only, the cheapest files).
    # 1 gives the world models every chunk-boundary phase of the policy's own episodes too
    # (WMTrainConfig.all_phases: 8x their transitions) for 8x the images on disk, as measured
    frame_interval: int = 1
    post_success_steps: int = 0  # as DemoConfig's: steps recorded after the first success

    def __post_init__(self) -> None:
        _check_tasks(self.tasks, "collection")
        if self.post_success_steps < 0:
            raise ConfigError(f"collect.post_success_steps={self.post_success_steps}: use 0 (stop at success) or N >= 1")
        if self.frame_interval < 0:
            raise ConfigError(f"collect.frame_interval={self.frame_interval}: use 0 (chunk boundaries only) or N >= 1")
        if self.episodes < 1:
            raise ConfigError(f"collect.episodes={self.episodes}: must be >= 1 (EPISODES=...)")
        if self.workers < 0:
            raise ConfigError(f"collect.workers={self.workers}: use 0 (one per core) or a positive count")
        if not 0 <= self.seed <= MAX_RESET_BASE_SEED:
            raise ConfigError(f"collect.seed={self.seed}: use 0..{MAX_RESET_BASE_SEED} (reset seeds must stay below 2**32)")
        if self.sampler not in EVAL_SAMPLERS:
            raise ConfigError(f"collect.sampler={self.sampler!r}: choose one of {', '.join(EVAL_SAMPLERS)}")
        if not 0.0 < self.temperature <= 10.0:
            raise ConfigError(f"collect.temperature={self.temperature}: use a value in (0, 10]")
        temps = self.temperatures
        if not all(0.0 < t <= 10.0 for t in temps) or len(set(temps)) != len(temps):
            raise ConfigError(f"collect.extra_temperatures={self.extra_temperatures}: distinct values in (0, 10], none "
                              f"equal to collect.temperature={self.temperature} (--extra-temperatures 3; '' for none)")
        if self.extra_temperatures and self.sampler != "sde":
            raise ConfigError("collect.extra_temperatures needs the flow-SDE sampler (the ODE has no temperature): "
                              "--sampler sde, or no extra temperatures")
        if self.seed + TEMPERATURE_SEED_STRIDE * len(self.extra_temperatures) > MAX_RESET_BASE_SEED:
            raise ConfigError(f"collect.seed={self.seed} with {len(self.extra_temperatures)} extra temperatures: the last "
                              f"one's seed {self.seed + TEMPERATURE_SEED_STRIDE * len(self.extra_temperatures)} passes "
                              f"{MAX_RESET_BASE_SEED}; use a smaller --seed")
        if self.episodes < len(temps):
            raise ConfigError(f"collect.episodes={self.episodes} is shared by {len(temps)} temperatures: give at least "
                              f"{len(temps)} per task")

    @property
    def temperatures(self) -> tuple[float, ...]:
        return (self.temperature, *self.extra_temperatures)

    def seed_at(self, temperature: float) -> int:
        """The reset seed base of one temperature's episodes (placements of their own)."""
        return self.seed + TEMPERATURE_SEED_STRIDE * self.temperatures.index(temperature)

    def episodes_at(self) -> dict[float, int]:
        """Episodes per task at each temperature: ``episodes`` shared, the first takes the rest."""
        n, k = divmod(self.episodes, len(self.temperatures))
        return {t: n + (k if i == 0 else 0) for i, t in enumerate(self.temperatures)}


@dataclass(frozen=True)
class WorldModelConfig:
    """A pixel-space EDM denoiser (DIAMOND-style): next chunk-boundary frame of one view from
    the last ``context`` frames of that view, the chunk's actions and the proprio."""

    view: str = "main"
    image_size: int = 128
    context: int = 2  # frames of history (the current one included), one chunk apart
    chunk_size: int = CHUNK_SIZE
    action_dim: int = ACTION_DIM
    proprio_dim: int = PROPRIO_DIM
    condition_on_main: bool = False  # wrist model: also see the main view's current frame
    # ... or (with condition_on_main) the main view's frame at the chunk's *end*, which the main
    # model imagines first in lockstep: it shows where the arm went, which the wrist camera rides
    # on. Tried because the policy acts on the imagined wrist view, not the main one (bench/RESULTS.md,
    # "Which imagined view moves the policy"); off because on the CPU it bought +0.05 to +0.32 dB
    # with the real main frame, an upper bound (two seeds; "The wrist model on the main frame ...")
    main_at_chunk_end: bool = False
    # U-Net widths per resolution level (after the patches below), one block each. The default,
    # on 4 x 4 patches with the refine head: 24.6 GFLOP per training sample at 128 px (the
    # unpatched (32, 64, 128, 256): 46.3; the former (64, 128, 256) x 2: 195), at least as good
    # at equal H200 training time and 3.7x the generated frames per second (bench/RESULTS.md,
    # "World models": the probes on the H200 and the CPU)
    channels: tuple[int, ...] = (128, 256, 256)
    blocks_per_level: int = 1
    # Pixel patches folded into channels before the U-Net (space-to-depth, "simple diffusion"'s
    # patching): patch 4 turns a 128 px frame into 32 x 32 x 48, so the first level runs wide
    # convolutions on 16x fewer positions. Lossless (a reshape, unlike an autoencoder's latents);
    # 1: none
    patch: int = 4
    # Channels of a small full-resolution head after the patches are unfolded: two 3x3
    # convolutions over the U-Net's output, the noisy input and the current frame, added to the
    # output (zero-initialised, so it starts as the model without it). Without it a patched U-Net
    # removes the sampler's noise pixel by pixel only through its wide first layer, and its frames
    # keep a grain that PSNR hardly sees and SSIM and the reward do (H200 speedrun: SSIM 0.63
    # against the held frame's 0.93; CPU probe: the head adds 0.23 SSIM and 2.3-4.4 dB). 0: none
    refine: int = 32
    # Where the refine head runs: 1 on the full-resolution pixels (9 -> refine -> 3 channels); r > 1
    # on r x r pixel patches folded into channels (9 r^2 -> refine -> 3 r^2 channels at 1/r the side):
    # the same FLOPs, 1/r^2 of the intermediate activation's bytes, channel counts tensor cores take.
    # On an H100 the full-resolution head's kernels were ~14% of a compiled update for 1.4% of its
    # FLOPs, moving memory more than multiplying (bench/RESULTS.md "The fast kernels on an H100").
    # Unmeasured (speed and fidelity): 1 by default
    refine_patch: int = 1
    cond_dim: int = 256  # noise level + actions + proprio embedding
    proprio_hidden: int = 256  # next-proprio head
    # EDM (Karras et al. 2022), as DIAMOND uses it
    sigma_data: float = 0.5
    p_mean: float = -0.4  # log-normal noise levels for training
    p_std: float = 1.2
    sigma_min: float = 2e-3
    sigma_max: float = 5.0
    rho: float = 7.0
    sample_steps: int = 3  # few Euler steps suffice for next-frame prediction (DIAMOND: 3)
    # GameNGen's noise augmentation against open-loop drift: in training, Gaussian noise of a std
    # drawn per sample from [0, context_noise] corrupts the conditioning frames, and the model is
    # told the level; imagination conditions on its own frames at level 0. 0: off
    context_noise: float = 0.0
    # Generate the change from the view's current frame instead of the frame itself (the
    # denoiser's data are x_next - x_now; the frame is x_now + the sample): most pixels do not
    # change over a chunk. Pair it with a sigma_data near the changes' std (~0.13 on LIBERO's
    # main view, 64 px; frames themselves ~0.5). False: the frame itself
    residual: bool = False
    # Extra loss weight on the pixels that move over the chunk (``model.moving_pixels``: a channel
    # of the real next frame differs from the current one by more than 0.1): a pixel that moves weighs
    # 1 + motion_weight. The arm is ~9% of a LIBERO main view; with equal weights most of the
    # loss is the static table, and a model can halve it while predicting the same frame for
    # any action chunk (bench/RESULTS.md: the action response). 0: plain EDM loss
    motion_weight: float = 0.0
    # Main view only: draw the end effector now and at the chunk's end (the proprio head's
    # prediction from the actions) as two Gaussian blobs in the image, read as two more input
    # channels (``wmrl.worldmodel.camera``: LIBERO-Spatial's agentview projection). The actions
    # then say where the arm goes in the image's own coordinates instead of only through the
    # global conditioning vector, which the models hardly read (bench/RESULTS.md: the action
    # response). Measured: small gains on the CPU at 64 px, none on the H200 at 128 px (two
    # seeds each, bench/RESULTS.md "Pose maps on the H200"), so off. False: the global
    # conditioning only
    pose_maps: bool = False
    # Wrist view only: the current wrist frame warped by the camera's motion over the chunk (from
    # the proprio now to the proprio head's prediction at the chunk's end, onto the table plane:
    # ``camera.wrist_warp``), read as three more input channels. The wrist camera rides the arm, so
    # what the policy reads in it is the chunk's motion (a frame one chunk late costs it 0.22 in
    # its actions); the warp draws most of that motion by geometry (0.07; bench/RESULTS.md "The
    # wrist camera's motion by geometry") and leaves the network what stands off the table.
    # False: the global conditioning only (the default here, for models saved before it; the
    # profiles turn it on)
    wrist_warp: bool = False
    # The proprio head predicts the chunk's motion of the end effector (position change, the turn
    # in its own frame, gripper change) from its pose given as position and rotation matrix, and
    # the next proprio is composed from them (``wmrl.worldmodel.rotation``). LIBERO's axis-angle
    # flips sign near pi, where the arm works with its fingers down (in 11 of 20 of the policy's
    # episodes): a head that regresses the next axis-angle itself learns a target that jumps by
    # 2 pi, and the orientation it imagines (which the policy and ``wrist_warp`` read) is wrong
    # there. False: the next normalised proprio as a residual on the current one (the default
    # here, so that models saved before this option load as they were trained; the profiles,
    # ``WMProfile``, turn it on)
    proprio_motion: bool = False
    # Chunks of past actions the model reads besides the current one (the actions that led to
    # its context frames, DIAMOND's conditioning). The OSC controller answers an action within a
    # few steps, so the last actions of the previous chunk move the arm in this one about as much
    # as this chunk's first (bench/action_lag.py: R^2 of a chunk's displacement 0.30 -> 0.44 in x
    # with the previous chunk). Before an episode's start the past actions are zeros (the arm
    # rests). Measured on the H200 (main view, 128 px, two seeds at batch 64 and 256): the
    # actions are worth +0.82 dB on the moving pixels with 1, +0.65 without, one chunk ahead
    # +0.15 dB, open loop level (bench/RESULTS.md "Batch 256 and action history on the H200").
    # 0: the current chunk only
    action_history: int = 1
    # Classifier-free guidance on the actions (Ho & Salimans; action-conditioned video models use
    # it for action adherence). In training this fraction of samples sees a learned null in place
    # of all its actions, so the network also learns the next frame without them; sampling at
    # ``action_guidance`` w > 1 then takes D_null + w (D_actions - D_null) at every Euler step (one
    # call on twice the batch): what the actions change is amplified w times. On the H200 the pair
    # imagined the same success for a precise and a sloppy policy (bench/RESULTS.md "Controls as
    # negatives on the H200"): the actions are averaged away. action_guidance 1: off (plain sampling)
    action_dropout: float = 0.0
    action_guidance: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.action_dropout < 1:
            raise ConfigError(f"action_dropout={self.action_dropout}: the fraction of training samples without their "
                              "actions, in [0, 1) (0: off; 0.1 is usual for guidance)")
        if self.action_guidance < 0 or (self.action_guidance != 1 and self.action_dropout == 0):
            raise ConfigError(f"action_guidance={self.action_guidance} needs a model trained with action_dropout > 0 "
                              "(it learns the null the guidance pushes away from); use 1 for none")
        if self.view not in VIEWS:
            raise ConfigError(f"world model view {self.view!r}: choose one of {', '.join(VIEWS)}")
        if self.condition_on_main and self.view != "wrist":
            raise ConfigError("condition_on_main is for the wrist model only (the main model is its own source)")
        if self.main_at_chunk_end and not self.condition_on_main:
            raise ConfigError("main_at_chunk_end says which main frame the wrist model sees: set condition_on_main too")
        if self.context < 1 or self.chunk_size < 1 or self.sample_steps < 1:
            raise ConfigError("world model: context, chunk_size and sample_steps must be >= 1")
        if self.patch < 1:
            raise ConfigError(f"patch={self.patch}: pixels per side folded into channels, >= 1 (1: none)")
        if self.refine < 0:
            raise ConfigError(f"refine={self.refine}: channels of the full-resolution head, >= 0 (0: none)")
        if self.refine_patch < 1 or self.image_size % self.refine_patch:
            raise ConfigError(f"refine_patch={self.refine_patch}: pixels per side the refine head folds into channels, "
                              f">= 1 and dividing image_size={self.image_size} (1: full resolution)")
        down = self.patch * 2 ** (len(self.channels) - 1)
        if not self.channels or self.image_size % down:
            raise ConfigError(f"image_size={self.image_size} must be divisible by {down} "
                              f"(patch x 2 ** (levels - 1) for patch={self.patch}, channels={self.channels})")
        if any(c % 8 for c in self.channels):
            raise ConfigError(f"channels={self.channels}: each must be divisible by 8 (GroupNorm)")
        if not 0 < self.sigma_min < self.sigma_max:
            raise ConfigError("need 0 < sigma_min < sigma_max")
        if self.proprio_motion and self.proprio_dim != 8:
            raise ConfigError(f"proprio_motion reads the proprio as position (3), axis-angle (3), gripper (2); "
                              f"proprio_dim is {self.proprio_dim}: set proprio_motion=False")
        if self.wrist_warp and self.view != "wrist":
            raise ConfigError("wrist_warp moves the wrist camera with the arm; the main camera stands still "
                              "(set wrist_warp=False for the main model; pose_maps draws the arm there)")
        if self.pose_maps and self.view != "main":
            raise ConfigError("pose_maps draws the end effector in the fixed main camera; the wrist camera moves "
                              "with it (set pose_maps=False for the wrist model)")
        if not 0 <= self.action_history <= 4:
            raise ConfigError(f"action_history={self.action_history}: past chunks of actions the model reads, 0..4 "
                              "(0: the current chunk only; 1: and the previous one)")
        if self.motion_weight < 0:
            raise ConfigError(f"motion_weight={self.motion_weight}: extra weight of moving pixels, >= 0 (0: off)")
        if not 0 <= self.context_noise <= 2:
            raise ConfigError(f"context_noise={self.context_noise}: a std in [0, 2] for frames in [-1, 1]; 0 turns it off")

    @property
    def action_chunks(self) -> int:
        """Chunks of actions in the model's action input: the past ones, then the current."""
        return 1 + self.action_history

    @property
    def input_frames(self) -> int:
        """Frames stacked as conditioning channels (history, plus main's for the wrist model)."""
        return self.context + int(self.condition_on_main)

    @property
    def main_condition(self) -> str | None:
        """Which main-view frame conditions this model: None, "start" or "end" of the chunk
        (``Transitions.batch``'s ``main`` argument)."""
        return ("end" if self.main_at_chunk_end else "start") if self.condition_on_main else None


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


@dataclass(frozen=True)
class WMTrainConfig:
    """One world-model training run (DeepSpeed). The DeepSpeed JSON file decides ZeRO stage
    and precision; micro batch, accumulation and learning rate are filled in from here
    unless the file sets them."""

    # Optimizer updates. The seed's 2000 fine-tune a pretrained Cosmos; from scratch, 2000 leave
    # a pair at chance on generated frames: the same pair trained from 2,123 to 3,922 updates
    # went from agreement 0.37 to 0.62 and from +0.4 to +2.3 dB over the held frame at 5 chunks
    # (bench/RESULTS.md "Twice the world-model updates")
    steps: int = 4000
    # 256 samples per kernel launch: at 64 the H200 waits on launches (MFU 5%); at 256 it trains
    # 2.7x the samples per second (13%) and learns as well per second or better, while 512 and
    # 1024 add little speed and too few updates (bench/RESULTS.md "Batch 256 and action history
    # on the H200"). The seed accumulates 4 micro batches of pretrained Cosmos; from scratch,
    # one large micro batch is faster for the same samples
    micro_batch: int = 256
    grad_accum: int = 1
    lr: float = 4e-4  # from scratch, for batch 256 (2e-4 at 64; the seed fine-tunes at 1e-6)
    weight_decay: float = 1e-2
    warmup: int = 100
    grad_clip: float = 1.0
    save_interval: int = 1000  # explicit, as the seed's --save-interval
    eval_interval: int = 250
    log_interval: int = 25
    val_batches: int = 4
    proprio_loss_weight: float = 1.0
    # Train on every chunk-boundary phase of the recordings that have a frame at every step
    # (demonstrations): 8x the transitions of the same episodes (``wmrl.worldmodel.data``).
    # Open loop +0.1 to +1.0 dB at 5 and 10 chunks in both seeds at equal time on the H200, and
    # what lets longer training pay (bench/RESULTS.md "Every phase of the demonstrations")
    all_phases: bool = True
    # Fraction of each batch whose latest context frame is the model's own one-chunk prediction
    # (``wmrl.worldmodel.train.own_context``: training sees the frames imagination feeds it; ~1.3x
    # the cost per update at 0.25). 0: real context only. CPU, main view, two seeds: open loop up at
    # 600 updates, signs split at 1,600 (bench/RESULTS.md "The model's own frames as context"); off
    self_context: float = 0.0
    seed: int = 20261021  # the seed's cycle seed
    # NHWC activations for the U-Net's convolutions (speed only: the same model and loss; off
    # until bench/wm_throughput.py --variants shows the gain on a GPU)
    channels_last: bool = False
    # torch.compile of the loss (speed only); the first updates compile, ~1 min
    compile: bool = False
    # Under compile: inductor lays the convolutions' activations out NHWC itself (its layout
    # optimization, which its heuristic skips for a U-Net: the decoder's convolutions over
    # concatenated skips halve the channels), so cuDNN stops converting NCHW <-> NHWC around each
    # convolution (28% of the GPU's time before). Speed only. H200, micro batch 1,024: 6,730 ->
    # 8,132 samples/s, MFU 20.9% -> 25.3% (bench/RESULTS.md "NHWC inside the compiled graph").
    # Without compile it does nothing; False: inductor's own heuristic
    compile_nhwc: bool = True
    # The refine head's convolutions on channel counts of tensor-core kernels (9 -> 16 in, 3 -> 8
    # out, the zeros cut off again) and the U-Net's upsampling written so that its gradient is a
    # reduction, not a scatter of atomic adds (``FrameWorldModel.use_fast_kernels``). Speed only,
    # the same function (tested); a compiled H100 step spent ~18% of its time in the kernels these
    # replace at micro batch 4,096 (bench/RESULTS.md "Training MFU by micro batch"). Measured under
    # compile+NHWC (H100, micro batch 4,096): 8,871 -> 9,264 samples/s, MFU 27.6% -> 28.8%, the
    # scatter and the padding kernels gone from the profile (bench/RESULTS.md "The fast kernels on
    # an H100"); on an H200 9,578 -> 10,192-10,337, MFU 29.8% -> 31.7-32.2% ("... on an H200").
    # On in the GPU's ("default") profile; off here because eager on a CPU the zero channels are
    # only more work
    fast_kernels: bool = False
    # torch.compile's mode for the loss. "reduce-overhead" replays the update's kernels as CUDA
    # graphs (at micro batch 256 the H200 still waits on kernel launches: 1,024 trains 1.4-1.7x the
    # samples/s); "max-autotune-no-cudagraphs" times Triton's kernels against cuDNN's for every
    # shape (minutes of compiling); "max-autotune" does both. Speed only; "default": CUDA graphs
    # bought 1.02x at micro batch 1,024 (H100, bench/RESULTS.md "CUDA graphs on top of the compiled
    # NHWC loss"), autotune is unmeasured (its search outlasted an 8-minute call)
    compile_mode: str = "default"
    # cuDNN times its convolution algorithms for each new shape and keeps the fastest
    # (torch.backends.cudnn.benchmark); training's shapes never change, and the convolutions'
    # backward is the largest share of an update's GPU time (45.7% at micro batch 1,024, H200).
    # Measured under compile+NHWC on an H100, micro batch 1,024: no gain beyond the spread of
    # repeats (8,103 vs 8,014 and 7,622 vs 7,728 / 7,364 samples/s; bench/RESULTS.md). Speed only
    cudnn_benchmark: bool = False
    ds_config_cpu: str = "data/worldmodel/ds_cpu.json"
    ds_config_gpu: str = "data/worldmodel/ds_gpu.json"

    def __post_init__(self) -> None:
        for name in ("steps", "micro_batch", "grad_accum", "save_interval", "eval_interval", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"world-model training: {name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.warmup < 0 or self.val_batches < 0:
            raise ConfigError("world-model training: lr > 0, warmup >= 0 and val_batches >= 0")
        if not 0 <= self.self_context <= 1:
            raise ConfigError(f"world-model training: self_context={self.self_context} is a fraction of the batch, 0..1")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"world-model training: compile_mode={self.compile_mode!r}: choose one of "
                              f"{', '.join(COMPILE_MODES)} (torch.compile's modes)")


@dataclass(frozen=True)
class DistillConfig:
    """A few-step student of each world model (``make wm-distill``): the teacher's multi-step
    Euler sample from a noise draw is the target of the student's ``student_steps`` from the same
    draw (Luhman & Luhman 2021, knowledge distillation of a sampler); the student starts as a
    copy of the teacher. Imagination then runs ``sample_steps / student_steps`` times fewer
    network calls per frame.

    ``self_forcing_steps`` > 0 adds the four-stage recipe's Stage 3 after it (SF-DMD, as
    ``wmrl.bimanual.distill`` does for the bimanual model): the student rolls out
    ``rollout_chunks`` chunks on its own frames, and distribution matching against the frozen
    teacher (real score) and a critic (fake score, from the teacher) moves its last frame; every
    ``student_every``-th iteration updates the student, the others the critic."""

    steps: int = 1000  # updates per view
    batch: int = 64
    lr: float = 1e-4  # the student starts from the teacher: fine-tuning, not training
    student_steps: int = 1  # Euler steps of the student's sampler
    save_interval: int = 250
    log_interval: int = 25
    val_transitions: int = 256  # held-out transitions the report compares student and teacher on
    seed: int = 0
    # Stage 3 (SF-DMD) iterations after the sampler distillation; 0: none. Off: on real LIBERO frames
    # (CPU, 64 px, two seeds and two variants; bench/RESULTS.md "Stage 3 on real LIBERO frames") it
    # cost ~1 dB PSNR and SSIM at 1-10 chunks against the distilled student, which matches its teacher
    self_forcing_steps: int = 0
    rollout_chunks: int = 3  # chunks of each self-forcing rollout (the last one carries the gradient)
    student_every: int = 6  # Stage 3: one student update per this many iterations, the rest critic
    critic_lr: float = 5e-5  # Stage 3: the critic's own optimizer
    # Stage 3's first iterations update the critic only (DMD2's practice: a fake score that has seen
    # the student's frames before the student follows its gradient); counted in self_forcing_steps.
    # 100 of them on real LIBERO frames changed nothing (bench/RESULTS.md "Stage 3 on real LIBERO frames")
    critic_warmup: int = 0
    self_forcing_lr: float = 1e-5  # Stage 3: the student's rate (at the distillation's 1e-4 DMD moves it far: bench/RESULTS.md)

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "student_steps", "save_interval", "log_interval", "rollout_chunks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"wm distillation: {name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.val_transitions < 0:
            raise ConfigError("wm distillation: lr > 0 and val_transitions >= 0")
        if self.self_forcing_steps < 0 or self.student_every < 2 or self.critic_lr <= 0 or self.self_forcing_lr <= 0:
            raise ConfigError(f"wm distillation: self_forcing_steps={self.self_forcing_steps} (>= 0), "
                              f"student_every={self.student_every} (>= 2: one student update, the rest critic), "
                              f"critic_lr={self.critic_lr}, self_forcing_lr={self.self_forcing_lr} (> 0)")
        if not 0 <= self.critic_warmup < max(self.self_forcing_steps, 1):
            raise ConfigError(f"wm distillation: critic_warmup={self.critic_warmup} must be >= 0 and below "
                              f"self_forcing_steps={self.self_forcing_steps} (the warm-up is part of Stage 3's iterations)")


@dataclass(frozen=True)
class WMProfile:
    """Both views' world models and their training (the seed's cadence: accumulation 4, an
    explicit save interval; the wrist model's target step decides when both stop)."""

    # proprio_motion and the wrist warp on (off in WorldModelConfig itself, so that models saved
    # before them load as they were trained), measured on the CPU (bench/RESULTS.md "The wrist
    # camera's motion by geometry"): the head's orientation one chunk ahead 14-71 -> 1.3-3.3 deg off
    # (3 data sets x 2 seeds), position the same; the wrist model with the warp, two seeds: +1.1 /
    # +1.3 dB one chunk ahead, level or better open loop, the actions worth 7x as much
    main: WorldModelConfig = field(default_factory=lambda: WorldModelConfig(proprio_motion=True))
    wrist: WorldModelConfig = field(default_factory=lambda: WorldModelConfig(view="wrist", condition_on_main=True,
                                                                              proprio_motion=True, wrist_warp=True))
    train: WMTrainConfig = field(default_factory=WMTrainConfig)

    def model(self, view: str) -> WorldModelConfig:
        if view not in VIEWS:
            raise ConfigError(f"view {view!r}: choose one of {', '.join(VIEWS)}")
        return self.main if view == "main" else self.wrist


@dataclass(frozen=True)
class RewardConfig:
    """The frozen success classifier on imagined frames (``wmrl.worldmodel.reward``)."""

    # The cameras it reads, side by side in one image. The wrist camera sees the bowl on the
    # plate from above, where a 64 px main view shows a few pixels of it: on a noisy expert's
    # successes and near misses (bench/RESULTS.md, "A reward that reads both cameras"; two
    # seeds, CPU) episode agreement with the simulator rose from 0.55 / 0.70 to 0.79 / 0.79
    # reading real frames and from 0.45 / 0.52 to 0.65 / 0.58 reading the pair's imagined ones
    views: tuple[str, ...] = ("main", "wrist")
    # Stride-2 3x3 convolutions, then a global mean. Four of them see ~31 px: half a 64 px view but
    # a quarter of the default 128 px one, where the bowl on the plate is a local pattern the mean
    # dilutes. Ten tasks, real frames, two seeds (bench/RESULTS.md "The reward's depth at 128 px"):
    # agreement with the simulator 0.88 at 64 px, 0.81 at 128 px with four layers, 0.91 with five
    # on the CPU's collection; 0.86 and 0.84 on the H200's (fewer held-out successes): +0.04 overall
    channels: tuple[int, ...] = (32, 64, 128, 128, 256)
    steps: int = 1500
    batch: int = 64
    lr: float = 1e-3
    blur_prob: float = 0.5  # "generated-style" augmentation
    noise_std: float = 0.05
    # Random shift (DrQ's augmentation): in training each view moves by up to this fraction of its
    # side (1/16: 4 px at 64 px), edges repeated. Ten tasks, 64 px, 480 training episodes, four seeds
    # (bench/RESULTS.md "A shifted view"): episode agreement with the simulator on real frames
    # 0.779 -> 0.855, every seed up; 1/8 gave the same (0.849, two seeds). 0: off.
    shift: float = 1 / 16
    seed: int = 0
    # Frames the updated world models generate: every training episode replayed open loop with its
    # real actions from its real start, each imagined frame labelled with the real frame's success.
    # They join the training frames, and the threshold is calibrated on the validation episodes' for
    # GRPO's decision: episode success once any generated frame reaches it. 0: real frames only.
    generated_horizon: int = 30  # chunks imagined per episode (a whole 240-step episode)
    generated_batch: int = 128  # episodes imagined at once (bf16 on a GPU; at 32, 10,123 frames took 105 s on an H200)
    # Real training frames from every chunk-boundary phase of recordings made at every step
    # (demonstrations), with the simulator's labels: an episode runs to the end of the chunk in
    # which it succeeds, so it holds several success frames where phase 0 shows one, and the
    # steps just before success are the hardest failures. Ten tasks, 64 px, two seeds: success-once
    # agreement on real frames 0.56 / 0.53 -> 0.63 / 0.73 (bench/RESULTS.md "More success frames
    # for the reward"). The generated frames stay phase 0 (imagination costs per episode)
    all_phases: bool = True
    # Control rollouts as negatives (``wmrl.worldmodel.reward.control_frames``): the pair imagines
    # every training episode's start for ``generated_horizon`` chunks under zero actions ("hold")
    # and/or uniform random ones ("random"), every frame labelled failure. On the H200 a pair called
    # 93-97% of closed-loop rollouts successful for policies the simulator scores 4-63%
    # (bench/RESULTS.md "Every policy succeeds in imagination"): what drift looks like when nothing
    # can succeed is what the reward never saw. Empty: none.
    control_negatives: tuple[str, ...] = ()
    # The generated frames' share of each batch's positives and of its negatives (the rest real);
    # 0: every frame drawn alike. On the H100 pairs the generated frames were ~11% of the training
    # frames, and the reward read imagined frames at 0.50-0.75 balanced against 0.95 on real ones
    # (bench/RESULTS.md "Twice the policy's own episodes"): what GRPO asks of it is what it saw least.
    # Off: at 0.5 with two replays an H100 pair's imagined episodes ranked no better (AUC 0.76 /
    # 0.65, two seeds, against 0.74; bench/RESULTS.md "The pair's frames as half the reward's training").
    generated_share: float = 0.0
    # Open-loop replays of every training episode, each with its own sampler noise: more of the
    # pair's renderings of the same outcome (its success frames are a few dozen per replay). The
    # validation episodes are replayed once (the threshold's calibration, as before).
    generated_samples: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.generated_share < 1 or self.generated_samples < 1:
            raise ConfigError(f"reward: generated_share={self.generated_share} must be in [0, 1) (0: frames drawn alike) "
                              f"and generated_samples={self.generated_samples} >= 1 (replays per training episode)")
        if not set(self.control_negatives) <= {"hold", "random"} or len(set(self.control_negatives)) != len(
                self.control_negatives):
            raise ConfigError(f"reward.control_negatives={self.control_negatives}: any of 'hold' and 'random', each "
                              "once (empty: none)")
        if not self.views or len(set(self.views)) != len(self.views) or not set(self.views) <= {"main", "wrist"}:
            raise ConfigError(f"reward.views={self.views}: one or both of 'main' and 'wrist', each once")
        if not self.channels or any(c < 1 for c in self.channels):
            raise ConfigError(f"reward.channels={self.channels}: give one or more positive widths")
        if self.steps < 1 or self.batch < 2 or self.lr <= 0:
            raise ConfigError("reward: steps >= 1, batch >= 2 (half success, half not) and lr > 0")
        if not 0 <= self.shift < 0.5:
            raise ConfigError(f"reward.shift={self.shift}: a fraction of the view's side in [0, 0.5) (0: off; default 1/16)")
        if self.generated_horizon < 0 or self.generated_batch < 1:
            raise ConfigError("reward: generated_horizon >= 0 (0: real frames only) and generated_batch >= 1")


@dataclass(frozen=True)
class BundleConfig:
    """The bimanual recipe's data: how ``make bimanual-bundle`` generates it (ALOHA) and what it
    mixes in (LIBERO). The recipe's stages are configured by the TOMLs in
    ``data/configs/stage*_*.toml`` (the seed's layout, ``wmrl.bimanual.config``)."""

    tasks: tuple[str, ...] = ("transfer_cube", "insertion")
    episodes_per_task: int = 20
    fail_fraction: float = 0.3  # episodes whose grasp target is shifted (mostly failures)
    image_size: int = 64  # software rendering: keep it small on CPU
    frame_stride: int = 8  # control steps (50 Hz) per frame: one transition = 0.16 s
    max_steps: int = 400  # control steps per episode (the planners' horizon)
    window: int = 16  # transitions per training window (T; T+1 frames)
    window_stride: int = 8
    val_fraction: float = 0.2
    seed: int = 0
    aloha_weight: float = 1.0  # relative source weights, normalised by the kit
    libero_weight: float = 0.5
    libero_episodes: int = 0  # 0: every episode of DATA

    def __post_init__(self) -> None:
        TASKS = ("transfer_cube", "insertion")  # the scripted ALOHA tasks of ``wmrl.bimanual.aloha``

        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ConfigError(f"tasks={self.tasks}: choose from {TASKS}")
        if self.episodes_per_task < 1:
            raise ConfigError(f"episodes_per_task={self.episodes_per_task}: must be >= 1 (EPISODES=...)")
        if not 0 <= self.fail_fraction <= 1:
            raise ConfigError(f"fail_fraction={self.fail_fraction}: use 0..1")
        if not 16 <= self.image_size <= 256 or self.image_size % 8:
            raise ConfigError(f"image_size={self.image_size}: use a multiple of 8 in 16..256 (64 on CPU)")
        if self.frame_stride < 1 or self.max_steps < self.frame_stride:
            raise ConfigError(f"frame_stride={self.frame_stride}, max_steps={self.max_steps}: "
                              "need 1 <= frame_stride <= max_steps")
        if self.window < 1 or self.window_stride < 1:
            raise ConfigError("window and window_stride must be >= 1")
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"val_fraction={self.val_fraction}: use 0 <= f < 1")
        if self.aloha_weight <= 0 or self.libero_weight <= 0:
            raise ConfigError("source weights must be positive (they are relative; the kit normalises them)")


GRPO_ENVS = ("sim", "wm")
GRPO_TRAINABLE = ("expert", "all")
WORLD_NOISE = ("group", "rollout")  # GRPOConfig.world_noise
REWARD_THRESHOLDS = ("pair", "closed-loop")  # GRPOConfig.reward_threshold, besides a number


def _number(text: str) -> float:
    """``text`` as a float, or NaN (which fails every range check)."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


# GRPO in imagination refuses a pair measured below this agreement with the simulator (balanced
# accuracy of episode success, `make wm-eval`). On an H100 (RESULTS.md, "GRPO in a pair at chance")
# a pair at 0.50, whose reward found none of the held-out successes, took GRPO's two seeds from
# 65.4% to 64.0% and 56.0% real success: in such a pair the policy learns the reward model's errors.
MIN_AGREEMENT = 0.6


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative policy optimisation of the flow-matching policy (``wmrl.rl.grpo``).

    A step: ``groups`` start states x ``group_size`` rollouts each (flow-SDE, temperature 1),
    reward = success-once, advantage = (reward - group mean) / (group std + eps), then a
    PPO-clipped update of the chain log-probabilities (RLinf / Flow-GRPO). Cadence of the
    original: a policy checkpoint and a real evaluation every ``eval_interval`` steps, the
    full state every ``full_interval`` steps and at the last one.
    """

    env: str = "sim"  # sim: the real simulator (reward = success); wm: imagination in the model pair
    group_size: int = 8  # rollouts that share a start state
    # Start states per step. 64 x 8 = 512 rollouts, RLinf's step for pi0 on LIBERO: measured on real
    # rollouts of the supervised policy (bench/grpo_signal.py, RESULTS.md), one group's policy gradient
    # is almost all noise (two groups' gradients are orthogonal, even for the same task): the squared
    # signal is indistinguishable from zero, and even at two standard errors above its estimate a step
    # needs 26-114 groups (by estimator) before its signal matches its noise. The ten H200 runs with
    # 4-8 groups per step never gained beyond their spread; the first with 64 (run 11) gained 5-7
    # points (ODE, 10 x 50) in 4-6 steps of ~2 minutes on one H200.
    groups: int = 64
    max_chunks: int = 30  # 240 policy steps
    # In imagination (env=wm): chunks in a row at the reward's threshold that make a success. 1 is
    # the first crossing. On the H200 pair trained on the policy's own episodes (RESULTS.md), 5 of
    # the 6 failures that succeeded in imagination crossed for a single chunk and fell back; 2 asks
    # the next chunk, which the policy acts in too, to still look like success.
    success_chunks: int = 1
    # In imagination (env=wm): whose starting noise the world models' samplers draw for a frame.
    # "group": the members of a group share it, chunk by chunk (common random numbers, PEGASUS's
    # fixed scenarios): as in the simulator, whose physics is deterministic, members that act alike
    # see alike frames and their outcomes differ by what they did. "rollout": each draws its own,
    # and part of a group's spread of outcomes is the samplers' noise, which the group-relative
    # advantage credits to the actions. Same expected gradient (the noise is drawn apart from the
    # policy's); on the H200 pair GRPO in imagination with "rollout" never raised the imagined
    # success over nine steps (RESULTS.md), "group" is not yet measured there.
    world_noise: str = "group"
    # In imagination (env=wm): refuse a pair whose agreement with the simulator, as `make wm-eval`
    # measured it for this very pair.json, lies below this with its whole 95% interval (0: never
    # refuse). A pair that was not evaluated is only named in the log.
    min_agreement: float = MIN_AGREEMENT
    # In imagination (env=wm): at most this many rollouts imagined at once; a step of more runs its
    # groups in slices (whole groups: a group's shared world noise stays shared), the same outcomes
    # with GPU memory bounded. 256 groups x 8 = 2,048 rollouts a step, the policy and both world
    # models in the loop, two runs sharing one GPU: the slice keeps each run's peak where 128 groups put it.
    wm_batch: int = 1024
    # In imagination (env=wm): the reward probability that makes a success. "pair": the threshold
    # the pair's reward was calibrated to (on replays of recorded actions: open loop);
    # "closed-loop": PAIR/closed_loop.json (`make wm-calibrate`: the policy acting in the pair from
    # held-out keyframes it recorded); or a number. Closed loop the policy's imagined completions
    # read lower: in an H100 pair's students (calibrated 0.74) the imagined successes from starts
    # of the policy's own recorded episodes rose from 28-31% to 40-48% at 0.3 (recorded 60%), and
    # told the recorded successes from the failures better (balanced 0.69-0.70 -> 0.74;
    # bench/RESULTS.md, "256 groups a step in the one-step students")
    reward_threshold: str = "pair"
    # In imagination (env=wm): start only from keyframes of episodes whose recording policy's id
    # matches this pattern (shell-style; "*": all the pair's keyframes). The manifest names each
    # episode's policy, e.g. "flow-policy@step4000-sde-K10-T1"; "*-T1" keeps the episodes recorded
    # at the rollouts' own temperature. In an H100 pair the T = 3 episodes' keyframes, nearly half
    # of a step's starts, gave the T = 1 policy 10-11% imagined success: their groups mostly all
    # failed (bench/RESULTS.md, "256 groups a step in the one-step students")
    start_recorded_by: str = "*"
    noise_level: float = 0.5  # flow-SDE noise level of the rollouts
    temperature: float = 1.0  # SDE temperature of the rollouts (evaluation keeps its own)
    lr: float = 5e-6  # the first step's; RLinf's for pi0 (with desired_kl > 0 the lr then follows the measured KL)
    # Adaptive step size (RSL-RL's "adaptive" schedule): after each step's update the approximate KL
    # between the policy that acted and the updated one is measured on the step's chunks; above
    # 2 x desired_kl the lr is divided by 1.5, below desired_kl / 2 multiplied by 1.5, within
    # [lr_min, lr_max]. Measured on the H200 (bench/RESULTS.md, GRPO runs 2 and 3): the KL one
    # step causes changes about 25-fold between lr 1e-5 and 5e-5, and the collapse came with the
    # larger, so no fixed lr suits every policy. 0: the lr stays fixed.
    desired_kl: float = 0.01
    lr_min: float = 1e-7
    # The ceiling is what the one run that gained reached (run 4: 4.5e-5, +3.0 over two seeds); every
    # run whose lr passed 5e-5 lost ground or collapsed (runs 3, 5: -5; runs 8, 9 at 1e-4: to 0-15%),
    # while its measured KL still sat near desired_kl: on this policy the KL alone does not bound the harm.
    lr_max: float = 4.5e-5
    weight_decay: float = 0.0
    # What GRPO trains: "expert" = the action expert (everything that turns the prefix tokens and
    # the noisy chunk into a velocity); the image, language and proprio encoders stay as the
    # supervised policy left them. RLinf's pi0 GRPO on LIBERO does the same (train_expert_only):
    # a noisy policy gradient then cannot wear away the visual features. "all": every parameter.
    trainable: str = "expert"
    adam_betas: tuple[float, float] = (0.9, 0.95)  # RLinf's embodied GRPO (a shorter second-moment memory)
    adam_eps: float = 1e-5  # damps the steps of weights whose gradient is near zero (Adam's 1e-8 does not)
    grad_clip: float = 1.0
    clip_low: float = 0.2  # PPO ratio clip: [1 - clip_low, 1 + clip_high] (RLinf's 0.2 / 0.28)
    clip_high: float = 0.28
    kl_coef: float = 0.0  # 0: no KL term (the default of RLinf's GRPO for VLAs)
    # An element's log-probability over its K denoising transitions: "sum" is the joint density of its
    # chain (the ratio sees the whole change); "mean" is RLinf's joint_logprob average, K times more
    # permissive under the same clip band.
    logprob_reduce: str = "sum"
    # Which denoising transitions enter the ratio: 0 = all K (the exact chain density); N = the
    # first N, the noisiest. A transition's score scales as 1 / its std (flow-SDE, noise level 0.5,
    # K = 10: std 0.50 at the first transition, 0.053 at the last), while each moves the action by
    # about its std, so the late transitions add most of the gradient's variance and little of
    # its signal; dropping them treats their noise as the environment's. On a CPU toy
    # (bench/grpo_snr.py) N = 3 doubled the gradient's batch-to-batch agreement but learned no
    # faster than all K; on the H200 (GRPO runs 8 and 9) N = 3 collapsed the policy within 10-15
    # steps (RESULTS.md), so all K is the default.
    ratio_transitions: int = 0
    # Where the rollouts' exploration noise goes: "all" K denoising transitions are stochastic (the
    # ratio is the whole chain's density), or "one", drawn uniformly per chunk, while the others
    # are the deterministic ODE steps (RLinf's flow-SDE setting, joint_logprob=False: the rollouts
    # stay close to the ODE policy, the ratio is one Gaussian transition, the update's recompute
    # one velocity evaluation per chunk instead of K).
    noisy_transitions: str = "all"
    # "sequence": every rollout weighs the same (GRPO's 1/|o_i|), so the long failed rollouts (30 chunks)
    # do not outweigh the short successful ones; "token": every chunk weighs the same.
    loss_agg: str = "sequence"
    # Log whether a step of this many rollouts carries a direction or mostly noise: every group's
    # policy gradient before the update gives the squared signal, one group's noise and the cosine
    # between the even and odd groups (``grpo.gradient_agreement``). It costs one more forward and
    # backward pass over the step's chunks (a third of the update on the H200), so it runs at the
    # first step and then every N steps (0: never, 1: every step).
    grad_agreement_interval: int = 5
    target_kl: float = 0.02  # stop a step's update once the approximate KL per element passes this (0: never)
    epochs: int = 1  # passes over each step's rollouts
    minibatches: int = 16  # optimizer steps per pass (the chunks split evenly; ~750 chunks each at 512 rollouts)
    # At most this many chunks per forward and backward pass: a minibatch of more accumulates its
    # gradient over several passes before its one optimizer step (the same update, bounded memory).
    # The default policy's update holds ~45 MiB of activations a chunk in fp32 (CPU, K = 10;
    # roughly half under bf16): 4x the groups of a step would put ~2,000 chunks in a minibatch.
    micro_chunks: int = 512
    adv_eps: float = 1e-6
    eval_interval: int = 5  # policy weights + a real-simulator evaluation every N steps
    full_interval: int = 10  # the full state (optimizer, RNG, position) every N steps and at the last
    eval_trials: int = 5  # fixed initial states per task at the periodic evaluations
    final_trials: int = TRIALS_PER_TASK  # at the last step: the full 10 x 50
    eval_sampler: str = "sde"  # the evaluations' sampler: sde at the policy's temperature_eval, or ode
    # The SDE evaluations' temperature; 0: the policy's own temperature_eval (1.6, the original's).
    # 1 evaluates the sampler the rollouts train (temperature 1), which GRPO improves directly
    # (the ODE and T = 1.6 evaluations are other samplers of the same weights)
    eval_temperature: float = 0.0
    tasks: tuple[int, ...] = tuple(range(NUM_SPATIAL_TASKS))
    seed: int = 0
    bf16: bool = True  # autocast on GPU
    # The control-step loop of the real simulator's training rollouts (SimConfig.train_physics;
    # "" = the evaluations' SimConfig.physics, which the fixed evaluation states always keep).
    # "lean" skips the controller's redundant forward pass (bench/physics_passes.py: 1.4x less
    # physics per step, trajectories within solver tolerance of robosuite's). GRPO-shaped rollout
    # steps on the H200 host, 16 workers, both orders: 393 -> 557 and 419 -> 506 env steps/s
    # (1.42x, 1.21x; bench/RESULTS.md), i.e. that many more episodes per minute of GRPO.
    rollout_physics: str = "lean"
    # Imagination only: a keyframe is a real boundary frame this many chunks or fewer into its
    # episode (0: episode starts only), never one where the goal already holds.
    keyframe_max_chunk: int = 8
    keyframes_per_task: int = 50

    def __post_init__(self) -> None:
        if self.env not in GRPO_ENVS:
            raise ConfigError(f"grpo.env={self.env!r}: choose sim (the real simulator) or wm (the world models)")
        if self.group_size < 2:
            raise ConfigError(f"grpo.group_size={self.group_size}: a group needs >= 2 rollouts to compare (8 default)")
        if self.groups < 1 or self.max_chunks < 1:
            raise ConfigError("grpo: groups and max_chunks must be >= 1")
        if not 1 <= self.success_chunks <= self.max_chunks:
            raise ConfigError(f"grpo.success_chunks={self.success_chunks}: 1 (the first chunk at the reward's "
                              f"threshold) up to max_chunks={self.max_chunks} chunks in a row")
        if self.world_noise not in WORLD_NOISE:
            raise ConfigError(f"grpo.world_noise={self.world_noise!r}: group (a group's rollouts share the world "
                              "models' sampler noise) or rollout (each its own)")
        if not 0 <= self.min_agreement <= 1:
            raise ConfigError(f"grpo.min_agreement={self.min_agreement}: a balanced accuracy in 0..1 (0: GRPO trains "
                              "in any pair, however it agrees with the simulator)")
        if self.noise_level <= 0 or self.temperature <= 0:
            raise ConfigError("grpo: noise_level and temperature must be > 0 (the ODE has no log-probability)")
        if not 0 < self.lr < 1 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("grpo: 0 < lr < 1, weight_decay >= 0, grad_clip >= 0 (0: off)")
        if self.trainable not in GRPO_TRAINABLE:
            raise ConfigError(f"grpo.trainable={self.trainable!r}: choose expert (the action expert only) or all")
        if not all(0 <= b < 1 for b in self.adam_betas) or len(self.adam_betas) != 2 or self.adam_eps <= 0:
            raise ConfigError(f"grpo: adam_betas={self.adam_betas} must be two numbers in [0, 1) and "
                              f"adam_eps={self.adam_eps} > 0")
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise ConfigError(f"grpo: clip_low={self.clip_low} must be in (0, 1) and clip_high={self.clip_high} > 0")
        if self.desired_kl < 0 or not 0 < self.lr_min <= self.lr_max < 1 or \
                (self.desired_kl > 0 and not self.lr_min <= self.lr <= self.lr_max):
            raise ConfigError(f"grpo: desired_kl={self.desired_kl} must be >= 0 (0: fixed lr) and "
                              f"lr_min={self.lr_min} <= lr={self.lr} <= lr_max={self.lr_max} (all in (0, 1))")
        if self.kl_coef < 0 or self.epochs < 1 or self.minibatches < 1 or self.adv_eps <= 0 or self.target_kl < 0:
            raise ConfigError("grpo: kl_coef >= 0, epochs >= 1, minibatches >= 1, adv_eps > 0, target_kl >= 0")
        if self.reward_threshold not in REWARD_THRESHOLDS and not 0 < _number(self.reward_threshold) < 1:
            raise ConfigError(f"grpo.reward_threshold={self.reward_threshold!r}: pair (the reward's own calibration), "
                              "closed-loop (PAIR/closed_loop.json, make wm-calibrate) or a probability in (0, 1)")
        if not self.start_recorded_by or (self.start_recorded_by != "*" and self.env != "wm"):
            raise ConfigError(f"grpo.start_recorded_by={self.start_recorded_by!r}: a pattern of the recording policy's "
                              "id for imagined starts (env=wm), e.g. '*-T1'; '*' keeps every keyframe")
        if self.wm_batch < self.group_size:
            raise ConfigError(f"grpo.wm_batch={self.wm_batch}: rollouts imagined at once, at least one group "
                              f"(group_size={self.group_size}); 1024 default, fewer for less GPU memory")
        if self.micro_chunks < 1:
            raise ConfigError(f"grpo.micro_chunks={self.micro_chunks}: chunks per forward/backward pass, >= 1 "
                              "(512; fewer for less GPU memory)")
        if self.ratio_transitions < 0:
            raise ConfigError(f"grpo.ratio_transitions={self.ratio_transitions}: 0 (all K transitions) or N >= 1 "
                              "(the first N)")
        if self.noisy_transitions not in ("all", "one"):
            raise ConfigError(f"grpo.noisy_transitions={self.noisy_transitions!r}: all (every denoising transition "
                              "stochastic) or one (one per chunk, the others ODE steps)")
        if self.noisy_transitions == "one" and self.ratio_transitions:
            raise ConfigError("grpo: ratio_transitions selects among K stochastic transitions; with "
                              "noisy_transitions=one there is one, so leave ratio_transitions at 0")
        if self.logprob_reduce not in ("sum", "mean") or self.loss_agg not in ("sequence", "token"):
            raise ConfigError(f"grpo: logprob_reduce={self.logprob_reduce!r} (sum | mean), loss_agg={self.loss_agg!r} "
                              "(sequence | token)")
        if self.eval_interval < 1 or self.full_interval < 1:
            raise ConfigError("grpo: eval_interval and full_interval must be >= 1")
        if self.grad_agreement_interval < 0:
            raise ConfigError(f"grpo.grad_agreement_interval={self.grad_agreement_interval}: 0 (never), 1 (every "
                              "step) or N (the first step and every N-th after it)")
        if self.full_interval % self.eval_interval:
            raise ConfigError(f"grpo.full_interval={self.full_interval} must be a multiple of "
                              f"eval_interval={self.eval_interval} (a full state is also a policy checkpoint): pass "
                              f"--full-interval {self.eval_interval * max(1, self.full_interval // self.eval_interval)} "
                              "or an --eval-interval that divides it")
        for name in ("eval_trials", "final_trials"):
            if not 1 <= getattr(self, name) <= TRIALS_PER_TASK:
                raise ConfigError(f"grpo.{name}={getattr(self, name)}: use 1..{TRIALS_PER_TASK} fixed states per task")
        if self.eval_sampler not in EVAL_SAMPLERS:
            raise ConfigError(f"grpo.eval_sampler={self.eval_sampler!r}: choose one of {', '.join(EVAL_SAMPLERS)}")
        if not 0.0 <= self.eval_temperature <= 10.0:
            raise ConfigError(f"grpo.eval_temperature={self.eval_temperature}: use a value in 0..10 (0: the policy's "
                              "own temperature_eval)")
        if self.eval_temperature and self.eval_sampler != "sde":
            raise ConfigError(f"grpo.eval_temperature={self.eval_temperature} is the SDE sampler's; with "
                              f"eval_sampler={self.eval_sampler!r} leave it at 0 (or evaluate with eval_sampler=sde)")
        if self.rollout_physics not in ("", *PHYSICS_LOOPS):
            raise ConfigError(f"grpo.rollout_physics={self.rollout_physics!r}: choose from {', '.join(PHYSICS_LOOPS)} "
                              "or '' (the evaluations' loop)")
        _check_tasks(self.tasks, "grpo")
        if self.keyframe_max_chunk < 0 or self.keyframes_per_task < 1:
            raise ConfigError("grpo: keyframe_max_chunk >= 0 and keyframes_per_task >= 1")

    @property
    def rollouts(self) -> int:
        return self.groups * self.group_size


@dataclass(frozen=True)
class CycleConfig:
    """``make cycle`` (seed 000's loop): collect with the current policy -> manifest -> both
    world models updated -> reward model -> pair -> GRPO inside the pair -> real evaluation.
    The collection's size is ``collect.episodes``; the world-model update's ``wm.train.steps``."""

    grpo_steps: int = 20  # GRPO steps per cycle (the seed's 60 -> 80)
    val_ratio: float = 0.2  # the manifest's validation share
    new_ratio: float = 0.5  # probability that a world-model training sample comes from this cycle's data
    wm_eval_episodes: int = 20  # held-out episodes replayed in the pair (agreement, fidelity)
    videos: int = 2  # real-vs-imagined videos in the report
    gpu_margin_gib: float = 3.5  # pre-flight: a selected GPU may have at most this much memory in use by others
    # the world-model update's time limit in minutes (both views stop by the seed's rule once it
    # is reached, or at wm.train.steps if sooner); 0: none. MAX_MINUTES on the command line wins
    wm_max_minutes: float = 0.0
    # GRPO's imagined success rule in the cycle (grpo.success_chunks: chunks in a row at the
    # reward's threshold); the cycle's wm-eval reports the episode agreement under 1, 2 and 3
    success_chunks: int = 1
    # GRPO's floor on the pair's agreement with the simulator, which the cycle's wm-eval measures
    # just before (grpo.min_agreement; 0: GRPO trains in any pair)
    min_agreement: float = MIN_AGREEMENT
    # GRPO in the world models' one-step students instead of the updated models themselves: after
    # wm_eval the cycle distils them (make wm-distill), trains their own reward, packs and measures
    # their pair, and GRPO rolls out there. On an H100 the students' rollouts took half the time
    # with GRPO's real result no worse (bench/RESULTS.md, nineteenth session); the next cycle's
    # update still continues from the updated models, not the students.
    students: bool = False
    # Before GRPO, calibrate the reward's threshold closed loop (make wm-calibrate: the policy that
    # collected this cycle's data acting in GRPO's pair from the held-out keyframes it recorded) and
    # let GRPO decide imagined success with it (--reward-threshold closed-loop). In an H100 pair's
    # students a third to a half of the gap between imagined and recorded success was the replay-
    # calibrated threshold (bench/RESULTS.md, twentieth session). With own_starts, on an H100 the
    # policy's imagined success came within 4-12 points of its recorded one (20-28% vs 56-60%
    # before), GRPO raised it 7-13 points in six steps, and the real simulator did not follow
    # (-3.4 +- 3.5; bench/RESULTS.md, twenty-second session): off until a gain is measured.
    closed_loop_threshold: bool = False
    # GRPO starts only from keyframes of this cycle's episodes collected by the policy it trains, at
    # GRPO's own temperature (grpo.start_recorded_by; the collection's extra temperatures' episodes,
    # mostly failures with the arm in odd places, still train the world models). Measured with the
    # closed-loop threshold above: see there.
    own_starts: bool = False

    def __post_init__(self) -> None:
        if self.success_chunks < 1:
            raise ConfigError(f"cycle.success_chunks={self.success_chunks}: 1 (the first chunk at the threshold) or "
                              "more chunks in a row")
        if not 0 <= self.min_agreement <= 1:
            raise ConfigError(f"cycle.min_agreement={self.min_agreement}: a balanced accuracy in 0..1 (0: GRPO trains "
                              "in any pair)")
        if self.grpo_steps < 1:
            raise ConfigError(f"cycle.grpo_steps={self.grpo_steps}: must be >= 1 (GRPO_STEPS=20)")
        if not 0 < self.val_ratio < 1 or not 0 <= self.new_ratio <= 1:
            raise ConfigError("cycle: val_ratio in (0, 1) and new_ratio in [0, 1] (0.2 and 0.5 in the original)")
        if self.wm_eval_episodes < 1 or self.videos < 0 or self.gpu_margin_gib < 0 or self.wm_max_minutes < 0:
            raise ConfigError("cycle: wm_eval_episodes >= 1, videos >= 0, gpu_margin_gib >= 0, wm_max_minutes >= 0")


@dataclass(frozen=True)
class Profile:
    name: str
    sim: SimConfig = field(default_factory=SimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    demos: DemoConfig = field(default_factory=DemoConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    wm: WMProfile = field(default_factory=WMProfile)
    distill: DistillConfig = field(default_factory=DistillConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    cycle: CycleConfig = field(default_factory=CycleConfig)
    bimanual: BundleConfig = field(default_factory=BundleConfig)

    def __post_init__(self) -> None:
        """Where configs meet: one chunk size, one action/proprio dimension. (Image sizes are
        checked where data meets a model: a checkpoint or a pair against the simulator.)"""
        chunks = {"sim": self.sim.chunk_size, "policy": self.policy.chunk_size,
                  "wm.main": self.wm.main.chunk_size, "wm.wrist": self.wm.wrist.chunk_size}
        if len(set(chunks.values())) > 1:
            raise ConfigError(f"profile {self.name}: chunk sizes differ ({chunks}); they must agree")
        for part in (self.policy, self.wm.main, self.wm.wrist):
            if (part.action_dim, part.proprio_dim) != (ACTION_DIM, PROPRIO_DIM):
                raise ConfigError(f"profile {self.name}: action/proprio dimensions must be {ACTION_DIM}/{PROPRIO_DIM} "
                                  "(the simulator's)")


# The CPU toy keeps every pixel (no patches, no refine head): 60 k parameters learn a 64 px frame
# in the few updates the tests can afford; the patched path has tests of its own
_TINY_WM = dict(image_size=64, channels=(8, 16), blocks_per_level=1, cond_dim=32, proprio_hidden=32, sample_steps=2,
                patch=1, refine=0)
_PROFILES: dict[str, Profile] = {
    # The GPU server's profile trains the world models compiled: H200, micro batch 256, 3,944 ->
    # 4,683 samples/s (first update ~45 s; bench/RESULTS.md "Batch 256 and action history"), and at
    # 1,024 NHWC inside the graph adds 1.21x, the fast kernels 1.04x more at 4,096 (H100). Eager:
    # make wm-update COMPILE=0 (wm_update.py --no-compile); plain kernels: wm_update.py --no-fast-kernels
    "default": Profile(name="default", wm=WMProfile(train=WMTrainConfig(compile=True, fast_kernels=True))),
    "tiny": Profile(
        name="tiny",
        sim=SimConfig(image_size=64),
        eval=EvalConfig(tasks=(0, 1), trials=2, videos=0),
        demos=DemoConfig(tasks=(0,), episodes=2, frame_interval=0),
        collect=CollectConfig(tasks=(0,), episodes=2, extra_temperatures=(), frame_interval=0),
        policy=PolicyConfig(channels=(8, 16), grid=2, width=32, heads=2, encoder_layers=1, expert_layers=1,
                            mlp_ratio=2, denoise_steps=4),
        sft=SFTConfig(steps=30, batch_size=16, lr=3e-3, warmup=2, ema=0.9, save_interval=10, full_interval=10,
                      eval_interval=10, log_interval=5, val_ratio=0.5, bf16=False),
        wm=WMProfile(main=WorldModelConfig(proprio_motion=True, **_TINY_WM),
                     wrist=WorldModelConfig(view="wrist", condition_on_main=True, proprio_motion=True, wrist_warp=True,
                                            **_TINY_WM),
                     train=WMTrainConfig(steps=6, micro_batch=4, grad_accum=2, lr=2e-3, warmup=1, save_interval=3,
                                         eval_interval=3, log_interval=1, val_batches=1)),
        distill=DistillConfig(steps=4, batch=4, lr=1e-3, save_interval=2, log_interval=1, val_transitions=8),
        reward=RewardConfig(channels=(8, 16), steps=20, batch=16, lr=3e-3),
        grpo=GRPOConfig(group_size=2, groups=2, max_chunks=3, lr=1e-3, lr_max=1e-2, minibatches=2, eval_interval=1,
                        full_interval=2, eval_trials=1, final_trials=1, tasks=(0,), keyframe_max_chunk=2,
                        keyframes_per_task=4, bf16=False, min_agreement=0.0),  # tiny pairs are untrained
        cycle=CycleConfig(grpo_steps=2, wm_eval_episodes=2, videos=1, gpu_margin_gib=3.5, min_agreement=0.0),
        bimanual=BundleConfig(episodes_per_task=2, fail_fraction=0.5, image_size=32, frame_stride=40, max_steps=400,
                              window=4, window_stride=2, val_fraction=0.25, libero_episodes=2),
    ),
    # `make speedrun` on one H200 (16 cores): the default models and algorithms, fewer of what
    # the clock is spent on. Measured as one run (bench/RESULTS.md, "make speedrun on one H200,
    # one run from nothing"): 300 demonstrations 111 s, SFT 3,000 x 256 197 s, 200 collected
    # episodes 111 s, the world models 201 s for a 3-minute limit (~550 updates per view, both
    # views on the GPU while the start policy's 10 x 50 evaluation runs beside them), reward 78 s,
    # GRPO's 10 steps in imagination ~70 s and the final 10 x 50 evaluation ~165 s: 16.8 min.
    # The world models get 2 of the 3 minutes left of the 20 (at most 1,500 updates, whose
    # cosine schedule then ends, or 5 minutes: ~18.8 min, not yet measured), since they are
    # what GRPO in imagination lacks. GRPO evaluates only at its last step here (a
    # 50-episode evaluation at step 5 cost 45 s and says little).
    "speedrun": Profile(
        name="speedrun",
        demos=DemoConfig(episodes=30),
        collect=CollectConfig(episodes=20, extra_temperatures=(), frame_interval=0),  # as timed
        sft=SFTConfig(steps=3000, warmup=300, save_interval=1000, full_interval=1000),
        # the default batch of 256 (one micro batch); at most 1,500 updates or the cycle's minutes
        wm=WMProfile(train=WMTrainConfig(steps=1500, save_interval=250, eval_interval=250)),
        reward=RewardConfig(steps=500),
        # the speedrun's GRPO keeps the small steps its 20-minute timing was measured with; such steps
        # carry no measurable gradient signal (RESULTS.md), so its GRPO shows the loop, not a gain,
        # and its three-minute pair is not asked to agree with the simulator (min_agreement 0)
        grpo=GRPOConfig(eval_interval=10, groups=8, minibatches=4, min_agreement=0.0),
        cycle=CycleConfig(grpo_steps=10, wm_max_minutes=5.0, min_agreement=0.0),
    ),
}
# Component names: "grpo" is the default profile's GRPO settings, "grpo_tiny" the tiny one's.
_PARTS = tuple(f.name for f in dataclasses.fields(Profile) if f.name != "name")


def config_names() -> list[str]:
    """Every name ``get_config`` knows: profiles and ``<part>`` / ``<part>_<profile>``."""
    names = list(_PROFILES)
    for part in _PARTS:
        names += [part] + [f"{part}_{p}" for p in _PROFILES if p != "default"]
    return names


def get_config(name: str) -> Any:
    """A registered profile or one part of it (``grpo``, ``grpo_tiny``, ``wm_tiny`` ...)."""
    if name in _PROFILES:
        return _PROFILES[name]
    part, _, prof = name.partition("_")
    if part in _PARTS and (prof or "default") in _PROFILES:
        return getattr(_PROFILES[prof or "default"], part)
    import difflib

    close = difflib.get_close_matches(name, config_names(), n=3)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise ConfigError(f"unknown config {name!r}{hint}; choose one of: {', '.join(sorted(_PROFILES))} "
                      f"or a part of one ({', '.join(_PARTS)}, e.g. grpo_tiny)")


def get_profile(name: str) -> Profile:
    """A registered profile (``default``, ``tiny``, ``speedrun``)."""
    if name not in _PROFILES:
        get_config(name)  # the "did you mean" message for near misses
        raise ConfigError(f"{name!r} is a part of a profile, not a profile; choose one of: {', '.join(sorted(_PROFILES))}")
    return _PROFILES[name]


def profile_names() -> list[str]:
    return sorted(_PROFILES)


def override(cfg: Any, **changes: Any) -> Any:
    """Return ``cfg`` with the non-None ``changes`` applied (validated by ``__post_init__``)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def parse_tasks(text: str | None) -> tuple[int, ...] | None:
    """Parse ``TASKS`` as given on the command line: ``0,3,5`` or ``0-4`` or ``all``."""
    if text is None or text == "":
        return None
    if text == "all":
        return tuple(range(NUM_SPATIAL_TASKS))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = part.split("-")
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ConfigError(f"TASKS={text!r}: use indices like 0,3,5 or a range 0-4 or 'all'") from None
    _check_tasks(tuple(out), "TASKS")
    return tuple(dict.fromkeys(out))


def as_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
