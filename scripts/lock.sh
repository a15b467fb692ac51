#!/usr/bin/env bash
# Regenerate the hashed lock files from docker/requirements-*.in (Linux x86_64, glibc 2.28+).
# The same lock files are installed by `make setup` and in the two images.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
uv="$(scripts/ensure_uv.sh)"
export UV_NATIVE_TLS=1
for spec in "train 3.11" "wm 3.10"; do
  set -- $spec
  "$uv" pip compile --quiet --generate-hashes --python-version "$2" --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command "make lock" "docker/requirements-$1.in" -o "docker/$1.lock"
  echo "docker/$1.lock: $(grep -c '^[a-zA-Z]' "docker/$1.lock") packages"
done
