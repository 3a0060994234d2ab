//go:build linux

package snapshotter

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

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// inOtherMountNS starts a process in a new mount namespace, a private
// copy of this one (so it holds a mount of every overlay mounted here, as
// a container holds its root), running sh -c script; it is killed at
// cleanup, and its arguments are "$1"... It returns the process's pid
// once script has written ready.
func inOtherMountNS(t *testing.T, script string, args ...string) int {
	t.Helper()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	// Paths are arguments, not script: the test's root may have a space.
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script + `; echo > "$0"; exec sleep 100000`, ready}, args...)...)
	// No Pdeathsig: it fires when the thread that started the process
	// ends, and the seal's namespace threads end.
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if i > 500 {
			t.Fatal("the process in a second mount namespace did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cmd.Process.Pid
}

// nsOf is the inode of a process's mount namespace.
func nsOf(t *testing.T, pid string) uint64 {
	t.Helper()
	ns, err := overlay.MountNS("/proc/" + pid + "/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// sealedIn says whether one of ms is in the mount namespace ns.
func sealedIn(ms []branch.SealedMount, ns uint64) bool {
	for _, m := range ms {
		if m.NS == ns {
			return true
		}
	}
	return false
}

func expectEROFS(t *testing.T, what, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("%s: write to %s: got %v, want EROFS", what, path, err)
	}
}

func expectWritable(t *testing.T, what, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatalf("%s: write to %s: %v", what, path, err)
	}
}

// TestSealPerMountUnlinkedOpen: a parent whose superblock holds a file
// unlinked while open cannot have its superblock remounted read-only;
// fork seals it mount by mount instead, in this mount namespace and in a
// second one (standing for the container's own), and abort makes exactly
// those mounts writable again, leaving a mount that was read-only of its
// own read-only.
func TestSealPerMountUnlinkedOpen(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	writeFile(t, filepath.Join(p, "gone"), "held open\n")
	f, err := os.Open(filepath.Join(p, "gone"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := os.Remove(filepath.Join(p, "gone")); err != nil {
		t.Fatal(err)
	}
	// A read-only bind of the parent's own, which no seal may touch.
	ro := t.TempDir()
	if err := unix.Mount(p, ro, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	pid := inOtherMountNS(t, "true")
	other := "/proc/" + strconv.Itoa(pid) + "/root" + p
	selfNS, otherNS := nsOf(t, "self"), nsOf(t, strconv.Itoa(pid))

	for round := 0; round < 3; round++ {
		kids, err := s.Fork(ctx, sb.ctx(""), 2)
		if err != nil {
			t.Fatalf("round %d: fork of a parent holding a file unlinked while open: %v", round, err)
		}
		tr, err := s.Tree(ctx, sb.root)
		if err != nil {
			t.Fatal(err)
		}
		// This namespace's mount and the other's; any other process on
		// the host in a mount namespace copied from this one meanwhile
		// (a branch init of a test running beside this one) holds one
		// too, which is sealed the same.
		if n := tr.Nodes[0]; n.SealMode != branch.SealMounts || !sealedIn(n.SealedMounts, selfNS) || !sealedIn(n.SealedMounts, otherNS) {
			t.Fatalf("round %d: root sealed as %q with mounts %v, want %q with one in this namespace (%d) and one in the other (%d)", round, n.SealMode, n.SealedMounts, branch.SealMounts, selfNS, otherNS)
		}
		expectEROFS(t, "sealed, this namespace", filepath.Join(p, "x"))
		expectEROFS(t, "sealed, the other namespace", filepath.Join(other, "x"))
		// The child sees the parent as it was at the fork.
		km := mountAt(t, kids[0].Mounts)
		if got := readFile(t, filepath.Join(km, "app", "main.txt")); got != "version 1\n" {
			t.Fatalf("child sees %q", got)
		}
		if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
			t.Fatal(err)
		}
		expectEROFS(t, "one child left", filepath.Join(p, "x"))
		if _, err := s.Abort(ctx, sb.ctx(kids[1].ID)); err != nil {
			t.Fatal(err)
		}
		expectWritable(t, "unsealed, this namespace", filepath.Join(p, "x"))
		expectWritable(t, "unsealed, the other namespace", filepath.Join(other, "x"))
		expectEROFS(t, "a mount read-only of its own", filepath.Join(ro, "x"))
		tr, _ = s.Tree(ctx, sb.root)
		if n := tr.Nodes[0]; n.SealedByUs || n.SealMode != "" || n.SealedMounts != nil {
			t.Fatalf("round %d: unsealed root still records a seal: %+v", round, n.Node)
		}
	}

	// A commit unseals the same mounts and applies through the host's.
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	commitVersion2(t, ctx, sb, kids[0].ID, mountAt(t, kids[0].Mounts), other)
	expectWritable(t, "after commit, the other namespace", filepath.Join(other, "x"))
}

// TestSealPerMountNamesWriters: a file open for writing through the mount
// in the second namespace makes the per-mount seal fail, naming the file
// and the process; nothing stays sealed or forked.
func TestSealPerMountNamesWriters(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	writeFile(t, filepath.Join(p, "gone"), "held open\n")
	f, err := os.Open(filepath.Join(p, "gone"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := os.Remove(filepath.Join(p, "gone")); err != nil {
		t.Fatal(err)
	}
	pid := inOtherMountNS(t, `exec 3>>"$1"`, filepath.Join(p, "app.log"))
	_, err = s.Fork(ctx, sb.ctx(""), 1)
	var we *branch.WritersError
	if !errors.As(err, &we) {
		t.Fatalf("fork with a writer in another namespace: got %v, want a WritersError", err)
	}
	found := false
	for _, w := range we.Writers {
		found = found || (w.Pid == pid && w.Command == "sleep" && strings.HasSuffix(w.Path, "/app.log"))
	}
	if !found || !strings.Contains(err.Error(), "app.log") || !strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) {
		t.Fatalf("error does not name app.log held by pid %d (sleep): %v (%+v)", pid, err, we.Writers)
	}
	expectWritable(t, "after a refused fork", filepath.Join(p, "x"))
	expectWritable(t, "after a refused fork, the other namespace", filepath.Join("/proc", strconv.Itoa(pid), "root", p, "y"))
	tr, _ := s.Tree(ctx, sb.root)
	if n := tr.Nodes[0]; len(n.Children) != 0 || n.SealedByUs {
		t.Fatalf("a refused fork left %+v", n)
	}

	// The caller froze the writers (here: says so): no remount, no error.
	kids, err := s.ForkFrom(ctx, sb.ctx(""), 1, "", WithParentFrozen())
	if err != nil {
		t.Fatalf("fork with the parent frozen by the caller: %v", err)
	}
	tr, _ = s.Tree(ctx, sb.root)
	if n := tr.Nodes[0]; n.SealMode != branch.SealCaller {
		t.Fatalf("sealed as %q, want %q", n.SealMode, branch.SealCaller)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
}

// TestSealPerMountRecovery: a daemon that died after recording a per-mount
// seal but before setting every flag (here: the flags are cleared behind
// its back) seals the recorded mounts again at start, and unseals exactly
// them once the last child ends.
func TestSealPerMountRecovery(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
	})
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	writeFile(t, filepath.Join(p, "gone"), "held open\n")
	f, err := os.Open(filepath.Join(p, "gone"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := os.Remove(filepath.Join(p, "gone")); err != nil {
		t.Fatal(err)
	}
	pid := inOtherMountNS(t, "true")
	other := "/proc/" + strconv.Itoa(pid) + "/root" + p
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := s.Tree(ctx, sb.root)
	recorded := tr.Nodes[0].SealedMounts
	if !sealedIn(recorded, nsOf(t, "self")) || !sealedIn(recorded, nsOf(t, strconv.Itoa(pid))) {
		t.Fatalf("recorded %v, want a mount in this namespace and one in the other", recorded)
	}
	upper := s.branchUpper(s.mustID(t, ctx, sb.key), branch.RootID)
	s.Close()
	closed = true
	// The flags as a crash before they were set would leave them.
	if err := overlay.SetEachRecorded(ctx, s.sealer, recorded, upper, false); err != nil {
		t.Fatal(err)
	}
	expectWritable(t, "flags cleared", filepath.Join(other, "x"))

	s2, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	expectEROFS(t, "resealed at start, this namespace", filepath.Join(p, "x"))
	expectEROFS(t, "resealed at start, the other namespace", filepath.Join(other, "x"))
	if _, err := s2.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	expectWritable(t, "unsealed, this namespace", filepath.Join(p, "x"))
	expectWritable(t, "unsealed, the other namespace", filepath.Join(other, "x"))
}

// TestSealEachMountAfterSlowSeal: a parent whose superblock seal was slow
// (its dentries freed first: 20,000 files looked up through its mount) is
// sealed mount by mount at its next fork, in this mount namespace and in
// a second one; the children see it as it was, abort and commit make it
// writable again everywhere, and a seal that is no longer slow to make
// (nothing looked up since) sends it back to the superblock's in time.
func TestSealEachMountAfterSlowSeal(t *testing.T) {
	ctx, s := newTest(t)
	s.choice.threshold = SlowSuperblockSeal // what --seal-mounts-after=2ms sets
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	for d := 0; d < 200; d++ {
		dir := filepath.Join(p, "tree", strconv.Itoa(d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := 0; f < 100; f++ {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(f)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	pid := inOtherMountNS(t, "true")
	other := "/proc/" + strconv.Itoa(pid) + "/root" + p
	selfNS, otherNS := nsOf(t, "self"), nsOf(t, strconv.Itoa(pid))
	lookUp := func() {
		t.Helper()
		if err := filepath.WalkDir(filepath.Join(p, "tree"), func(path string, d os.DirEntry, err error) error {
			if err == nil {
				_, err = d.Info()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	sealMode := func() branch.Node {
		t.Helper()
		tr, err := s.Tree(ctx, sb.root)
		if err != nil {
			t.Fatal(err)
		}
		return tr.Nodes[0].Node
	}

	// The first fork frees the 20,000 dentries the writes left: slow.
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := sealMode(); n.SealMode != branch.SealSuperblock {
		t.Fatalf("first fork sealed %q, want the superblock", n.SealMode)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		lookUp()
		kids, err := s.Fork(ctx, sb.ctx(""), 2)
		if err != nil {
			t.Fatal(err)
		}
		if n := sealMode(); n.SealMode != branch.SealMounts || !sealedIn(n.SealedMounts, selfNS) || !sealedIn(n.SealedMounts, otherNS) {
			t.Fatalf("round %d: after a slow seal the root is sealed %q with mounts %v, want %q in this namespace (%d) and the other (%d)", round, n.SealMode, n.SealedMounts, branch.SealMounts, selfNS, otherNS)
		}
		expectEROFS(t, "sealed, this namespace", filepath.Join(p, "x"))
		expectEROFS(t, "sealed, the other namespace", filepath.Join(other, "x"))
		km := mountAt(t, kids[0].Mounts)
		if got := readFile(t, filepath.Join(km, "app", "main.txt")); got != "version 1\n" {
			t.Fatalf("child sees %q", got)
		}
		if _, err := os.Stat(filepath.Join(km, "tree", "199", "99")); err != nil {
			t.Fatalf("child does not see the parent's files: %v", err)
		}
		if _, err := s.Abort(ctx, sb.ctx(kids[1].ID)); err != nil {
			t.Fatal(err)
		}
		expectEROFS(t, "one child left", filepath.Join(p, "x"))
		if round == 0 {
			if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
				t.Fatal(err)
			}
		} else {
			commitVersion2(t, ctx, sb, kids[0].ID, km, other)
		}
		expectWritable(t, "unsealed, this namespace", filepath.Join(p, "x"))
		expectWritable(t, "unsealed, the other namespace", filepath.Join(other, "x"))
		if n := sealMode(); n.SealedByUs || n.SealMode != "" || n.SealedMounts != nil {
			t.Fatalf("round %d: unsealed root still records a seal: %+v", round, n)
		}
	}
	// With nothing looked up the per-mount seals are kept until the slow
	// seal's cost, decayed, is below theirs; then the superblock again.
	for i := 0; ; i++ {
		kids, err := s.Fork(ctx, sb.ctx(""), 1)
		if err != nil {
			t.Fatal(err)
		}
		mode := sealMode().SealMode
		if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
			t.Fatal(err)
		}
		if mode == branch.SealSuperblock {
			break
		}
		if i == 40 {
			t.Fatal("still sealed mount by mount after 40 forks with nothing looked up")
		}
	}
}

// commitVersion2 writes version 2 of app/main.txt in branch id, mounted
// at km, and commits it: the parent's mount seen from the other
// namespace (other) must show it.
func commitVersion2(t *testing.T, ctx context.Context, sb sandbox, id, km, other string) {
	t.Helper()
	writeFile(t, filepath.Join(km, "app", "main.txt"), "version 2\n")
	if err := unix.Unmount(km, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.s.CommitBranch(ctx, sb.ctx(id)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(other, "app", "main.txt")); got != "version 2\n" {
		t.Fatalf("after commit the other namespace sees %q", got)
	}
}
