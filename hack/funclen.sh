#!/usr/bin/env bash
# The lengths (issue 30): no non-test, non-generated Go file over 600 lines,
# no function over 80 lines in the packages on the fork, commit, abort and
# rollback paths; fails naming each. Arguments go to hack/funclen (-v lists
# the longest files and functions, over the limits or not).
set -euo pipefail
cd "$(dirname "$0")/funclen"
exec go run . -C ../.. "$@"
