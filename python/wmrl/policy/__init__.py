"""The flow-matching VLA policy: model, flow-ODE/SDE samplers with exact log-probabilities,
supervised training on demonstrations, checkpoints and the evaluation runner.

Modules (import them directly; this package imports nothing heavy):

* ``language``   instruction embeddings (all-MiniLM-L6-v2) cached per instruction
* ``normalize``  action/proprio statistics stored beside every checkpoint
* ``model``      ``FlowPolicy``: conv encoders per camera + language + proprio -> prefix
                 tokens; a time-conditioned transformer action expert predicts the velocity
* ``sampling``   Euler ODE sampling, flow-SDE sampling with log-probs, log-prob recomputation
* ``data``       demonstrations decoded once into memory; (episode, frame) sampling
* ``checkpoint`` ``RUN/weights/policy/global_step_N/`` (weights-only or full), ``latest_policy.json``
* ``train``      the SFT loop behind ``python/sft.py``
* ``runner``     ``PolicyRunner``: a chunk policy for the evaluation harness
* ``evaluate``   ``make eval CKPT=N``: evaluate a checkpoint, write the evidence
"""
