//go:build linux

package ocirt

import (
	"reflect"
	"testing"
)

// The command lines are the ones go-runc builds for containerd's task service.
func TestParseGoRuncCommandLines(t *testing.T) {
	global := []string{"--root", "/run/containerd/branch/ns", "--log", "/b/log.json", "--log-format", "json"}
	for _, tc := range []struct {
		args  []string
		name  string
		flags map[string]string
		pos   []string
	}{
		{[]string{"create", "--bundle", "/b", "--pid-file", "/b/init.pid", "--console-socket", "/tmp/c.sock", "id1"},
			"create", map[string]string{"bundle": "/b", "pid-file": "/b/init.pid", "console-socket": "/tmp/c.sock"}, []string{"id1"}},
		{[]string{"exec", "--process", "/tmp/p.json", "--detach", "--pid-file", "/b/e.pid", "id1"},
			"exec", map[string]string{"process": "/tmp/p.json", "detach": "true", "pid-file": "/b/e.pid"}, []string{"id1"}},
		{[]string{"kill", "--all", "id1", "9"}, "kill", map[string]string{"all": "true"}, []string{"id1", "9"}},
		{[]string{"delete", "--force", "id1"}, "delete", map[string]string{"force": "true"}, []string{"id1"}},
		{[]string{"ps", "--format", "json", "id1"}, "ps", map[string]string{"format": "json"}, []string{"id1"}},
		{[]string{"update", "--resources=-", "id1"}, "update", map[string]string{"resources": "-"}, []string{"id1"}},
		{[]string{"events", "--stats", "id1"}, "events", map[string]string{"stats": "true"}, []string{"id1"}},
	} {
		argv := append(append([]string{"containerd-shim-branch-v1"}, global...), tc.args...)
		if !IsInvocation(argv) {
			t.Fatalf("%v not recognised as a runtime call", argv)
		}
		c, err := parse(argv[1:])
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.name != tc.name || !reflect.DeepEqual(c.flags, tc.flags) || !reflect.DeepEqual(c.args, tc.pos) {
			t.Errorf("%v: got %s %v %v", tc.args, c.name, c.flags, c.args)
		}
		if c.g.root != "/run/containerd/branch/ns" || c.g.log != "/b/log.json" || c.g.logFormat != "json" {
			t.Errorf("%v: globals %+v", tc.args, c.g)
		}
	}
}

func TestShimCommandLinesAreNotRuntimeCalls(t *testing.T) {
	for _, argv := range [][]string{
		{"containerd-shim-branch-v1", "-namespace", "ns", "-address", "/run/c.sock", "-publish-binary", "/bin/containerd", "-id", "x", "start"},
		{"containerd-shim-branch-v1", "-namespace", "ns", "-id", "x", "-address", "/run/c.sock", "delete"},
		{"containerd-shim-branch-v1", "-info"},
		{"containerd-shim-branch-v1", "-v"},
		{"containerd-shim-branch-v1", "init"},
	} {
		if IsInvocation(argv) {
			t.Errorf("%v taken for a runtime call", argv)
		}
	}
}

func TestParseRefusesBadCommandLines(t *testing.T) {
	for _, args := range [][]string{
		{"--root"},
		{"--root", "/r"},
		{"--root", "/", "state", "x"},
		{"--bogus", "state", "x"},
		{"--root", "/r", "create", "--bundle"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v parsed without error", args)
		}
	}
}
