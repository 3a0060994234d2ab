//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MemoryLevel is one cgroup with a memory limit, as PidsLevel is one with
// a process limit.
type MemoryLevel struct {
	Cgroup string // its path on the hierarchy, as a spec names it
	// Limit, and the anonymous memory charged to it and below: the page
	// cache the kernel can reclaim is not counted.
	Limit, Anon int64
}

// Room is how much more anonymous memory fits under the limit.
func (l MemoryLevel) Room() int64 { return l.Limit - l.Anon }

// memoryDir is the directory of a cgroup path on the hierarchy that holds
// the memory controller (v1's, else cgroup2), that hierarchy's root, and
// whether it is cgroup2; "" if there is none.
func memoryDir(ms []Dir, path string) (dir, root string, v2 bool) {
	for _, m := range ms {
		if m.Memory {
			return filepath.Join(m.Path, path), m.Path, false
		}
	}
	for _, m := range ms {
		if m.V2 {
			return filepath.Join(m.Path, path), m.Path, true
		}
	}
	return "", "", false
}

// MemoryLimits reads the memory limits that bound a cgroup path: its own
// and every ancestor's that has one, nearest first. Memory is charged to
// every ancestor, so each of them can refuse it. On a hybrid host's
// unified hierarchy, which has no memory controller, there is none.
func MemoryLimits(ms []Dir, path string) []MemoryLevel {
	dir, root, v2 := memoryDir(ms, path)
	if dir == "" {
		return nil
	}
	var out []MemoryLevel
	for _, a := range ancestors(dir, root) {
		limit, anon, ok := memoryLimit(a.dir, v2)
		if !ok {
			continue
		}
		out = append(out, MemoryLevel{Cgroup: a.rel, Limit: limit, Anon: anon})
	}
	return out
}

// unlimited is where a v1 limit reads as none (PAGE_COUNTER_MAX pages).
const unlimited = int64(1) << 62

// memoryLimit reads a cgroup directory's memory limit and the anonymous
// memory charged to it and below; ok is false without a limit ("max", or
// the v1 figure for none) or a file to read.
func memoryLimit(dir string, v2 bool) (limit, anon int64, ok bool) {
	file, key := "memory.limit_in_bytes", "total_rss"
	if v2 {
		file, key = "memory.max", "anon"
	}
	limit, err := readInt(filepath.Join(dir, file))
	if err != nil || limit >= unlimited {
		return 0, 0, false
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return limit, 0, true
	}
	for line := range strings.SplitSeq(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			anon, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			break
		}
	}
	return limit, anon, true
}
