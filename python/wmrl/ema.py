"""The one exponential moving average of a model's weights (SFT's saved weights, the bimanual
recipe's ``net_ema``)."""

from __future__ import annotations


class EMA:
    def __init__(self, net, beta: float):
        import copy

        self.beta = beta
        self.net = copy.deepcopy(net).requires_grad_(False)
        self.copies = 0  # how often the weights were copied in whole (a fresh start: once)

    def copy_from(self, net) -> None:
        self.net.load_state_dict(net.state_dict())
        self.copies += 1

    def update(self, net, beta: float | None = None) -> None:
        """ema <- beta * ema + (1 - beta) * weights; buffers are copied."""
        import torch

        b = self.beta if beta is None else beta
        with torch.no_grad():
            torch._foreach_lerp_(list(self.net.parameters()), [p.detach() for p in net.parameters()], 1 - b)
            for be, x in zip(self.net.buffers(), net.buffers()):
                be.copy_(x)
