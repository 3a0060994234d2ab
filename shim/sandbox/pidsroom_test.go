//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
)

// TestPidsRefusal: a fork refused by a process limit is one line naming
// whose limit it is, resource exhausted, whichever start of the fork saw
// it and however the runtime worded it.
func TestPidsRefusal(t *testing.T) {
	sb := &Sandbox{id: "sb", nodes: map[string]*Branch{
		branch.RootID: {id: branch.RootID, cgroup: "/ns/sb"},
		"3":           {id: "3", parent: branch.RootID, cgroup: "/ns/sb/b3"},
	}}
	root, b3 := sb.nodes[branch.RootID], sb.nodes["3"]
	levels := []cgroup.PidsLevel{{Cgroup: "/ns/sb/b3", Max: 4, Current: 2}, {Cgroup: "/ns/sb", Max: 8, Current: 7}, {Cgroup: "/ns", Max: 100, Current: 20}}
	for _, c := range []struct {
		name   string
		parent *Branch
		errs   []error
		slack  int64
		want   string // "" for not a process limit
	}{
		{"the init path's clone", root, []error{nil, &cgroup.PidsLimit{PidsLevel: levels[1]}},
			0, "fork of sandbox sb: the sandbox's process limit (pids.max 8) is reached: resource exhausted"},
		{"up front, with counts", root, []error{&cgroup.PidsLimit{PidsLevel: levels[1], Need: 3}},
			0, "fork of sandbox sb: the sandbox's process limit (pids.max 8) is reached (1 free, the fork needs 3): resource exhausted"},
		{"a parent branch's limit", b3, []error{&cgroup.PidsLimit{PidsLevel: levels[0]}},
			0, "fork of branch sb/3: branch 3's process limit (pids.max 4) is reached: resource exhausted"},
		{"the new branch's own", b3, []error{&cgroup.PidsLimit{PidsLevel: cgroup.PidsLevel{Cgroup: "/ns/sb/b3/b9", Max: 1, Current: 1}}},
			0, "fork of branch sb/3: the new branch's own process limit (pids.max 1) is reached: resource exhausted"},
		{"above the sandbox", root, []error{&cgroup.PidsLimit{PidsLevel: levels[2]}},
			0, "fork of sandbox sb: cgroup /ns's (above the sandbox) process limit (pids.max 100) is reached: resource exhausted"},
		{"the runtime's EAGAIN, many lines", root, []error{errors.New("create its init: runc: nsexec-1[42]: failed to clone:\nResource temporarily unavailable\n...")},
			0, "least room"},
		{"the runtime's lost init while the limit is near", root, []error{errors.New("OCI runtime create failed: procReady not received")},
			runtimeStartPids, "least room"},
		{"the Go runtime's missing thread", root, []error{errors.New("runtime: failed to create new OS thread (have 5 already; errno=11)")},
			0, "least room"},
		{"another failure", root, []error{errors.New("mount rootfs: no such device")}, 0, ""},
		{"another runtime failure near the limit", root, []error{errors.New(`exec: "nope": executable file not found in $PATH`)}, runtimeStartPids, ""},
		{"another runtime failure with room", root, []error{errors.New("procReady not received")}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := cgroup.AsPidsLimit(c.errs, levels, c.slack)
			if c.want == "" {
				if pl != nil {
					t.Fatalf("taken for a process limit: %v", pl)
				}
				return
			}
			if pl == nil {
				t.Fatal("not taken for a process limit")
			}
			err := sb.pidsRefusal(c.parent, pl)
			msg := err.Error()
			if !errdefs.IsResourceExhausted(err) || strings.Contains(msg, "\n") {
				t.Errorf("%q: want one line, resource exhausted", msg)
			}
			if strings.Contains(c.want, "least room") {
				// The runtime's words name no limit: the one with the
				// least room (branch 3's, 2 free, against the sandbox's 1)
				// is the sandbox's.
				c.want = "fork of sandbox sb: the sandbox's process limit (pids.max 8) is reached: resource exhausted"
			}
			if msg != c.want {
				t.Errorf("got  %q\nwant %q", msg, c.want)
			}
		})
	}
}

// TestPidsRoom: the up-front count of a fork, against pids.max and
// pids.current files of the sandbox's cgroup and the one above it: one
// process per branch, two per branch given a command on the init path, one
// for the forking thread on v1; the Tightest limit is named.
func TestPidsRoom(t *testing.T) {
	root := t.TempDir()
	write := func(rel, file, v string) {
		t.Helper()
		d := filepath.Join(root, rel)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, file), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ns", "pids.max", "max")
	write("ns", "pids.current", "50")
	write("ns/sb", "pids.max", "10")
	ms := []cgroup.Dir{{Path: root, Pids: true}}
	sb := &Sandbox{id: "sb", nodes: map[string]*Branch{branch.RootID: {id: branch.RootID, cgroup: "/ns/sb"}}}
	for _, c := range []struct {
		count   uint32
		args    []string
		runtime bool
		current int
		want    string // "" for room enough
	}{
		{3, nil, false, 6, ""},
		{3, nil, false, 7, "(3 free, the fork needs 4)"},
		{2, []string{"sleep", "1"}, false, 5, ""},
		{2, []string{"sleep", "1"}, false, 6, "(4 free, the fork needs 5)"},
		{2, []string{"sleep", "1"}, true, 7, ""},
		{1, nil, false, 12, "(0 free, the fork needs 2)"},
	} {
		t.Run(fmt.Sprintf("%d/%v/runtime=%v/current=%d", c.count, c.args, c.runtime, c.current), func(t *testing.T) {
			write("ns/sb", "pids.current", strconv.Itoa(c.current))
			err := (&Service{}).pidsRoom(sb, sb.nodes[branch.RootID], ms, c.runtime, &shimv1.ForkRequest{Count: c.count, Args: c.args})
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && (err == nil || !errdefs.IsResourceExhausted(err) ||
				!strings.Contains(err.Error(), "the sandbox's process limit (pids.max 10) is reached "+c.want)):
				t.Errorf("got %v; want the sandbox's limit named, %s", err, c.want)
			}
		})
	}
	// A tighter limit above the sandbox is the one named.
	write("ns", "pids.max", "52")
	write("ns/sb", "pids.current", "1")
	err := (&Service{}).pidsRoom(sb, sb.nodes[branch.RootID], ms, false, &shimv1.ForkRequest{Count: 2})
	if err == nil || !strings.Contains(err.Error(), "cgroup /ns's (above the sandbox) process limit (pids.max 52)") {
		t.Errorf("got %v; want the limit above the sandbox named", err)
	}
}
