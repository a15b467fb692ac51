"""Typed configuration of the bimanual recipe's stages: one TOML per stage.

Stage configs live in ``data/configs/stage{0..3}_*.toml``. A TOML has the sections of
``StageConfig`` (``job``, ``data``, ``model``, ``trainer``, ``checkpoint``, ``ema``,
``parallelism``, and for Stages 2 and 3 ``distill``) and an optional ``[tiny]`` table of
overrides for CPU runs (``--profile tiny``). String values may name environment variables as
``${VAR}`` or ``${VAR:-default}`` (``BIMANUAL_BUNDLE``, ``BIMANUAL_STAGE0_CHECKPOINT`` ...). Command-line
overrides are dotted ``section.key=value`` pairs, e.g. ``trainer.max_iter=12
checkpoint.save_iter=12`` for the 12-iteration smoke run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wmrl.config import ConfigError

STAGES = {0: "bidirectional", 1: "teacher_forcing", 2: "tf_dcm", 3: "sf_dmd"}
REFERENCE_ITERS = {0: 35_000, 1: 8_000, 2: 4_000, 3: 1_500}
PARENT_STAGE = {1: 0, 2: 1, 3: 2}
REFERENCE_STAGE = 0  # Stage 3's real score and critic start from this stage's EMA (checkpoint.reference)
DISTILL_STAGES = (2, 3)
# the model's action modules, which a base checkpoint does not have (``wmrl.bimanual.model``);
# here, without torch, so the JSON-only plan can name them
NEW_ACTION_MODULES = ("action_encoder", "domain_embedding", "action_modulation", "action_token", "action_readout")
# what may differ between a stage and its parent without changing a single weight
NON_ARCH_MODEL_KEYS = ("denoise_steps", "time_shift")


# The bundle's settings (``BundleConfig``) live in the kit's one registry: ``wmrl.config``,
# ``get_config("bimanual")`` / ``get_config("bimanual_tiny")``.


# ------------------------------------------------------------------------------ the stages
@dataclass(frozen=True)
class JobConfig:
    name: str = "bimanual_stage0"  # the run name; reruns with the same name resume
    output_root: str = "runs/bimanual"  # checkpoints: <output_root>/<name>/checkpoints/iter_XXXXXXXXX
    stage: int = 0
    wandb_mode: str = "disabled"  # logging goes to <run>/log.jsonl; no W&B key needed

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(f"job.stage={self.stage}: stages are 0..3")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or ""):
            raise ConfigError(f"job.name={self.name!r}: use letters, digits, '_', '-', '.' (a unique run name per stage)")
        if self.wandb_mode != "disabled":
            raise ConfigError(f"job.wandb_mode={self.wandb_mode!r}: only 'disabled' (metrics go to log.jsonl)")


@dataclass(frozen=True)
class DataConfig:
    bundle: str = ""  # a finished training bundle (make bimanual-bundle)
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.bundle:
            raise ConfigError("data.bundle is empty: set BIMANUAL_BUNDLE or DATA=<bundle folder> (make bimanual-bundle builds one)")
        if self.batch_size < 1:
            raise ConfigError(f"data.batch_size={self.batch_size}: must be >= 1")


@dataclass(frozen=True)
class ModelConfig:
    """The video generator (``wmrl.bimanual.model``); frames come from the bundle's size."""

    patch: int = 8  # pixels per token side (pixel space at small sizes)
    width: int = 256
    depth: int = 8
    heads: int = 8
    mlp_ratio: int = 4
    block_frames: int = 1  # frames per autoregressive block
    caption_dim: int = 128
    max_frames: int = 64  # temporal positions
    denoise_steps: int = 8  # Euler steps per block when generating
    # Predict each frame as the last clean frame before its block plus a learned change. The
    # output layer starts at zero, so an untrained model already copies the last frame, the
    # baseline that consecutive, nearly identical frames make strong (Stage 1 at 12% of its
    # budget: 29.86 dB against copy-last's 32.66); training only has to learn the motion.
    # Saved with every checkpoint; all four stages of one recipe must agree (checked on load).
    residual: bool = False
    # Condition each frame also on its action's step: this transition's command minus the last
    # one's (masked where either is missing). The commands are absolute poses and joint targets;
    # the frame's motion follows their change (alone it moved nothing on the CPU; with
    # ``action_readout`` it adds 0.07 dB pooled and half again the action response, bench/RESULTS.md).
    # Saved with every checkpoint; all four stages agree.
    action_step: bool = False
    # Shift the flow's noise levels towards pure noise, t' = s t / (1 + (s - 1) t), in training
    # and in the Euler steps (SD3's and Wan's timestep shift). Consecutive frames differ by a
    # few pixels, so a half-noised frame still shows where the arm went and the model learns to
    # denoise instead of reading the actions; only near pure noise do the actions decide. 1: off.
    time_shift: float = 1.0
    # Also give each frame its action as one more token that the frame's patches attend to (as
    # video world models put actions in the sequence), besides the adaLN modulation: a patch
    # can then ask the action where to move, instead of every patch getting the same
    # scale and shift (on the CPU it did not make the tiny model read them either: off). Saved
    # with every checkpoint; all four stages agree.
    action_tokens: bool = False
    # With ``residual``: add a linear map of the frame's action features to its pixels to the
    # anchor (zero at the start). A ridge regression from the actions to the frame's change
    # beats copy-last by 0.5 dB pooled on the 200-episode bundle, while the tiny DiT, with
    # or without action tokens, stays at copy-last and ignores its actions; with this path it
    # reads them and beats copy-last pooled (bench/bimanual_action_probe.py, bench/RESULTS.md).
    action_readout: bool = False

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ConfigError(f"model.width={self.width} must be divisible by model.heads={self.heads}")
        if self.patch < 1 or self.depth < 1 or self.block_frames < 1 or self.denoise_steps < 1:
            raise ConfigError("model.patch, depth, block_frames and denoise_steps must be >= 1")
        if self.action_readout and not self.residual:
            raise ConfigError("model.action_readout=true adds the actions' change to the residual anchor; "
                              "set model.residual=true")
        if not self.time_shift > 0:
            raise ConfigError(f"model.time_shift={self.time_shift} must be > 0 (1 = no shift; 3 puts the median noise at 0.75)")


