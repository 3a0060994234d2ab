//go:build linux

package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// startInSandbox starts a long-running shell script in the sandbox (an
// exec whose shell leaves it running in the background), and waits until
// the file ready exists in the sandbox.
func startInSandbox(t *testing.T, ctx context.Context, env *daemons.Env, script, ready string) {
	t.Helper()
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "("+script+") </dev/null >/dev/null 2>&1 &"); err != nil {
		t.Fatalf("start %q in the sandbox: %v: %s", script, err, out)
	}
	waitFor(t, func() bool { _, err := execIn(ctx, env, "sb", "test", "-e", ready); return err == nil })
}

// sandboxWriteRefused checks that a write by the sandbox's processes to
// its rootfs fails as sealed (EROFS).
func sandboxWriteRefused(t *testing.T, ctx context.Context, env *daemons.Env, what string) {
	t.Helper()
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "exec 2>&1; echo x > /state"); err == nil || !strings.Contains(out, "Read-only file system") {
		t.Fatalf("%s: write in the sealed sandbox: %q %v; want EROFS", what, out, err)
	}
}

func sandboxWritable(t *testing.T, ctx context.Context, env *daemons.Env, what string) {
	t.Helper()
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "exec 2>&1; echo after > /state"); err != nil {
		t.Fatalf("%s: sandbox not writable: %q %v", what, out, err)
	}
}

