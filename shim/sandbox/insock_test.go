//go:build linux

package sandbox

import (
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runtime-spec/specs-go"
)

func TestIsBranchCgroup(t *testing.T) {
	for name, want := range map[string]bool{"b1": true, "b123": true, "b": false, "bx": false, ".sealed": false, "": false, "b1a": false} {
		if got := isBranchCgroup(name); got != want {
			t.Errorf("isBranchCgroup(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestPeerIn checks the peer check against this process's own cgroup: in
// it, under it (a leaf such as .sealed), but not in a branch below it or
// in another branch.
func TestPeerIn(t *testing.T) {
	paths, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var own string
	for _, p := range paths {
		if p != "/" {
			own = p
			break
		}
	}
	if own == "" {
		t.Skip("this process is in every hierarchy's root cgroup")
	}
	pid := os.Getpid()
	if err := peerIn(pid, own); err != nil {
		t.Fatalf("own cgroup %s: %v", own, err)
	}
	// A process in a leaf below the branch (its .sealed cgroup) belongs
	// to it; one in a branch's cgroup (b<id>) does not.
	if i := strings.LastIndex(own, "/"); i > 0 {
		err := peerIn(pid, own[:i])
		if isBranchCgroup(own[i+1:]) != errdefs.IsPermissionDenied(err) {
			t.Fatalf("branch %s, process in %s: %v", own[:i], own, err)
		}
	}
	for _, cg := range []string{own + "/b1", "/no/such/branch", own + "x"} {
		if err := peerIn(pid, cg); !errdefs.IsPermissionDenied(err) {
			t.Errorf("cgroup %s: %v, want permission denied", cg, err)
		}
	}
}

func TestSocketOwner(t *testing.T) {
	s := &specs.Spec{Process: &specs.Process{User: specs.User{UID: 1000, GID: 100}}, Linux: &specs.Linux{
		UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 200000, Size: 65536}},
	}}
	if uid, gid := socketOwner(s); uid != 101000 || gid != 200100 {
		t.Fatalf("owner %d:%d, want 101000:200100", uid, gid)
	}
	if uid, gid := socketOwner(&specs.Spec{Process: &specs.Process{}}); uid != 0 || gid != 0 {
		t.Fatalf("owner without user namespace %d:%d", uid, gid)
	}
}