@dataclass(frozen=True)
class TrainerConfig:
    max_iter: int = 35_000
    lr: float = 2e-4
    weight_decay: float = 0.01
    warmup_iter: int = 500
    grad_clip: float = 1.0
    log_iter: int = 50
    seed: int = 0
    device: str = "auto"  # auto: cuda if available
    precision: str = "bf16"  # autocast on CUDA; the CPU always computes in fp32

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "fp32"):
            raise ConfigError(f"trainer.precision={self.precision!r}: choose bf16 or fp32")
        if self.max_iter < 1:
            raise ConfigError(f"trainer.max_iter={self.max_iter}: must be >= 1")
        if self.lr <= 0 or self.grad_clip <= 0 or self.log_iter < 1 or self.warmup_iter < 0:
            raise ConfigError("trainer.lr and grad_clip must be > 0, log_iter >= 1, warmup_iter >= 0")


@dataclass(frozen=True)
class CheckpointConfig:
    save_iter: int = 1000
    # Stage 0: a base checkpoint (bimanual.py base) or "" to start from fresh weights.
    # Later stages: the parent stage's exact completed iteration root.
    load_path: str = ""
    # Stage 3 only: the completed Stage 0 iteration root whose EMA starts the real score
    # (frozen teacher) and the critic (fake score).
    reference: str = ""
    keep_last: int = 0  # 0: keep every saved iteration root

    def __post_init__(self) -> None:
        if self.save_iter < 1:
            raise ConfigError(f"checkpoint.save_iter={self.save_iter}: must be >= 1")


@dataclass(frozen=True)
class EMAConfig:
    enabled: bool = True
    beta: float = 0.999
    # the one built-in EMA step: on a fresh start the loaded/fresh weights are copied into
    # the EMA once; a same-run resume restores the saved EMA. No second EMA callback.
    init: str = "copy_once"

    def __post_init__(self) -> None:
        if not 0 < self.beta < 1:
            raise ConfigError(f"ema.beta={self.beta}: use 0 < beta < 1")
        if self.init != "copy_once":
            raise ConfigError("ema.init: only 'copy_once' (the built-in step); do not add a second EMA callback")


