"""Reinforcement learning of the policy: GRPO (``grpo``) over two environments (``envs``):
the real simulator and the world models' imagination."""