// TestContextsSealUnlinkedOpen is issue 16's first case: after a commit
// that replaced a running binary (the sandbox's own busybox, which its
// init runs, and a copy of it that another process runs, both still
// mapped), and with a file unlinked while a process holds it open, the
// sandbox forks again (and again): its rootfs is sealed mount by mount,
// the branches see the committed files, the sandbox's writes fail as
// sealed while branches live and work again after.
func TestContextsSealUnlinkedOpen(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	startInSandbox(t, ctx, env, "cp /bin/busybox /bb2 && touch /bb2.ready && exec /bb2 sleep 100000", "/bb2.ready")

	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "cp /bin/busybox /bb.new && mv /bb.new /bin/busybox && cp /bb2 /bb.new && mv /bb.new /bb2 && echo v2 > /marker")
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	sandboxWritable(t, ctx, env, "after the commit")
	// A file unlinked while a process holds it open.
	startInSandbox(t, ctx, env, "echo held > /held && exec 3</held && rm /held && touch /held.ready && exec sleep 100000", "/held.ready")

	for round := 0; round < 3; round++ {
		kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
		sandboxWriteRefused(t, ctx, env, "round "+strconv.Itoa(round))
		for _, k := range kids {
			if got := mustRun(t, ctx, sc, k.ID, "sh", "-c", "cat /marker && echo "+k.ID+" > /mine && cat /mine"); got != "v2\n"+k.ID+"\n" {
				t.Fatalf("round %d: branch %s: %q", round, k.ID, got)
			}
		}
		if round == 2 {
			if _, err := sc.Commit(ctx, kids[1].ID); err != nil {
				t.Fatal(err)
			}
			if out, err := execIn(ctx, env, "sb", "cat", "/mine"); err != nil || out != kids[1].ID+"\n" {
				t.Fatalf("sandbox after the commit of %s: %q %v", kids[1].ID, out, err)
			}
		} else {
			for _, k := range kids {
				if _, err := sc.Abort(ctx, k.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		sandboxWritable(t, ctx, env, "round "+strconv.Itoa(round)+", branches ended")
	}
}

// writersScript starts a log writer (appending through a descriptor it
// keeps) and a database-like writer (a file held open read-write and
// rewritten in place with a counter) in the sandbox.
const (
	logWriter = "exec 4>>/log; touch /log.ready; while :; do echo x >&4; sleep 0.01; done"
	dbWriter  = "i=0; echo 0 > /db; exec 3<>/db; touch /db.ready; while :; do i=$((i+1)); echo $i 1<>/db; sleep 0.01; done"
)

// hostRead reads a file of the sandbox's rootfs as its init sees it.
func hostRead(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "root", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestContextsSealWriters is issue 16's second case: a sandbox with files
// open for writing (a log appended to, a database rewritten in place)
// forks, in the default mode (its processes are frozen for the branches'
// lifetime, since no remount can take the files from their writers) and
// with --seal freeze; the branches' copies stay as they were at the fork
// (no write of the sandbox after it reaches them), and the writers resume
// once the branches end, by abort and by commit.
func TestContextsSealWriters(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	pid := sandboxInitPid(t, ctx, sc)
	startInSandbox(t, ctx, env, logWriter, "/log.ready")
	startInSandbox(t, ctx, env, dbWriter, "/db.ready")

	for _, seal := range []string{"", "freeze", ""} {
		kids := fork(t, ctx, sc, client.ForkOptions{Count: 2, Seal: seal})
		// The sandbox is still; its branches see it as it is.
		db, lg := hostRead(t, pid, "/db"), hostRead(t, pid, "/log")
		var seen []string
		for _, k := range kids {
			seen = append(seen, mustRun(t, ctx, sc, k.ID, "sh", "-c", "cat /db; wc -l < /log"))
		}
		time.Sleep(300 * time.Millisecond)
		if db2, lg2 := hostRead(t, pid, "/db"), hostRead(t, pid, "/log"); db2 != db || lg2 != lg {
			t.Fatalf("seal %q: the sandbox wrote while forked: /db %q -> %q, /log %d -> %d lines", seal, db, db2, strings.Count(lg, "\n"), strings.Count(lg2, "\n"))
		}
		want := db + strconv.Itoa(strings.Count(lg, "\n")) + "\n"
		for i, k := range kids {
			if got := mustRun(t, ctx, sc, k.ID, "sh", "-c", "cat /db; wc -l < /log"); got != seen[i] || got != want {
				t.Fatalf("seal %q: branch %s sees %q then %q; want the sandbox's state at the fork %q", seal, k.ID, seen[i], got, want)
			}
		}
		// A branch writes its own copy; the others do not see it.
		mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "echo 999999 > /db && echo "+k0(kids)+" > /from-branch")
		if got := mustRun(t, ctx, sc, kids[1].ID, "cat", "/db"); got != db {
			t.Fatalf("seal %q: a sibling sees %q", seal, got)
		}
		if seal == "freeze" {
			if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
				t.Fatal(err)
			}
			if got := hostRead(t, pid, "/from-branch"); got != kids[0].ID+"\n" {
				t.Fatalf("the sandbox after the commit: /from-branch %q", got)
			}
		} else {
			for _, k := range kids {
				if _, err := sc.Abort(ctx, k.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The writers resume.
		n0 := strings.Count(hostRead(t, pid, "/log"), "\n")
		waitFor(t, func() bool {
			return strings.Count(hostRead(t, pid, "/log"), "\n") > n0+3 && hostRead(t, pid, "/db") != db && hostRead(t, pid, "/db") != "999999\n"
		})
		sandboxWritable(t, ctx, env, "seal "+seal+", branches ended")
	}
}

func k0(kids []client.BranchInfo) string { return kids[0].ID }

// TestContextsSealWriterOutside: a file of the sandbox's rootfs held open
// for writing by a process that is not the sandbox's (here, on the host,
// through /proc/<init>/root) cannot be frozen away: the default fork fails,
// naming the file, the process and its command, and leaves the sandbox
// running and writable; once the writer is gone the fork works.
func TestContextsSealWriterOutside(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	pid := sandboxInitPid(t, ctx, sc)
	w := exec.Command("sh", "-c", "exec 3>>/proc/"+strconv.Itoa(pid)+"/root/hostlog; exec sleep 100000")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Process.Kill(); _ = w.Wait() })
	waitFor(t, func() bool { _, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/root/hostlog"); return err == nil })
	time.Sleep(100 * time.Millisecond) // the exec of sleep, keeping fd 3
	_, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
	var we *branch.WritersError
	if !errors.As(err, &we) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("fork with a writer outside the sandbox: %v; want a WritersError", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "hostlog") || !strings.Contains(msg, "pid "+strconv.Itoa(w.Process.Pid)) || !strings.Contains(msg, "sleep") {
		t.Fatalf("error does not name hostlog, pid %d and sleep: %v", w.Process.Pid, err)
	}
	sandboxWritable(t, ctx, env, "after the refused fork")
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == branch.RootID && (len(n.Children) != 0 || n.Sealed) {
			t.Fatalf("a refused fork left %+v", n)
		}
	}
	_ = w.Process.Kill()
	_ = w.Wait()
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	sandboxWriteRefused(t, ctx, env, "writer gone")
	if _, err := sc.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
}

// TestContextsSealSelfForkWriters: a fork asked for from inside a sandbox
// whose processes write a file is not frozen behind its caller's back (the
// caller is one of them, and may mean to drive its branches): it fails,
// naming the file; --seal freeze forks, and the caller's branch commits
// itself, which thaws it.
func TestContextsSealSelfForkWriters(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	importInsockImage(t, ctx, env)
	runInsockSandbox(t, ctx, env, "sb", true, "echo x > /state; exec sleep 100000")
	startInSandbox(t, ctx, env, logWriter, "/log.ready")
	out, err := execIn(ctx, env, "sb", "branchctl", "self", "fork", "-n", "1")
	if err == nil || !strings.Contains(out+err.Error(), "/log") || !strings.Contains(out+err.Error(), "open for writing") {
		t.Fatalf("self fork with a writer: %q %v; want a refusal naming /log", out, err)
	}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo y > /state"); err != nil {
		t.Fatalf("sandbox after the refused self fork: %v", err)
	}
	// With --seal freeze the caller freezes too, until its branch, which
	// commits itself, ends.
	if out, err := execIn(ctx, env, "sb", "branchctl", "self", "fork", "-n", "1", "--seal", "freeze", "--", "sh", "-c", "echo from-branch > /committed && branchctl self commit"); err != nil {
		t.Fatalf("self fork --seal freeze: %q %v", out, err)
	}
	waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/committed"); return out == "from-branch\n" })
	n0, _ := execIn(ctx, env, "sb", "sh", "-c", "wc -l < /log")
	waitFor(t, func() bool { n, _ := execIn(ctx, env, "sb", "sh", "-c", "wc -l < /log"); return n != n0 })
}
