//go:build linux

package shim

import (
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups/systemd"
)

func TestCheckRuncOptions(t *testing.T) {
	const self = "/usr/local/bin/containerd-shim-branch-v1"
	for _, c := range []struct {
		name string
		o    *options.Options
		kind func(error) bool // nil: taken
	}{
		{"none", &options.Options{}, nil},
		{"honoured", &options.Options{Root: "/run/x", NoPivotRoot: true, NoNewKeyring: true, ShimCgroup: "/s", IoUid: 1, IoGid: 1}, nil},
		{"BinaryName self", &options.Options{BinaryName: self}, nil},
		{"BinaryName own runtime", &options.Options{BinaryName: self + "-runtime"}, nil},
		{"BinaryName runc", &options.Options{BinaryName: "/usr/sbin/runc"}, errdefs.IsInvalidArgument},
		{"CriuImagePath", &options.Options{CriuImagePath: "/c"}, errdefs.IsNotImplemented},
		{"CriuWorkPath", &options.Options{CriuWorkPath: "/c"}, errdefs.IsNotImplemented},
	} {
		err := checkRuncOptions(self, c.o)
		switch {
		case c.kind == nil && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.kind != nil && !c.kind(err):
			t.Errorf("%s: got %v, want a refusal of the right kind", c.name, err)
		}
	}
	err := checkRuncOptions(self, &options.Options{SystemdCgroup: true})
	if systemd.IsRunningSystemd() {
		if err != nil {
			t.Errorf("SystemdCgroup refused on a systemd host: %v", err)
		}
	} else if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("SystemdCgroup without systemd: got %v, want a failed precondition", err)
	}
}
