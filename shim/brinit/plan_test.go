//go:build linux

package brinit

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestCapBits(t *testing.T) {
	caps, err := capBits([]string{"CAP_CHOWN", "CAP_KILL"})
	if err != nil || caps != 1<<unix.CAP_CHOWN|1<<unix.CAP_KILL {
		t.Errorf("capBits: %#x %v", caps, err)
	}
	if _, err := capBits([]string{"CAP_NOPE"}); err == nil {
		t.Error("an unknown capability was taken")
	}
}

// TestConfig: the init's config is NUL-terminated strings, an op's name
// then its arguments, and Ops gives them back.
func TestConfig(t *testing.T) {
	var w Config
	w.Op("mount", "proc", "/proc")
	w.Op("run")
	if got := w.String(); got != "mount\x00proc\x00/proc\x00run\x00" {
		t.Errorf("config %q", got)
	}
	if ops := w.Ops(); len(ops) != 2 || len(ops[0]) != 3 || ops[1][0] != "run" {
		t.Errorf("ops %q", ops)
	}
}
