"""The two images (Dockerfile.train, Dockerfile.wm) and the driver that runs stages in them.

``python -m wmrl.containers`` (docker-py; see ``__main__``):

* ``wheelhouse``: download every file a lock pins, hash-checked, into ``wheelhouse/<lock>/``
  (reuses the offline bundler's pip plumbing). Run where a package index is reachable.
* ``build``: build an image from its Dockerfile with a build context of exactly the files the
  image needs (Dockerfile, lock files, entry point, ``python/``, the wheelhouse), streaming
  readable progress. Labels record the kit version, the git commit and the lock file's SHA-256.
* ``run --image train|wm -- ARGS``: ``python ARGS`` in that image with the repository mounted at
  its own path, the caller's uid:gid, the selected GPUs, shared memory and ulimits for training,
  and the environment that changes results passed through. The exit code is the stage's.
* ``status``: which images exist and whether they match the checkout's lock files.

``RUNTIME=docker make <target>`` goes through ``run``; see the Makefile's ``RUN_PY`` block.
"""

from wmrl.containers.errors import ContainerError

__all__ = ["ContainerError"]
