//go:build linux

package brinit

import (
	"reflect"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSplitPrep(t *testing.T) {
	fl := func(f int) string { return strconv.Itoa(f) }
	nosuid := fl(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	var w Config
	w.Op("setns", "/proc/9/ns/net")
	w.Op("root", "/bundle/rootfs")
	w.Op("mount", "proc", "/proc", "proc", nosuid, "")
	w.Op("mount", "tmpfs", "/dev", "tmpfs", fl(unix.MS_NOSUID), "mode=755")
	w.Op("mount", "devpts", "/dev/pts", "devpts", nosuid, "newinstance")
	w.Op("mount", "sysfs", "/sys", "sysfs", fl(unix.MS_RDONLY|unix.MS_NOSUID), "")
	// A propagation flag: left to the fork.
	w.Op("mount", "tmpfs", "/run", "tmpfs", fl(unix.MS_NOSUID|unix.MS_SLAVE), "")
	// Not a filesystem a slot holds.
	w.Op("mount", "/dev/vdb", "/data", "ext4", "0", "")
	w.Op("bind", "/host/f", "/dev/termination-log", "0", "0")
	w.Op("mknod", "/dev/null", "8630", "1", "3", "0", "0")
	// Nodes a bind covers, in a subdirectory, or outside /dev stay.
	w.Op("mknod", "/dev/termination-log", "8630", "1", "3", "0", "0")
	w.Op("mknod", "/dev/net/tun", "8630", "10", "200", "0", "0")
	w.Op("mknod", "/run/x", "8630", "1", "3", "0", "0")
	w.Op("symlink", "/proc/self/fd", "/dev/fd")
	w.Op("pivot")
	w.Op("mask", "/proc/kcore")
	w.Op("setns", "/late") // after the root: stays in order
	early, late, ok := SplitPrep(w.Ops())
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
	if !reflect.DeepEqual(early.Ops(), wantEarly) {
		t.Errorf("early:\n%q\nwant\n%q", early.Ops(), wantEarly)
	}
	if !reflect.DeepEqual(late.Ops(), wantLate) {
		t.Errorf("late:\n%q\nwant\n%q", late.Ops(), wantLate)
	}
	// The encoding is the ops'.
	var enc Config
	for _, o := range wantEarly {
		enc.Op(o[0], o[1:]...)
	}
	if early.String() != enc.String() {
		t.Errorf("early encoded %q, want %q", early.String(), enc.String())
	}

	// A /dev mounted twice: its nodes stay at the fork (the second mount
	// would cover what was made in the first).
	var twice Config
	twice.Op("root", "/r")
	twice.Op("mount", "tmpfs", "/dev", "tmpfs", "0", "")
	twice.Op("mount", "tmpfs", "/dev", "tmpfs", "0", "")
	twice.Op("mknod", "/dev/null", "8630", "1", "3", "0", "0")
	_, late, _ = SplitPrep(twice.Ops())
	if got := late.Ops()[len(late.Ops())-1]; got[0] != "mknod" {
		t.Errorf("a node in a /dev mounted twice went early: late ends with %q", got)
	}
	// Nothing to move: not ok.
	var none Config
	none.Op("root", "/r")
	none.Op("pivot")
	if _, _, ok := SplitPrep(none.Ops()); ok {
		t.Error("a plan with nothing to move was split")
	}
}
