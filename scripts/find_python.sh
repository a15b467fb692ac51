#!/usr/bin/env bash
# Print the path of a Python interpreter of the given minor version (e.g. 3.10), or explain
# how to get one and exit 1. Order: $PYTHON310/$PYTHON311 override, pyenv, PATH.
set -euo pipefail
want="${1:?usage: find_python.sh 3.10|3.11}"
var="PYTHON${want/./}"
if [ -n "${!var:-}" ]; then
  [ -x "${!var}" ] || { echo "error: $var=${!var} is not an executable Python $want" >&2; exit 1; }
  echo "${!var}"; exit 0
fi
candidates=()
root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
for d in "$root"/versions/"$want".*; do
  [ -x "$d/bin/python$want" ] && candidates+=("$d/bin/python$want")
done
command -v "python$want" >/dev/null 2>&1 && candidates+=("$(command -v "python$want")")
for c in "${candidates[@]}"; do
  if "$c" -c "import sys, venv; sys.exit(0 if sys.version.startswith('$want.') else 1)" 2>/dev/null; then
    echo "$c"; exit 0
  fi
done
echo "error: Python $want not found. Install it (pyenv install $want, or apt-get install python$want python$want-venv on Ubuntu 22.04) or set $var=/path/to/python$want" >&2
exit 1
