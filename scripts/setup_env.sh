#!/usr/bin/env bash
# Create or update one virtual environment from its hashed lock file.
#   scripts/setup_env.sh NAME PYTHON_VERSION LOCKFILE      e.g. train 3.11 docker/train.lock
# Idempotent: if the environment was built from this exact lock (SHA-256 recorded in
# .venv/NAME/.lock.sha256) nothing is done. Every package is installed with its hash checked.
set -euo pipefail
name="$1"; pyver="$2"; lock="$3"
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv/$name"
stamp="$venv/.lock.sha256"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "[setup] $name: up to date with $lock"
  exit 0
fi
python="$("$root/scripts/find_python.sh" "$pyver")"
uv="$("$root/scripts/ensure_uv.sh")"
# Use the system's certificate store: some networks re-sign TLS with a local CA.
export UV_NATIVE_TLS=1
start=$(date +%s)
echo "[setup] $name: Python $pyver ($python) from $lock"
[ -x "$venv/bin/python" ] || "$uv" venv --quiet --python "$python" "$venv"
# DeepSpeed is built from source: its CUDA/CPU ops compile on first use, not at install.
DS_BUILD_OPS=0 VIRTUAL_ENV="$venv" "$uv" pip sync --quiet --require-hashes "$lock"
# Make the kit importable without a build step (python/ holds the wmrl package).
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$root/python" > "$site/wmrl_kit.pth"
echo "$want" > "$stamp"
echo "[setup] $name: ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
