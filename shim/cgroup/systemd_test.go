package cgroup

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
)

func TestSandboxCgroup(t *testing.T) {
	for _, c := range []struct {
		in, want string
		err      error
	}{
		{"/default/sb", "/default/sb", nil},
		{"/kubepods/besteffort/pod1/abc", "/kubepods/besteffort/pod1/abc", nil},
		{"system.slice:bbx:sb", "/system.slice/bbx-sb.scope", nil},
		{":bbx:sb", "/system.slice/bbx-sb.scope", nil},
		{"kubepods-besteffort-pod1.slice:cri-containerd:abc", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope", nil},
		{"-.slice:bbx:sb", "/bbx-sb.scope", nil},
		{"system.slice:bbx:sb.slice", "", errdefs.ErrNotImplemented},
		{"system.slice:bbx:", "", errdefs.ErrInvalidArgument},
		{"system:bbx:sb", "", errdefs.ErrInvalidArgument},
		{"system.slice:bbx:a/b", "", errdefs.ErrInvalidArgument},
		{"", "", errdefs.ErrNotImplemented},
		{"relative/sb", "", errdefs.ErrNotImplemented},
		{"a:b", "", errdefs.ErrNotImplemented},
	} {
		got, err := SandboxPath(c.in)
		if got != c.want || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("SandboxPath(%q) = %q, %v; want %q, %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestKeyDriverOnSpec(t *testing.T) {
	for _, c := range []struct {
		path      string
		set, want bool
	}{
		{"system.slice:bbx:sb", false, true},
		{"system.slice:bbx:sb", true, true},
		{"/default/sb", false, false},
		// Left to the runtime, which refuses it with its own words.
		{"/default/sb", true, true},
	} {
		o := &options.Options{SystemdCgroup: c.set}
		KeyDriverOnSpec(context.Background(), "sb", c.path, o)
		if o.SystemdCgroup != c.want {
			t.Errorf("%q with SystemdCgroup %v: %v; want %v", c.path, c.set, o.SystemdCgroup, c.want)
		}
	}
}
