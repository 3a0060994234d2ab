#!/usr/bin/env bash
# Fails if the tests left overlay mounts or project daemons behind.
set -u
leaks=0
m=$(findmnt -rn -t overlay -o TARGET | grep -v '^/$' || true)
if [ -n "$m" ]; then echo "leaked overlay mounts:"; echo "$m"; leaks=1; fi
p=$(ps -eo pid=,args= | grep -E 'containerd-branch-snapshotter|containerd-shim-branch|bin/containerd --config' | grep -v grep || true)
if [ -n "$p" ]; then echo "leaked daemons:"; echo "$p"; leaks=1; fi
exit $leaks
