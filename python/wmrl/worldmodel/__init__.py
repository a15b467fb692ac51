"""World models of the cycle: per-view action-conditioned frame generators, the reward model.

Runs in the ``wm`` environment (Python 3.10, DeepSpeed). Modules, in the order data flows:
``data`` (chunk-boundary transitions from HDF5, new/replay mixing), ``model`` (EDM U-Net),
``train`` (one view with DeepSpeed), ``update`` (both views, the seed's stop rule),
``reward`` (frozen success classifier), ``fidelity`` (open-loop PSNR/SSIM, videos).
"""
