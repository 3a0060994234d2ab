//go:build linux

package integration

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
)

// TestContextsUserns: a sandbox run by ctr with its own user namespace
// (--uidmap/--gidmap: a namespace made for it, not a pod's pinned one)
// forks branches, and a branch of a branch, that join its namespace (a
// namespace of their own could not mount sysfs for the sandbox's network
// namespace), see the image as root's, and commit files that land owned
// by the mapped root on the host.
func TestContextsUserns(t *testing.T) {
	m := fmt.Sprintf("0:%d:%d", usernsHost, usernsSize)
	ctx, env, sc := sandboxCtxEnv(t, "--uidmap", m, "--gidmap", m)
	mapLine := fmt.Sprintf("0 %d %d", usernsHost, usernsSize)
	probe := "id -u; cat /proc/self/uid_map /proc/self/gid_map; stat -c '%u:%g %n' / /bin/busybox /state"
	want := strings.Join([]string{"0", mapLine, mapLine, "0:0 /", "0:0 /bin/busybox", "0:0 /state"}, "\n")
	norm := func(out string) string {
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
		return strings.Join(lines, "\n")
	}
	out, err := execIn(ctx, env, "sb", "sh", "-c", probe)
	if err != nil || norm(out) != want {
		t.Fatalf("the sandbox sees (%v):\n%s\nwant:\n%s", err, out, want)
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	if got := norm(mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", probe)); got != want {
		t.Fatalf("branch %s sees:\n%s\nwant:\n%s", kids[0].ID, got, want)
	}
	nested := fork(t, ctx, sc, client.ForkOptions{Parent: kids[0].ID, Count: 1})
	if got := norm(mustRun(t, ctx, sc, nested[0].ID, "sh", "-c", probe)); got != want {
		t.Fatalf("nested branch %s sees:\n%s\nwant:\n%s", nested[0].ID, got, want)
	}
	_, task := sandboxTask(t, ctx, env, "sb")
	sbUserns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", task.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []client.BranchInfo{kids[0], nested[0]} {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", k.InitPid)); err != nil || ns != sbUserns {
			t.Fatalf("branch %s's init is in user namespace %q (%v), the sandbox's is %s", k.ID, ns, err, sbUserns)
		}
	}
	// A memory fork is refused before it stops anything: CRIU cannot
	// restore into the namespace.
	if _, err := sc.ForkResult(ctx, client.ForkOptions{Parent: kids[0].ID, Count: 1, WithMemory: true}); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "user namespace") {
		t.Fatalf("memory fork in a user namespace: %v, want not implemented", err)
	}
	mustRun(t, ctx, sc, nested[0].ID, "sh", "-c", "echo hi > /made && chown 7:7 /made && echo after > /state")
	if _, err := sc.Commit(ctx, nested[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	out, err = execIn(ctx, env, "sb", "stat", "-c", "%u:%g %n", "/made", "/state")
	if got := norm(out); err != nil || got != "7:7 /made\n0:0 /state" {
		t.Fatalf("the sandbox sees the committed files as %q (%v)", out, err)
	}
	for name, want := range map[string]int{"made": usernsHost + 7, "state": usernsHost} {
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/root/%s", task.Pid(), name), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != want || int(st.Gid) != want {
			t.Errorf("/%s is %d:%d on the host after the commit, want %d:%d", name, st.Uid, st.Gid, want, want)
		}
	}
}
