#!/usr/bin/env bash
# The README's main job on a small built-in example. Until the end-to-end transfer lands
# (controller + agents), it says so and exits 0 after showing what is built.
set -eu
build=${1:-build}
echo "weightbridge demo: the end-to-end transfer (controller + agents) is not yet available."
echo "built programs: $(ls "$build/bin" 2>/dev/null | tr '\n' ' ')"