@dataclass(frozen=True)
class ParallelConfig:
    backend: str = "auto"  # auto: DeepSpeed ZeRO when launched with several processes, else plain
    zero_stage: int = 2

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "plain", "deepspeed"):
            raise ConfigError(f"parallelism.backend={self.backend!r}: choose auto, plain or deepspeed")
        if self.zero_stage not in (0, 1, 2):
            raise ConfigError(f"parallelism.zero_stage={self.zero_stage}: use 0, 1 or 2")


@dataclass(frozen=True)
class DistillConfig:
    """Stages 2 (TF-dCM) and 3 (SF-DMD): the few-step student and how it is distilled."""

    # the student's sampling ladder: noise levels, pure noise first; at each level the
    # student predicts the clean block and re-noises it to the next level. Saved with every
    # Stage 2/3 checkpoint and with the export; Stage 3 must keep its Stage 2 parent's.
    schedule: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25)
    teacher_steps: int = 32  # Stage 2: Euler steps of the teacher's ODE grid on [0, 1] (the schedule's levels are added)
    student_every: int = 6  # Stage 3: every N-th iteration updates the student, the other N-1 the critic
    critic_lr: float = 5e-5  # Stage 3: the critic's own optimizer (the student's is trainer.lr)
    dmd_t_min: float = 0.02  # Stage 3: noise levels at which real and fake score are compared
    dmd_t_max: float = 0.98

    def __post_init__(self) -> None:
        s = self.schedule
        if not s or not all(isinstance(x, (int, float)) for x in s):
            raise ConfigError(f"distill.schedule={list(s)!r}: give the noise levels as numbers, e.g. [1.0, 0.75, 0.5, 0.25]")
        if float(s[0]) != 1.0 or any(not 0 < float(x) <= 1 for x in s) or any(float(a) <= float(b) for a, b in zip(s, s[1:])):
            raise ConfigError(f"distill.schedule={list(s)!r}: start at 1.0 (pure noise) and decrease strictly, every level in (0, 1]")
        object.__setattr__(self, "schedule", tuple(float(x) for x in s))  # 1 and 1.0 are the same ladder
        if self.teacher_steps < 1:
            raise ConfigError(f"distill.teacher_steps={self.teacher_steps}: must be >= 1")
        if self.student_every < 2:
            raise ConfigError(f"distill.student_every={self.student_every}: must be >= 2 (one student update, the rest critic updates)")
        if self.critic_lr <= 0:
            raise ConfigError(f"distill.critic_lr={self.critic_lr}: must be > 0")
        if not 0 < self.dmd_t_min < self.dmd_t_max < 1:
            raise ConfigError(f"distill.dmd_t_min={self.dmd_t_min}, dmd_t_max={self.dmd_t_max}: use 0 < dmd_t_min < dmd_t_max < 1")


