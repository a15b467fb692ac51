"""Fixtures of the real-engine tests: a private dockerd, local base images, and the CPU test
variants of both images built from their wheelhouse (see engine.py for what is cached)."""

from __future__ import annotations

import os
import time

import pytest

from tests.containers import engine as E


@pytest.fixture(scope="session")
def docker_engine():
    """A running private daemon; DOCKER_HOST points at it for the session. Skips with the reason
    when this machine cannot run one (not root, no apt, no debootstrap mirror...)."""
    try:
        import docker  # noqa: F401
    except ImportError:
        pytest.skip("docker-py is not installed in this environment (make setup installs docker/train.lock)")
    try:
        daemon = E.start_daemon()
    except E.Unavailable as e:
        pytest.skip(f"no Docker Engine here: {e}")
    old = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = daemon.host
    import docker

    client = docker.DockerClient(base_url=daemon.host, timeout=3600)
    try:
        yield client
    finally:
        client.close()
        daemon.stop()
        if old is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = old


@pytest.fixture(scope="session")
def test_images(docker_engine):
    """{"train": ImageSpec, "wm": ImageSpec} of the CPU variants, built (layer cache: seconds when
    nothing changed). The same Dockerfiles and install path as the real images; only the lock
    files differ (docker/test-cpu-*.lock: torch's CPU wheel, no CUDA stack)."""
    from wmrl.containers import wheelhouse
    from wmrl.containers.build import BuildConfig, build
    from wmrl.containers.images import image_spec

    try:
        bases = dict(zip(("train", "wm"), E.base_images(docker_engine)))
    except E.Unavailable as e:
        pytest.skip(f"no base image: {e}")
    specs, timings = {}, {}
    for name in ("train", "wm"):
        spec = image_spec(name, E.TEST_LOCKS[name], E.TEST_TAGS[name])
        start = time.monotonic()
        try:
            wheelhouse.fill(spec, [E.TORCH_CPU_WHEELS])
        except Exception as e:  # no index, or torch's CPU wheel not at hand
            pytest.skip(f"wheelhouse of {spec.lock} could not be filled here: {e}")
        info = build(BuildConfig(spec, base_image=bases[name], quiet=True), client=docker_engine)
        timings[name] = {"build_s": round(time.monotonic() - start, 1), "size_gib": round(info["size_bytes"] / 2**30, 2)}
        specs[name] = spec
    # Layers of older Dockerfile versions pile up in the cached data root: drop dangling images
    # created over an hour ago (this session's intermediate stages stay cached for the next run;
    # one reused from an older session may be rebuilt once, about a minute).
    docker_engine.images.prune(filters={"dangling": True, "until": "1h"})
    E.log(f"test images ready: {timings}")
    return specs
