"""Four-stage post-training of an action-conditioned bimanual video world model.

The recipe (Stage 0 bidirectional adaptation, Stage 1 teacher forcing, Stage 2 TF-dCM,
Stage 3 SF-DMD) trains a model that predicts the visual consequences of robot actions: it
outputs video, not actions. Modules, in the order a reader meets them:

- ``contract``   the 59-value action contract (padded to 64), rot6d, asinh statistics
- ``tokenizer``  the caption tokenizer built from a bundle's own captions (no downloads)
- ``bundle``     the training bundle on disk: write, ``validate``, episode-level splits
- ``aloha``      real bimanual data from MuJoCo ALOHA (gym-aloha) with scripted policies
- ``libero``     converter from the kit's LIBERO HDF5 trajectories (single arm)
- ``loader``     ``make_bimanual_local_dataloader`` and ``materialize``
- ``model``      causal, block-autoregressive video generator with a KV cache
- ``config``     one TOML per stage, resolved into typed dataclasses
- ``train``      the staged trainer (checkpoints per iteration root, resume, EMA)
- ``distill``    Stages 2 and 3: consistency distillation, self-forcing DMD with a critic
- ``export``     the portable Stage 3 student and few-step generation with it
"""
