//go:build linux

package shim

import (
	"reflect"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSplitPrep(t *testing.T) {
	fl := func(f int) string { return strconv.Itoa(f) }
	nosuid := fl(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	var w cfgWriter
	w.op("setns", "/proc/9/ns/net")
	w.op("root", "/bundle/rootfs")
	w.op("mount", "proc", "/proc", "proc", nosuid, "")
	w.op("mount", "tmpfs", "/dev", "tmpfs", fl(unix.MS_NOSUID), "mode=755")
	w.op("mount", "devpts", "/dev/pts", "devpts", nosuid, "newinstance")
	w.op("mount", "sysfs", "/sys", "sysfs", fl(unix.MS_RDONLY|unix.MS_NOSUID), "")
	// A propagation flag: left to the fork.
	w.op("mount", "tmpfs", "/run", "tmpfs", fl(unix.MS_NOSUID|unix.MS_SLAVE), "")
	// Not a filesystem a slot holds.
	w.op("mount", "/dev/vdb", "/data", "ext4", "0", "")
	w.op("bind", "/host/f", "/dev/termination-log", "0", "0")
	w.op("mknod", "/dev/null", "8630", "1", "3", "0", "0")
	// Nodes a bind covers, in a subdirectory, or outside /dev stay.
	w.op("mknod", "/dev/termination-log", "8630", "1", "3", "0", "0")
	w.op("mknod", "/dev/net/tun", "8630", "10", "200", "0", "0")
	w.op("mknod", "/run/x", "8630", "1", "3", "0", "0")
	w.op("symlink", "/proc/self/fd", "/dev/fd")
	w.op("pivot")
	w.op("mask", "/proc/kcore")
	w.op("setns", "/late") // after the root: stays in order
	early, late, ok := splitPrep(w.ops)
	if !ok {
		t.Fatal("nothing moved")
	}
	wantEarly := [][]string{
		{"setns", "/proc/9/ns/net"},
		{"fsmount", "0", "proc", "proc", nosuid, ""},
		{"fsmount", "1", "tmpfs", "tmpfs", fl(unix.MS_NOSUID), "mode=755"},
		{"fsmount", "2", "devpts", "devpts", nosuid, "newinstance"},
		{"fsmount", "3", "sysfs", "sysfs", fl(unix.MS_RDONLY | unix.MS_NOSUID), ""},
		{"mknodat", "1", "null", "8630", "1", "3", "0", "0"},
		{"symlinkat", "1", "/proc/self/fd", "fd"},
	}
	wantLate := [][]string{
		{"root", "/bundle/rootfs"},
		{"attach", "0", "/proc"},
		{"attach", "1", "/dev"},
		{"attach", "2", "/dev/pts"},
		{"attach", "3", "/sys"},
		{"mount", "tmpfs", "/run", "tmpfs", fl(unix.MS_NOSUID | unix.MS_SLAVE), ""},
		{"mount", "/dev/vdb", "/data", "ext4", "0", ""},
		{"bind", "/host/f", "/dev/termination-log", "0", "0"},
		{"mknod", "/dev/termination-log", "8630", "1", "3", "0", "0"},
		{"mknod", "/dev/net/tun", "8630", "10", "200", "0", "0"},
		{"mknod", "/run/x", "8630", "1", "3", "0", "0"},
		{"pivot"},
		{"mask", "/proc/kcore"},
		{"setns", "/late"},
	}
	if !reflect.DeepEqual(early.ops, wantEarly) {
		t.Errorf("early:\n%q\nwant\n%q", early.ops, wantEarly)
	}
	if !reflect.DeepEqual(late.ops, wantLate) {
		t.Errorf("late:\n%q\nwant\n%q", late.ops, wantLate)
	}
	// The encoding is the ops'.
	var enc cfgWriter
	for _, o := range wantEarly {
		enc.op(o[0], o[1:]...)
	}
	if early.String() != enc.String() {
		t.Errorf("early encoded %q, want %q", early.String(), enc.String())
	}

	// A /dev mounted twice: its nodes stay at the fork (the second mount
	// would cover what was made in the first).
	var twice cfgWriter
	twice.op("root", "/r")
	twice.op("mount", "tmpfs", "/dev", "tmpfs", "0", "")
	twice.op("mount", "tmpfs", "/dev", "tmpfs", "0", "")
	twice.op("mknod", "/dev/null", "8630", "1", "3", "0", "0")
	_, late, _ = splitPrep(twice.ops)
	if got := late.ops[len(late.ops)-1]; got[0] != "mknod" {
		t.Errorf("a node in a /dev mounted twice went early: late ends with %q", got)
	}
	// Nothing to move: not ok.
	var none cfgWriter
	none.op("root", "/r")
	none.op("pivot")
	if _, _, ok := splitPrep(none.ops); ok {
		t.Error("a plan with nothing to move was split")
	}
}
