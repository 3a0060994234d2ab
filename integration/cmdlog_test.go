//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// The bounds of a branch's output log (shim/cmdlog, brinit.c's op log):
// it keeps the last 1 MiB to 2 MiB, plus what one read of the pipe adds
// before the log is cut again.
const (
	outputLogMin = 1 << 20
	outputLogMax = 2<<20 + 64<<10
)

// branchBundle is the bundle of branch id of the sandbox sb.
func branchBundle(env *daemons.Env, id string) string {
	return filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb", "branches", id)
}

// outputLog reads the output of the sandbox sb's branch id (the client's
// Output), once it holds end at its end, and checks that branchctl logs
// and the file in the bundle say the same.
func outputLog(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, id, end string) []byte {
	t.Helper()
	var b []byte
	waitUntil(t, "the end of branch "+id+"'s output", 30*time.Second, func() bool {
		var err error
		if b, err = sc.Output(ctx, id); err != nil {
			t.Fatal(err)
		}
		return bytes.HasSuffix(b, []byte(end))
	})
	file, err := os.ReadFile(filepath.Join(branchBundle(env, id), "init.log"))
	if err != nil || !bytes.Equal(file, b) {
		t.Fatalf("the branch's init.log (%d bytes, %v) is not what Output returned (%d bytes)", len(file), err, len(b))
	}
	if out, errOut, code := branchctl(t, ctx, env, "", "logs", "sb/"+id); code != 0 || out != string(b) {
		t.Fatalf("branchctl logs sb/%s: exit %d, %d bytes, not Output's %d: %s", id, code, len(out), len(b), errOut)
	}
	return b
}

// checkOutputLog: a log of a process that wrote 8 MB then end holds the
// last part of it, within the bounds, and nothing else (no write error:
// the process's end of the pipe blocks, and is never failed with
// EAGAIN).
func checkOutputLog(t *testing.T, b []byte, fill byte, end string) {
	t.Helper()
	if len(b) < outputLogMin || len(b) > outputLogMax {
		t.Fatalf("the branch's log holds %d bytes after 8 MB of output, want %d to %d", len(b), outputLogMin, outputLogMax)
	}
	body := bytes.TrimSuffix(b, []byte("\n"+end))
	if len(bytes.Trim(body, string(fill))) != 0 {
		t.Fatalf("the branch's log holds more than the output's end: %.200q", bytes.Trim(body, string(fill)))
	}
}

// TestBranchOutputLogBounded: what a branch's processes write to their
// stdout and stderr is kept in its bundle's init.log, bounded: a command
// given at fork (run by the branch init, which copies the output at the
// branch's cost) and a memory branch's restored processes (run by the
// runtime; the shim copies) each write 8 MB, and the log keeps the last 1
// to 2 MiB of it, which the client's Output and branchctl logs return.
// Before, the file grew with everything written (3 GB in
// 5 s of `yes`, in containerd's state directory, a tmpfs on a node).
func TestBranchOutputLogBounded(t *testing.T) {
	t.Run("command", func(t *testing.T) {
		ctx, env, sc := sandboxCtxEnv(t)
		k := fork(t, ctx, sc, client.ForkOptions{Count: 1, Args: []string{"sh", "-c",
			`head -c 8000000 /dev/zero | tr '\0' x || echo "the pipeline failed"; echo; echo END; exit 3`}})[0]
		checkOutputLog(t, outputLog(t, ctx, env, sc, k.ID, "END\n"), 'x', "END\n")
		// The sandbox's own output is containerd's, not a branch's log.
		if _, err := sc.Output(ctx, "0"); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "nerdctl logs") {
			t.Fatalf("output of the sandbox itself: %v; want invalid argument naming nerdctl logs", err)
		}
		waitUntil(t, "the command's exit", 10*time.Second, func() bool {
			st, code := branchStatus(t, ctx, sc, k.ID)
			return st == "exited" && code == 3
		})
	})
	t.Run("full disk", func(t *testing.T) {
		// A nested branch's bundle on a 512 KiB tmpfs (nested: its id is
		// the next, its parent's plus one): the init's log fills it, and
		// the command must still write all it has and exit, its output
		// beyond what fits dropped.
		ctx, env, sc := sandboxCtxEnv(t)
		parent := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
		next, err := strconv.Atoi(parent.ID)
		if err != nil {
			t.Fatal(err)
		}
		dir := branchBundle(env, strconv.Itoa(next+1))
		if err := os.MkdirAll(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=512k,mode=0711"); err != nil {
			t.Fatal(err)
		}
		// Before the sandbox goes (cleanups run last first).
		t.Cleanup(func() {
			if _, err := sc.Abort(context.WithoutCancel(ctx), parent.ID); err != nil {
				t.Errorf("abort %s: %v", parent.ID, err)
			}
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				t.Errorf("unmount the bundle's tmpfs: %v", err)
			}
			_ = os.Remove(dir)
		})
		k := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: parent.ID, Args: []string{"sh", "-c",
			`head -c 8000000 /dev/zero | tr '\0' x || exit 9; exit 3`}})[0]
		if k.ID != filepath.Base(dir) {
			t.Fatalf("the nested branch is %s, not the next id %s whose bundle is on the tmpfs", k.ID, filepath.Base(dir))
		}
		waitUntil(t, "the command's exit with its output dropped", 30*time.Second, func() bool {
			st, code := branchStatus(t, ctx, sc, k.ID)
			return st == "exited" && code == 3
		})
		out, err := sc.Output(ctx, k.ID)
		if err != nil || len(out) == 0 || len(out) > 512<<10 || len(bytes.Trim(out, "x")) != 0 {
			t.Fatalf("log on a full disk: %d bytes, %v; want what fit, only the output's", len(out), err)
		}
	})
	t.Run("memory", func(t *testing.T) {
		// Its process writes once /go exists: in the branch only.
		ctx, env, _ := shimEnv(t)
		sc := runSandbox(t, ctx, env, ociimage.ImageRef, "sh", "-c",
			`while [ ! -e /go ]; do sleep 0.05; done; head -c 8000000 /dev/zero | tr '\0' y || echo "the pipeline failed"; echo; echo END; exec sleep 100000`)
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		mustRun(t, ctx, sc, kids[0].ID, "touch", "/go")
		checkOutputLog(t, outputLog(t, ctx, env, sc, kids[0].ID, "END\n"), 'y', "END\n")
	})
}

// branchStatus is branch id's status and exit status, as the tree says.
func branchStatus(t *testing.T, ctx context.Context, sc *client.SandboxClient, id string) (string, int) {
	t.Helper()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == id {
			return n.Status, n.ExitStatus
		}
	}
	t.Fatalf("branch %s not in the tree", id)
	return "", 0
}
