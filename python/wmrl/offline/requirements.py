"""Which packages a bundle ships: docker/requirements-offline.in, resolved for the target.

The requirements file lists what the simulator side imports. ``resolve`` runs
``uv pip compile --generate-hashes`` for the target Python and platform (dropping the
packages named by ``# offline-exclude:`` lines, adding ``# offline-torch:`` lines with torch).
``select`` then keeps what the server lacks: packages named in ``--skip`` are left out, and so
is everything that only they need (the server's copy of a package brings its own needs).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PLATFORM = "x86_64-manylinux_2_28"  # uv's --python-platform: Linux x86_64, glibc 2.28 or newer
TORCH_FAMILY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")

# What the GPU server's Python 3.12 image already holds (the device docs' package list of its
# 'cuda' image, 2026-11-17, and its pip freeze, 2026-11-30), restricted to names the simulator
# side resolves to. opencv-python is there as opencv-python-headless (the same cv2 module).
GPU_SERVER_PRESENT = (
    "absl-py cloudpickle contourpy cycler etils fonttools fsspec h5py imageio kiwisolver llvmlite "
    "matplotlib numba numpy opencv-python packaging pillow pyparsing python-dateutil pyyaml scipy "
    "six tqdm typing-extensions zipp torch triton nvidia-*"
).split()
SKIP_ALIASES = {"gpu-server": GPU_SERVER_PRESENT}


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. become one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Directives:
    exclude: list[str] = field(default_factory=list)
    torch: list[str] = field(default_factory=list)


def read_directives(in_file: Path) -> Directives:
    d = Directives()
    for line in in_file.read_text().splitlines():
        m = re.match(r"#\s*offline-(exclude|torch):\s*(\S+)", line.strip())
        if m:
            (d.exclude if m.group(1) == "exclude" else d.torch).append(m.group(2))
    return d


@dataclass
class Pinned:
    name: str  # normalized
    version: str
    hashes: list[str]
    parents: set[str]  # normalized names of the packages that need it ("-r" for a direct requirement)
    marker: str = ""

    @property
    def direct(self) -> bool:
        return "-r" in self.parents

    def requirement_line(self) -> str:
        marker = f" ; {self.marker}" if self.marker else ""
        hashes = "".join(f" \\\n    --hash=sha256:{h}" for h in self.hashes)
        return f"{self.name}=={self.version}{marker}{hashes}"


def find_uv(repo: Path) -> str:
    for candidate in (os.environ.get("UV"), str(repo / ".venv/tools/bin/uv"), shutil.which("uv")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    script = repo / "scripts/ensure_uv.sh"
    if script.is_file():
        return subprocess.run([str(script)], check=True, capture_output=True, text=True).stdout.strip()
    raise RuntimeError("uv not found: run `make setup` (it installs uv into .venv/tools) or put uv on PATH")


def resolve(in_file: Path, python_version: str, with_torch: bool, repo: Path) -> str:
    """The hashed lock (text) of ``in_file`` for the target Python and platform."""
    directives = read_directives(in_file)
    with tempfile.TemporaryDirectory(prefix="wmrl-offline-lock-") as tmp:
        tmp = Path(tmp)
        spec = in_file
        if with_torch:
            if not directives.torch:
                raise RuntimeError(f"{in_file} has no `# offline-torch:` line to say which torch to ship")
            spec = tmp / "requirements-with-torch.in"
            spec.write_text(f"-r {in_file.resolve()}\n" + "".join(t + "\n" for t in directives.torch))
        cmd = [find_uv(repo), "pip", "compile", "--quiet", "--generate-hashes", "--python-version", python_version,
               "--python-platform", PLATFORM, "--custom-compile-command", "make offline-bundle", str(spec),
               "-o", str(tmp / "out.lock")]
        if directives.exclude:
            (tmp / "excludes.txt").write_text("".join(e + "\n" for e in directives.exclude))
            cmd[3:3] = ["--excludes", str(tmp / "excludes.txt")]
        env = {**os.environ, "UV_NATIVE_TLS": os.environ.get("UV_NATIVE_TLS", "1")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"uv pip compile failed for Python {python_version}:\n{proc.stderr.strip()}")
        return (tmp / "out.lock").read_text()


def parse_lock(text: str) -> dict[str, Pinned]:
    """Parse uv's hashed output: ``name==version [; marker] \\ --hash=...`` and ``# via`` notes."""
    out: dict[str, Pinned] = {}
    current: Pinned | None = None
    in_via = False
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", raw)
        if m and not raw.startswith(" "):
            current = Pinned(normalize(m.group(1)), m.group(2), [], set(), (m.group(3) or "").strip())
            out[current.name] = current
            in_via = False
            continue
        if current is None:
            continue
        for h in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            current.hashes.append(h)
        if line.startswith("# via"):
            rest = line[len("# via"):].strip()
            in_via = not rest
            if rest:
                current.parents.add("-r" if rest.startswith("-r") else normalize(rest))
        elif in_via and line.startswith("#   "):
            item = line[1:].strip()
            current.parents.add("-r" if item.startswith("-r") else normalize(item.split()[0]))
        elif not line.startswith("#"):
            in_via = False
    return out


def expand_skip(items: list[str]) -> list[str]:
    """Comma/space separated names and aliases (``gpu-server``) -> normalized names or globs."""
    out: list[str] = []
    for item in items:
        for token in re.split(r"[,\s]+", item.strip()):
            if token:
                out.extend(normalize(n) if "*" not in n else n.lower() for n in SKIP_ALIASES.get(token, [token]))
    return out


def _skipped(name: str, skip: list[str]) -> bool:
    return any(re.fullmatch(s.replace("*", ".*"), name) for s in skip)


@dataclass
class Selection:
    ship: list[Pinned]  # downloaded (or built) into wheels/
    skipped: list[Pinned]  # left to the server (--skip)
    unneeded: list[Pinned]  # needed only by skipped packages
    unknown_skip: list[str]  # --skip names the resolution does not contain


def select(lock: dict[str, Pinned], skip: list[str], with_torch: bool) -> Selection:
    skipped = {n for n in lock if _skipped(n, skip)}
    if not with_torch:
        skipped |= {n for n in lock if TORCH_FAMILY.match(n)}  # only present via a dependency's declaration
    needed: set[str] = set()
    changed = True
    while changed:  # a package is needed if a requirement or a needed, shipped package needs it
        changed = False
        for name, pin in lock.items():
            if name in needed or name in skipped:
                continue
            if pin.direct or any(p in needed for p in pin.parents):
                needed.add(name)
                changed = True
    unknown = [s for s in skip if not any(_skipped(n, [s]) for n in lock)]
    by_name = sorted(lock)
    return Selection(
        ship=[lock[n] for n in by_name if n in needed],
        skipped=[lock[n] for n in by_name if n in skipped],
        unneeded=[lock[n] for n in by_name if n not in needed and n not in skipped],
        unknown_skip=unknown,
    )
