"""Typed settings of the world models and their training, with a named registry.

``WorldModelConfig`` describes one action-conditioned frame generator (one camera view);
``WMTrainConfig`` one training run of it. Profiles: ``default`` (128 px, GPU) and ``tiny``
(64 px, a few channels: every stage on a CPU in seconds). The seed's cadence for the update:
gradient accumulation 4, an explicit save interval, the wrist model's target step decides
when both stop (see ``wmrl.worldmodel.update``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wmrl.config import ConfigError

VIEWS = ("main", "wrist")


@dataclass(frozen=True)
class WorldModelConfig:
    """A pixel-space EDM denoiser (DIAMOND-style): next chunk-boundary frame of one view from
    the last ``context`` frames of that view, the chunk's actions and the proprio."""

    view: str = "main"
    image_size: int = 128
    context: int = 2  # frames of history (the current one included), one chunk apart
    chunk_size: int = 8
    action_dim: int = 7
    proprio_dim: int = 8
    condition_on_main: bool = False  # wrist model: also see the main view's current frame
    channels: tuple[int, ...] = (64, 128, 256)  # U-Net widths per resolution level
    blocks_per_level: int = 2
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

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ConfigError(f"world model view {self.view!r}: choose one of {', '.join(VIEWS)}")
        if self.condition_on_main and self.view != "wrist":
            raise ConfigError("condition_on_main is for the wrist model only (the main model is its own source)")
        if self.context < 1 or self.chunk_size < 1 or self.sample_steps < 1:
            raise ConfigError("world model: context, chunk_size and sample_steps must be >= 1")
        down = 2 ** (len(self.channels) - 1)
        if not self.channels or self.image_size % down:
            raise ConfigError(f"image_size={self.image_size} must be divisible by {down} "
                              f"(2 ** (levels - 1) for channels={self.channels})")
        if any(c % 8 for c in self.channels):
            raise ConfigError(f"channels={self.channels}: each must be divisible by 8 (GroupNorm)")
        if not 0 < self.sigma_min < self.sigma_max:
            raise ConfigError("need 0 < sigma_min < sigma_max")

    @property
    def input_frames(self) -> int:
        """Frames stacked as conditioning channels (history, plus main's for the wrist model)."""
        return self.context + int(self.condition_on_main)


@dataclass(frozen=True)
class WMTrainConfig:
    """One world-model training run (DeepSpeed). The DeepSpeed JSON file decides ZeRO stage
    and precision; micro batch, accumulation and learning rate are filled in from here
    unless the file sets them."""

    steps: int = 2000  # optimizer updates (the seed's Cosmos target: 2000)
    micro_batch: int = 16
    grad_accum: int = 4  # the seed's
    lr: float = 2e-4  # from scratch (the seed fine-tunes pretrained models at 1e-6)
    weight_decay: float = 1e-2
    warmup: int = 100
    grad_clip: float = 1.0
    save_interval: int = 1000  # explicit, as the seed's --save-interval
    eval_interval: int = 250
    log_interval: int = 25
    val_batches: int = 4
    proprio_loss_weight: float = 1.0
    seed: int = 20261021  # the seed's cycle seed
    ds_config_cpu: str = "data/worldmodel/ds_cpu.json"
    ds_config_gpu: str = "data/worldmodel/ds_gpu.json"

    def __post_init__(self) -> None:
        for name in ("steps", "micro_batch", "grad_accum", "save_interval", "eval_interval", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"world-model training: {name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.warmup < 0 or self.val_batches < 0:
            raise ConfigError("world-model training: lr > 0, warmup >= 0 and val_batches >= 0")


@dataclass(frozen=True)
class WMProfile:
    name: str
    main: WorldModelConfig = field(default_factory=WorldModelConfig)
    wrist: WorldModelConfig = field(default_factory=lambda: WorldModelConfig(view="wrist", condition_on_main=True))
    train: WMTrainConfig = field(default_factory=WMTrainConfig)

    def model(self, view: str) -> WorldModelConfig:
        if view not in VIEWS:
            raise ConfigError(f"view {view!r}: choose one of {', '.join(VIEWS)}")
        return self.main if view == "main" else self.wrist


_TINY_MODEL = dict(image_size=64, channels=(8, 16), blocks_per_level=1, cond_dim=32, proprio_hidden=32,
                   sample_steps=2)
_PROFILES = {
    "default": WMProfile("default"),
    "tiny": WMProfile(
        "tiny",
        main=WorldModelConfig(**_TINY_MODEL),
        wrist=WorldModelConfig(view="wrist", condition_on_main=True, **_TINY_MODEL),
        train=WMTrainConfig(steps=6, micro_batch=4, grad_accum=2, lr=2e-3, warmup=1, save_interval=3,
                            eval_interval=3, log_interval=1, val_batches=1),
    ),
}


def get_wm_profile(name: str) -> WMProfile:
    try:
        return _PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; choose one of: {', '.join(sorted(_PROFILES))}") from None
