//go:build linux

package overlay

import (
	"os"
	"path"
	"strings"
)

// MountDataSize is how many bytes the data of an overlay mount with these
// options takes, as containerd's mount (core/mount) passes it to the
// kernel, whose limit is one page: when the options come near that,
// containerd makes the lower directories relative to their common parent
// (compactLowerdirOption, its rule mirrored here) and mounts from there.
// Each level of branches is one more lower directory, so a tree deep
// enough has a mount no one can make: a fork compares this with a page
// before it makes such a branch, which otherwise failed at its start with
// containerd's "mount options is too long".
func MountDataSize(opts []string) int {
	size := 0
	for _, o := range opts {
		size += len(o)
	}
	if size < os.Getpagesize()-512 {
		return len(strings.Join(opts, ","))
	}
	var lowers []string
	idx := -1
	for i, o := range opts {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			idx, lowers = i, strings.Split(v, ":")
			break
		}
	}
	if idx < 0 || len(lowers) < 2 {
		return len(strings.Join(opts, ","))
	}
	common := commonPrefix(lowers)
	if common == "" {
		return len(strings.Join(opts, ","))
	}
	common = path.Dir(common)
	if common == "/" || common == "." {
		return len(strings.Join(opts, ","))
	}
	common += "/"
	rel := make([]string, len(lowers))
	for i, l := range lowers {
		if len(l) <= len(common) {
			return len(strings.Join(opts, ","))
		}
		rel[i] = l[len(common):]
	}
	compact := append(append(append([]string(nil), opts[:idx]...), opts[idx+1:]...), "lowerdir="+strings.Join(rel, ":"))
	return len(strings.Join(compact, ","))
}

// commonPrefix is the longest common prefix of strs, as containerd
// computes it (between the least and the greatest).
func commonPrefix(strs []string) string {
	lo, hi := strs[0], strs[0]
	for _, s := range strs[1:] {
		lo, hi = min(lo, s), max(hi, s)
	}
	for i := 0; i < len(lo) && i < len(hi); i++ {
		if lo[i] != hi[i] {
			return lo[:i]
		}
	}
	return lo
}
