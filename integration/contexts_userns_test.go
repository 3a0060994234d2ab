//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/shim/initdriver"
)

// TestContextsUserns: a sandbox run by ctr with its own user namespace
// (--uidmap/--gidmap: a namespace made for it, not a pod's pinned one)
// forks branches, and a branch of a branch, that join its namespace (a
// namespace of their own could not mount sysfs for the sandbox's network
// namespace), see the image as root's, and commit files that land owned
// by the mapped root on the host. A memory fork, a fork from a checkpoint
// with memory and a rollback of the sandbox to it restore the processes
// in a user namespace of their own with the same mappings.
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
	// A memory fork: CRIU restores the sandbox's processes in a user
	// namespace of their own with the same mappings (it could not join
	// the sandbox's from the one it makes), in the sandbox's network
	// namespace.
	mem, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork in a user namespace: %v", err)
	}
	m0 := mem.Branches[0]
	if got := norm(mustRun(t, ctx, sc, m0.ID, "sh", "-c", probe)); got != want {
		t.Fatalf("memory branch %s sees:\n%s\nwant:\n%s", m0.ID, got, want)
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", m0.InitPid, f))
		if err != nil || strings.Join(strings.Fields(string(b)), " ") != mapLine {
			t.Fatalf("memory branch %s's init: %s %q (%v), want %s", m0.ID, f, b, err, mapLine)
		}
	}
	sbNet, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", task.Pid()))
	if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", m0.InitPid)); err != nil || ns != sbNet {
		t.Fatalf("memory branch %s's init is in network namespace %q (%v), the sandbox's is %s", m0.ID, ns, err, sbNet)
	}
	if _, err := sc.Abort(ctx, m0.ID); err != nil {
		t.Fatal(err)
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
	// A checkpoint with memory, a fork --from it with memory and a
	// rollback of the sandbox to it, in a user namespace of their own
	// again.
	if _, err := sc.Checkpoint(ctx, "", "u1", client.CheckpointWithMemory()); err != nil {
		t.Fatalf("checkpoint with memory in a user namespace: %v", err)
	}
	from, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, From: "u1", WithMemory: true})
	if err != nil {
		t.Fatalf("fork --from u1 --memory in a user namespace: %v", err)
	}
	if got := norm(mustRun(t, ctx, sc, from.Branches[0].ID, "sh", "-c", probe)); got != want {
		t.Fatalf("branch %s forked from u1 with memory sees:\n%s\nwant:\n%s", from.Branches[0].ID, got, want)
	}
	if _, err := sc.Abort(ctx, from.Branches[0].ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "echo later > /state"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	_, task = sandboxTask(t, ctx, env, "sb")
	before := task.Pid()
	if err := sc.Rollback(ctx, "", "u1"); err != nil {
		t.Fatalf("rollback with memory of a sandbox in a user namespace: %v", err)
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", probe+"; cat /state"); err != nil || norm(out) != want+"\nafter" {
		t.Fatalf("the sandbox after its rollback sees (%v):\n%s\nwant:\n%s\nafter", err, out, want)
	}
	if _, task = sandboxTask(t, ctx, env, "sb"); task.Pid() == before {
		t.Fatalf("the sandbox's task still runs its old init (%d) after the rollback", before)
	}
}

// TestMemoryForkUsernsBinds: a memory fork of a sandbox in a user namespace
// of its own whose bind mounts come from directories the mapped root
// cannot search, as nerdctl's /etc/resolv.conf, /etc/hosts and
// /etc/hostname do (its data root is 0700, root's). CRIU binds a restore's
// external mounts from inside the user namespace it restores into, where
// such a source is out of reach: before, every memory fork of a sandbox run
// by `nerdctl --userns-remap` failed ("mnt-v2: Failed to open_tree
// .../resolv.conf: Permission denied"). Binds from directories the mapped
// root can search fork as before. Both on either kind of node: the test
// runs again in a namespace whose mounts propagate the other way (where
// they are shared, as systemd's, the restore of rebound sources fails with
// CRIU's current mount engine: "Failed to copy sharing ... Invalid
// argument").
func TestMemoryForkUsernsBinds(t *testing.T) {
	t.Logf("the root mount is shared: %v", initdriver.RootShared())
	t.Run("private", func(t *testing.T) { memoryForkUsernsBinds(t, 0o700) })
	t.Run("searchable", func(t *testing.T) { memoryForkUsernsBinds(t, 0o755) })
	againWithOtherPropagation(t)
}

// memoryForkUsernsBinds is TestMemoryForkUsernsBinds with the binds'
// sources in a directory of mode mode (readable by anyone themselves).
func memoryForkUsernsBinds(t *testing.T, mode os.FileMode) {
	top, err := os.MkdirTemp("", "bbx-binds-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(top, "sources")
	if err := os.MkdirAll(filepath.Join(private, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(private, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(private, "file"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(private, "dir", "inner"), []byte("inner\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := fmt.Sprintf("0:%d:%d", usernsHost, usernsSize)
	ctx, _, sc := sandboxCtxEnv(t, "--uidmap", m, "--gidmap", m,
		"--mount", "type=bind,src="+filepath.Join(private, "file")+",dst=/etc/bound,options=rbind:ro",
		"--mount", "type=bind,src="+filepath.Join(private, "dir")+",dst=/bound-dir,options=rbind:ro")
	mem, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork of a user-namespaced sandbox with binds from a directory of mode %o: %v", mode, err)
	}
	if out := mustRun(t, ctx, sc, mem.Branches[0].ID, "cat", "/etc/bound", "/bound-dir/inner"); out != "from the host\ninner\n" {
		t.Fatalf("the memory branch reads its binds as %q", out)
	}
	if _, err := sc.Abort(ctx, mem.Branches[0].ID); err != nil {
		t.Fatal(err)
	}
	// Nothing of the restore's is left mounted.
	if out, err := exec.Command("findmnt", "-rn", "-o", "TARGET").Output(); err != nil || strings.Contains(string(out), "/work/binds-") {
		t.Fatalf("mounts after the fork (%v):\n%s", err, out)
	}
}
