#!/bin/sh
# Entry point of both images. The driver runs containers as the caller's uid:gid (so files in
# the mounted run folders belong to the caller); such a user may have no home in the image, and
# Python tools (pip, torch, matplotlib, triton) want a writable HOME for their caches.
set -e
if [ ! -w "${HOME:-/nonexistent}" ]; then
  HOME="/tmp/home-$(id -u)"
  export HOME
  mkdir -p "$HOME"
fi
exec "$@"
