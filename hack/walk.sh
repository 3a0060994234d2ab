#!/usr/bin/env bash
# The files a fork request reaches in the shim, in order, and how many it
# reaches and returns to (docs/design.md, "a fork's path"); arguments go to
# hack/walk (-v lists each function, -skip the functions not on the path).
set -euo pipefail
cd "$(dirname "$0")/walk"
exec go run . -C ../.. "$@"