@dataclass(frozen=True)
class StageConfig:
    job: JobConfig = field(default_factory=JobConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(bundle="-"))
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    parallelism: ParallelConfig = field(default_factory=ParallelConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    source: str = ""  # the TOML file this came from

    def __post_init__(self) -> None:
        stage = self.job.stage
        if stage > 0 and not self.checkpoint.load_path:
            raise ConfigError(f"stage {stage} needs checkpoint.load_path: the completed iteration root of its "
                              f"Stage {PARENT_STAGE[stage]} run (e.g. runs/bimanual/<run>/checkpoints/iter_000008000)")
        if stage == 3 and not self.checkpoint.reference:
            raise ConfigError("stage 3 needs checkpoint.reference: the completed iteration root of its Stage 0 run (real score "
                              "and critic start from its EMA; BIMANUAL_STAGE0_CHECKPOINT=... or make ... REFERENCE=...)")
        if stage in DISTILL_STAGES:
            if not self.ema.enabled:
                raise ConfigError(f"stage {stage} needs ema.enabled = true: the EMA student is the exported model"
                                  + (" and the consistency target" if stage == 2 else ""))
            if self.model.denoise_steps != len(self.distill.schedule):
                raise ConfigError(f"model.denoise_steps={self.model.denoise_steps} but distill.schedule has "
                                  f"{len(self.distill.schedule)} levels; a student samples with its schedule: make them equal")

    @property
    def run_dir(self) -> Path:
        return Path(self.job.output_root) / self.job.name

    @property
    def mode(self) -> str:
        return STAGES[self.job.stage]

    def to_dict(self) -> dict[str, Any]:
        # through JSON so a tuple compares equal to the list a saved config.json holds
        return json.loads(json.dumps(dataclasses.asdict(self)))


_SECTIONS = {f.name: f.type for f in dataclasses.fields(StageConfig) if f.name != "source"}
_SECTION_CLASSES = {"job": JobConfig, "data": DataConfig, "model": ModelConfig, "trainer": TrainerConfig,
                    "checkpoint": CheckpointConfig, "ema": EMAConfig, "parallelism": ParallelConfig,
                    "distill": DistillConfig}
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        hint = {"checkpoint.load_path": " (with make: PARENT=<the parent stage's completed iteration root>)",
                "checkpoint.reference": " (with make: REFERENCE=<the Stage 0 run's completed iteration root>)"}.get(where, "")
        raise ConfigError(f"{where}: environment variable {name} is not set (export {name}=... or override {where}=...){hint}")

    return _ENV.sub(sub, value)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r}: use section.key=value, e.g. trainer.max_iter=12")
    key, raw = item.split("=", 1)
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip().split("."), value


def load_stage_config(path: str | os.PathLike, *, profile: str = "default", overrides: list[str] | tuple = ()) -> StageConfig:
    """Read a stage TOML, apply the profile table and dotted overrides, validate. A run's own
    ``config.json`` (the resolved config it recorded) reads the same way, without profiles."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10 (the wm environment)
        import tomli as tomllib

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such stage config; the kit's are data/configs/stage0_bidir.toml ... stage3_sfdmd.toml")
    if path.suffix == ".json":
        try:
            raw = json.loads(path.read_text())
        except ValueError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: not a run's config.json (sections {sorted(_SECTIONS)})")
        profile = "default"  # already resolved: its profile was applied when the run started
    else:
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
    profiles = {k: raw.pop(k) for k in list(raw) if k in ("tiny", "default") and isinstance(raw[k], dict)}
    if profile not in ("default", "tiny"):
        raise ConfigError(f"profile={profile!r}: choose default or tiny")
    if profile in profiles:
        raw = _merge(raw, profiles[profile])
    for item in overrides:
        keys, value = _parse_override(item)
        if len(keys) != 2 or keys[0] not in _SECTIONS:
            raise ConfigError(f"override {item!r}: keys are section.key with section one of {sorted(_SECTIONS)}")
        raw.setdefault(keys[0], {})[keys[1]] = value
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {sorted(unknown)}; known: {sorted(_SECTIONS)} and [tiny]")
    sections = {}
    for name, cls in _SECTION_CLASSES.items():
        values = raw.get(name, {})
        known = {f.name: f.type for f in dataclasses.fields(cls)}
        bad = set(values) - set(known)
        if bad:
            raise ConfigError(f"{path}: unknown key(s) {sorted(bad)} in [{name}]; known: {sorted(known)}")
        values = {k: _expand(v, f"{name}.{k}") for k, v in values.items()}
        for k, v in values.items():
            want = type(getattr(cls(**({"bundle": "-"} if cls is DataConfig else {})), k))
            if want is float and isinstance(v, int):
                values[k] = float(v)
            elif want is tuple and isinstance(v, list):
                values[k] = tuple(v)
            elif want is int and isinstance(v, str) and v.lstrip("-").isdigit():
                values[k] = int(v)
            elif want is not type(v) and not (want is float and isinstance(v, float)):
                raise ConfigError(f"{path}: {name}.{k}={v!r} should be {want.__name__}")
        sections[name] = cls(**values)
    return StageConfig(**sections, source=str(path))
