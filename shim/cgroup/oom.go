//go:build linux

package cgroup

import (
	"strconv"
	"strings"

	"github.com/opencontainers/cgroups"
)

// OOMKillsIn is how many processes the kernel's OOM killer killed in a
// cgroup itself, not in its branches below it (its directories on every
// hierarchy): memory.oom_control on v1, which counts its own; on v2,
// where memory.events counts descendants too, memory.events.local of the
// cgroup and of its leaf.
func OOMKillsIn(dirs []Dir) uint64 {
	for _, d := range dirs {
		switch {
		case d.Memory:
			if n, ok := oomKillLine(d.Path, "memory.oom_control"); ok {
				return n
			}
		case d.V2:
			var sum uint64
			found := false
			for _, dir := range OwnDirs(d.Path) {
				if n, ok := oomKillLine(dir, "memory.events.local"); ok {
					sum, found = sum+n, true
				}
			}
			if found {
				return sum
			}
		}
	}
	return 0
}

// oomKillLine reads the oom_kill line of a memory controller's file of
// the cgroup dir. Not fscommon.GetValueByKey, which reads a file without
// the line as 0.
func oomKillLine(dir, file string) (uint64, bool) {
	s, err := cgroups.ReadFile(dir, file)
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, true
		}
	}
	return 0, false
}
