"""``Imagination``: the main-view and wrist-view world models stepping in lockstep.

One step takes a batch of action chunks and returns, for every rollout, the imagined main
and wrist frames at the end of the chunk and the proprio there. Each model keeps the history
of its own view (``context`` frames, one chunk apart; before the start the first frame
repeats, as in training); the wrist model also sees the main view's frame of the chunk's
start, the moment of its own latest frame, as ``Transitions.batch`` trains it; or, with
``main_at_chunk_end``, the main frame just imagined, one chunk later (the main model steps
first for that). Both models predict the next proprio from the same raw
proprio (each in its own normalisation); the step's proprio is the mean of the two, the
orientations averaged as rotations (``mean_proprio``). A model
with ``action_history`` also reads the chunks stepped before (at the start: those given to
``start``, else zeros, an episode's first chunk). ``keep`` drops rollouts that have ended.

Used by the fidelity report (open loop with real actions) and by GRPO's imagined
environment (closed loop with the policy's actions); everything stays on the device.
"""

from __future__ import annotations

import torch


class Imagination:
    def __init__(self, main_model, wrist_model):
        if main_model.cfg.view != "main" or wrist_model.cfg.view != "wrist":
            raise ValueError("Imagination(main_model, wrist_model): views are "
                             f"{main_model.cfg.view!r} and {wrist_model.cfg.view!r}")
        self.models = {"main": main_model, "wrist": wrist_model}
        self.history: dict[str, list[torch.Tensor]] = {}
        self.past_actions: list[torch.Tensor] = []
        self.proprio: torch.Tensor | None = None

    def start(self, main: torch.Tensor, wrist: torch.Tensor, proprio: torch.Tensor,
              past_actions: torch.Tensor | None = None) -> None:
        """``main`` / ``wrist``: (B, T, 3, H, W) in [-1, 1], the last T real frames of each
        view (oldest first; T >= 1); ``proprio``: (B, P) raw, at the last frame; ``past_actions``:
        (B, K, chunk, A), the chunks executed before it, oldest first (None: an episode's start)."""
        self.history = {"main": list(main.unbind(1)), "wrist": list(wrist.unbind(1))}
        self.past_actions = [] if past_actions is None else list(past_actions.float().unbind(1))
        self.proprio = proprio.float()

    def keep(self, rows: torch.Tensor) -> None:
        """Narrow the batch to ``rows`` (indices into the current batch, in the order given):
        rollouts that ended stop costing imagination; the others continue unchanged."""
        self.history = {view: [h[rows] for h in frames] for view, frames in self.history.items()}
        self.past_actions = [a[rows] for a in self.past_actions]
        self.proprio = self.proprio[rows]

    def _actions(self, view: str, actions: torch.Tensor) -> torch.Tensor:
        """The model's action input: its ``action_history`` past chunks (zeros before the
        start), then ``actions``."""
        h = self.models[view].cfg.action_history
        if not h:
            return actions
        past = self.past_actions[-h:]
        past = [torch.zeros_like(actions)] * (h - len(past)) + [a.to(actions) for a in past]
        return torch.cat([*past, actions], dim=1)

    def _context(self, view: str) -> torch.Tensor:
        ctx = self.models[view].cfg.context
        hist = self.history[view][-ctx:]
        hist = [hist[0]] * (ctx - len(hist)) + hist  # repeat the first frame, as in training
        return torch.stack(hist, dim=1)

    @torch.no_grad()
    def step(self, actions: torch.Tensor, generator: torch.Generator | None = None, noise: dict | None = None):
        """Imagine one chunk: returns (main (B, 3, H, W), wrist (B, 3, H, W), proprio (B, P) raw).
        ``noise``: per view, the samplers' starting noise (B, 3, H, W); else drawn from ``generator``."""
        frames, nexts = {}, []
        for view in ("main", "wrist"):
            model = self.models[view]
            x = self._context(view)
            if model.cfg.condition_on_main:  # the main frame of the chunk's start or (just imagined) end, as in training
                main = frames["main"] if model.cfg.main_at_chunk_end else self.history["main"][-1]
                x = torch.cat([x, main[:, None]], dim=1)
            frame, p = model.generate(x, self._actions(view, actions), model.normalize_proprio(self.proprio),
                                      generator=generator,
                                      noise=None if noise is None else noise[view])
            frames[view] = frame
            nexts.append(model.unnormalize_proprio(p))
        for view in ("main", "wrist"):
            self.history[view].append(frames[view])
            self.history[view] = self.history[view][-max(m.cfg.context for m in self.models.values()):]
        keep = max(m.cfg.action_history for m in self.models.values())
        self.past_actions = (self.past_actions + [actions])[-keep:] if keep else []
        self.proprio = mean_proprio(nexts)
        return frames["main"], frames["wrist"], self.proprio


def mean_proprio(proprios: list[torch.Tensor]) -> torch.Tensor:
    """The two models' next proprio (B, P) raw, averaged: LIBERO's (position, axis-angle,
    gripper) with the orientations averaged as rotations (``rotation.mean_orientation``: two
    predictions on either side of the axis-angle's flip near pi would average to a vector near
    zero, a half turn off); any other layout element by element."""
    mean = torch.stack(proprios).mean(0)
    if mean.shape[-1] == 8:
        from wmrl.worldmodel.rotation import mean_orientation

        mean = torch.cat([mean[:, :3], mean_orientation([p[:, 3:6] for p in proprios]), mean[:, 6:]], dim=1)
    return mean
