//go:build linux

package integration

import (
	"os"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestStatePathWithSpace: a node whose containerd and snapshotter state
// directories have a space in their path. Before, a fork sealed nothing
// there (the snapshotter looked its live overlay up in the mount table,
// which escapes the space) and the sandbox went on writing under its
// branches; and a memory fork of a sandbox with a tmpfs (/dev/shm) failed
// at the restore ("read unixpacket: EOF": CRIU refused the configuration
// file that names the tmpfs copies, a quoted path with a space).
func TestStatePathWithSpace(t *testing.T) {
	requireRoot(t)
	parent, err := os.MkdirTemp(t.TempDir(), "node state ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	// The env's namespace (and the runtime's state under it, host-wide) is
	// named after the directory's base: no space, and a name of its own.
	dir, err := os.MkdirTemp(parent, "bbx-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	ctx, env, sc := replSandboxWith(t, daemons.Config{Dir: dir})
	if !strings.Contains(env.SnapshotterRoot, " ") {
		t.Fatalf("snapshotter root %q has no space", env.SnapshotterRoot)
	}
	// No file open for writing: the seal makes the rootfs read-only (it
	// would freeze the REPL instead).
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=kept; exec 3>&-; echo > /state`)
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 2, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork: %v", err)
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "exec 2>&1; echo x > /state"); err == nil || !strings.Contains(out, "Read-only file system") {
		t.Fatalf("write in the sealed sandbox: %q %v; want EROFS", out, err)
	}
	a, b := res.Branches[0], res.Branches[1]
	if got := replIn(t, ctx, env, sc, a.ID, 1, `echo $mem; echo from-a > /state`); got != "kept\n" {
		t.Fatalf("branch %s continues with %q, want the sandbox's variable", a.ID, got)
	}
	if _, err := sc.Abort(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Commit(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "from-a\n" {
		t.Fatalf("the sandbox reads /state %q (%v) after the commit, want the winner's", out, err)
	}
}
