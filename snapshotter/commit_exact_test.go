//go:build linux

package snapshotter

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/fstest"
)

// everyKind makes one change of every kind an upper layer can hold, in the
// mounted branch at d.
func everyKind(t *testing.T, d string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(d, "new", "file"), "new file\n")
	writeFile(t, filepath.Join(d, "app", "main.txt"), "version 2\n")                // modify a lower file
	must(os.Remove(filepath.Join(d, "etc", "base.conf")))                           // whiteout
	must(os.RemoveAll(filepath.Join(d, "app")))                                     // whole dir from lower...
	must(os.MkdirAll(filepath.Join(d, "app"), 0o750))                               // ...made anew: opaque
	writeFile(t, filepath.Join(d, "app", "only"), "only this\n")                    // inside the opaque dir
	must(os.Symlink("../new/file", filepath.Join(d, "etc", "link")))                // symlink
	must(os.Symlink("/etc/passwd", filepath.Join(d, "abs-link")))                   // absolute symlink, copied not followed
	must(os.Link(filepath.Join(d, "new", "file"), filepath.Join(d, "new", "hard"))) // hard link
	must(unix.Mkfifo(filepath.Join(d, "fifo"), 0o640))
	must(unix.Mknod(filepath.Join(d, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Setxattr(filepath.Join(d, "new", "file"), "user.branchbox", []byte("xattr value"), 0))
	writeFile(t, filepath.Join(d, "suid"), "#!/bin/sh\n")
	must(os.Chmod(filepath.Join(d, "suid"), 0o4755))
	must(os.Mkdir(filepath.Join(d, "sticky"), 0o1777))
	must(os.Chmod(filepath.Join(d, "sticky"), 0o1777))
	writeFile(t, filepath.Join(d, "owned"), "by nobody\n")
	must(os.Lchown(filepath.Join(d, "owned"), 65534, 65534))
	old := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	must(os.Chtimes(filepath.Join(d, "owned"), old, old))
	f, err := os.Create(filepath.Join(d, "sparse"))
	must(err)
	_, err = f.WriteAt([]byte("data after a hole"), 8<<20)
	must(err)
	must(f.Close())
	writeFile(t, filepath.Join(d, "type", "was-file"), "x")
	must(os.Remove(filepath.Join(d, "type", "was-file")))
	must(os.Mkdir(filepath.Join(d, "type", "was-file"), 0o700)) // file -> dir in one branch
}

// TestCommitMatchesChildExactly: after a commit the parent's merged tree
// equals the child's merged tree before it, entry for entry, through the
// parent's live mount and through a temporary one.
func TestCommitMatchesChildExactly(t *testing.T) {
	for _, mounted := range []bool{true, false} {
		t.Run(fmt.Sprintf("parentMounted=%v", mounted), func(t *testing.T) {
			ctx, s := newTest(t)
			sb := newSandbox(t, ctx, s, "sb")
			var parent string
			if mounted {
				rm, _ := s.Mounts(ctx, sb.key)
				parent = mountAt(t, rm)
			}
			kids, err := s.Fork(ctx, sb.ctx(""), 2)
			if err != nil {
				t.Fatal(err)
			}
			d := mountAt(t, kids[0].Mounts)
			everyKind(t, d)
			want, err := fstest.Scan(d)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
				t.Fatal(err)
			}
			if !mounted {
				rm, _ := s.Mounts(ctx, sb.key)
				parent = mountAt(t, rm)
			}
			got, err := fstest.Scan(parent)
			if err != nil {
				t.Fatal(err)
			}
			if diffs := fstest.DiffTrees(want, got); len(diffs) > 0 {
				t.Fatalf("parent differs from the child it committed: %v", diffs)
			}
		})
	}
}

// TestCommitRandomized: seeded random change sets, nested two deep, each
// committed level by level into the live root; after each round the root
// equals what the deepest branch showed.
func TestCommitRandomized(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d (set BRANCHBOX_SEED to replay)", seed)
	if v := os.Getenv("BRANCHBOX_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	rng := rand.New(rand.NewSource(seed))
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	root := mountAt(t, rm)
	for round := 0; round < 15; round++ {
		a, err := s.Fork(ctx, sb.ctx(""), 2)
		if err != nil {
			t.Fatal(err)
		}
		da := mountAt(t, a[1].Mounts)
		randomChanges(t, rng, da, 8)
		if err := mount.UnmountAll(da, 0); err != nil {
			t.Fatal(err)
		}
		b, err := s.Fork(ctx, sb.ctx(a[1].ID), 1)
		if err != nil {
			t.Fatal(err)
		}
		db := mountAt(t, b[0].Mounts)
		randomChanges(t, rng, db, 8)
		want, err := fstest.Scan(db)
		if err != nil {
			t.Fatal(err)
		}
		if err := mount.UnmountAll(db, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitBranch(ctx, sb.ctx(b[0].ID)); err != nil {
			t.Fatalf("round %d (seed %d): inner commit: %v", round, seed, err)
		}
		if _, err := s.CommitBranch(ctx, sb.ctx(a[1].ID)); err != nil {
			t.Fatalf("round %d (seed %d): outer commit: %v", round, seed, err)
		}
		got, err := fstest.Scan(root)
		if err != nil {
			t.Fatal(err)
		}
		if diffs := fstest.DiffTrees(want, got); len(diffs) > 0 {
			t.Fatalf("round %d (seed %d): root differs from the committed branch: %v", round, seed, diffs)
		}
	}
}

// randomChanges makes n random changes under d: create, overwrite, append,
// delete, delete a directory, replace a directory, symlink, hard link,
// chmod, xattr.
func randomChanges(t *testing.T, rng *rand.Rand, d string, n int) {
	t.Helper()
	names := []string{"a", "b", "c", "dir1/x", "dir1/y", "dir2/z", "dir2/sub/w", "app/main.txt", "etc/base.conf"}
	pick := func() string { return filepath.Join(d, names[rng.Intn(len(names))]) }
	for i := 0; i < n; i++ {
		p := pick()
		switch rng.Intn(9) {
		case 0, 1:
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.RemoveAll(p)
			os.WriteFile(p, []byte(fmt.Sprintf("content %d\n", rng.Int())), 0o644)
		case 2:
			if f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0); err == nil {
				fmt.Fprintf(f, "more %d\n", rng.Int())
				f.Close()
			}
		case 3:
			os.Remove(p)
		case 4:
			os.RemoveAll(filepath.Dir(p))
		case 5:
			dir := filepath.Dir(p)
			os.RemoveAll(dir)
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, "fresh"), []byte("fresh\n"), 0o600)
		case 6:
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.RemoveAll(p)
			os.Symlink(names[rng.Intn(len(names))], p)
		case 7:
			q := pick()
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && q != p {
				os.MkdirAll(filepath.Dir(q), 0o755)
				os.RemoveAll(q)
				os.Link(p, q)
			}
		case 8:
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
				os.Chmod(p, os.FileMode(rng.Intn(0o777)))
				unix.Setxattr(p, "user.r", []byte(fmt.Sprint(rng.Int())), 0)
			}
		}
	}
}
