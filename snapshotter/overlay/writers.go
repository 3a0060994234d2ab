//go:build linux

package overlay

import (
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/procfd"
)

// maxWriters bounds the writers a refused seal names.
const maxWriters = 32

// findWriters names the processes that hold a file of the given mounts
// (of one superblock) open for writing: what makes the kernel refuse to
// make such a mount read-only. If no descriptor is found, shared writable
// mappings of the superblock's device are looked for: a mapping keeps its
// file open after its descriptor is closed. Only called once a seal was
// refused; it costs a few syscalls per open file on the machine.
func findWriters(ms []NSMount) []branch.Writer {
	if len(ms) == 0 {
		return nil
	}
	ids := procfd.Mounts{}
	for _, m := range ms {
		ids[m.id] = true
	}
	ws := procfd.Writers(ids, maxWriters)
	if len(ws) == 0 {
		ws = procfd.MappedWriters(ms[0].major, ms[0].minor, maxWriters)
	}
	var out []branch.Writer
	for _, w := range ws {
		out = append(out, branch.Writer{Pid: w.Pid, Command: w.Command, Path: w.Path})
	}
	return out
}
