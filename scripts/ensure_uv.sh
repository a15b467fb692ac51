#!/usr/bin/env bash
# Print the path of a pinned uv, installing it into .venv/tools on first use.
set -euo pipefail
UV_VERSION=0.13.9
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/.venv/tools"
if [ ! -x "$tools/bin/uv" ] || [ "$("$tools/bin/uv" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  python="$(command -v python3)"
  "$python" -m venv "$tools" >&2
  "$tools/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION" >&2
fi
echo "$tools/bin/uv"
