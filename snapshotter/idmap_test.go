//go:build linux

package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

// The host range the id-mapped tests map container ids 0-65535 onto.
const idmapHost = 300000

func ownerAt(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func wantOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()
	if u, g := ownerAt(t, path); u != uid || g != gid {
		t.Errorf("%s is owned by %d:%d, want %d:%d", path, u, g, uid, gid)
	}
}

// TestIDMappedSnapshotAndBranches: a root snapshot prepared with the
// id-mapping labels mounts (through containerd's mount code) with its image
// layer id-mapped, and its branches and theirs see the image mapped once
// and their ancestors' uppers (host ids already) not mapped again; a
// commit keeps the owners; removing the root detaches the id-mapped view.
// idmappedRoot prepares, on a one-layer image (a root-owned file and a
// file of uid 1000), a root snapshot with the id-mapping labels, mounts it
// and writes a file there owned by the mapped root (as the container's
// root would); it returns the root's directory and the image layer's.
func idmappedRoot(t *testing.T, ctx context.Context, s *Snapshotter) (sandbox, string, string) {
	t.Helper()
	// Last, once the test's mounts are gone: removing the root detaches
	// its id-mapped view, which the test's directory cannot be removed
	// through (it is read-only).
	t.Cleanup(func() {
		if err := s.Remove(ctx, "ns/1/userns"); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("remove the root: %v", err)
		}
	})
	base, err := s.Prepare(ctx, "base-active", "")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(base[0].Source, "etc", "base.conf"), "from the image\n")
	writeFile(t, filepath.Join(base[0].Source, "home", "user.txt"), "a user's\n")
	if err := unix.Lchown(filepath.Join(base[0].Source, "home", "user.txt"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	mapping := "0:300000:65536"
	labels := snapshots.WithLabels(map[string]string{
		snapshots.LabelSnapshotUIDMapping: mapping,
		snapshots.LabelSnapshotGIDMapping: mapping,
	})
	rootMounts, err := s.Prepare(ctx, "ns/1/userns", "base", labels)
	if err != nil {
		t.Fatal(err)
	}
	opts := strings.Join(rootMounts[0].Options, ",")
	if !strings.Contains(opts, "uidmap="+mapping) || !strings.Contains(opts, "gidmap="+mapping) {
		t.Fatalf("the root's mount does not id-map: %v", rootMounts)
	}
	root := mountAt(t, rootMounts)
	writeFile(t, filepath.Join(root, "state"), "the sandbox's\n")
	if err := unix.Lchown(filepath.Join(root, "state"), idmapHost, idmapHost); err != nil {
		t.Fatal(err)
	}
	sb := sandbox{s: s, key: "ns/1/userns"}
	sb.root.Key = sb.key
	return sb, root, base[0].Source
}

// checkMapped checks the owners a merged view of an id-mapped branch
// shows: the image's files mapped once, the sandbox's own file (host ids
// already) not mapped again, which would give the overflow id.
func checkMapped(t *testing.T, dir string) {
	t.Helper()
	wantOwner(t, dir, idmapHost, idmapHost)
	wantOwner(t, filepath.Join(dir, "etc", "base.conf"), idmapHost, idmapHost)
	wantOwner(t, filepath.Join(dir, "home", "user.txt"), idmapHost+1000, idmapHost+1000)
	wantOwner(t, filepath.Join(dir, "state"), idmapHost, idmapHost)
}

func TestIDMappedSnapshotAndBranches(t *testing.T) {
	ctx, s := newTest(t)
	sb, root, baseDir := idmappedRoot(t, ctx, s)
	checkMapped(t, root)

	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	var r rootSnap
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		r, _, err = s.resolve(ctx, sb.ctx(""))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	view := s.idmapView(r.id())
	if mounted, err := mountinfo.Mounted(view); err != nil || !mounted {
		t.Fatalf("the id-mapped view %s is not mounted: %v", view, err)
	}
	// The reaper leaves the view of a live tree alone.
	if removed, err := s.Reap(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("reap: removed %v (%v)", removed, err)
	}
	if mounted, _ := mountinfo.Mounted(view); !mounted {
		t.Fatalf("the reaper detached the id-mapped view %s of a live tree", view)
	}
	for _, m := range kids[0].Mounts {
		for _, o := range m.Options {
			if strings.HasPrefix(o, "uidmap=") || strings.HasPrefix(o, "gidmap=") {
				t.Fatalf("a branch's mount would id-map every lower, its ancestors' uppers too: %v", m)
			}
		}
	}
	kid := mountAt(t, kids[0].Mounts)
	checkMapped(t, kid)
	writeFile(t, filepath.Join(kid, "made"), "the branch's\n")
	if err := unix.Lchown(filepath.Join(kid, "made"), idmapHost+5, idmapHost+5); err != nil {
		t.Fatal(err)
	}
	// A change to an image file copies it up with its mapped owner.
	writeFile(t, filepath.Join(kid, "etc", "base.conf"), "changed\n")

	nested, err := s.Fork(ctx, sb.ctx(kids[0].ID), 1)
	if err != nil {
		t.Fatal(err)
	}
	inner := mountAt(t, nested[0].Mounts)
	checkMapped(t, inner)
	wantOwner(t, filepath.Join(inner, "made"), idmapHost+5, idmapHost+5)
	wantOwner(t, filepath.Join(inner, "etc", "base.conf"), idmapHost, idmapHost)
	if _, err := s.Abort(ctx, sb.ctx(nested[0].ID)); err != nil {
		t.Fatal(err)
	}
	// After a reboot the view is gone: the branch's mounts make it again.
	if err := unix.Unmount(view, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	again, err := s.BranchMounts(ctx, sb.ctx(kids[0].ID))
	if err != nil {
		t.Fatal(err)
	}
	if mounted, err := mountinfo.Mounted(view); err != nil || !mounted {
		t.Fatalf("the id-mapped view %s is not mounted again: %v", view, err)
	}
	checkMapped(t, mountAt(t, again))
	if err := mount.UnmountAll(kid, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	wantOwner(t, filepath.Join(root, "made"), idmapHost+5, idmapHost+5)
	wantOwner(t, filepath.Join(root, "etc", "base.conf"), idmapHost, idmapHost)
	if got := readFile(t, filepath.Join(root, "etc", "base.conf")); got != "changed\n" {
		t.Fatalf("the root reads %q after the commit", got)
	}
	// On disk the image layer keeps the image's own ids.
	wantOwner(t, filepath.Join(baseDir, "etc", "base.conf"), 0, 0)

	if err := mount.UnmountAll(root, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, sb.key); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := mountinfo.Mounted(view); mounted {
		t.Fatalf("the id-mapped view %s is still mounted after its root went", view)
	}
}

// TestIDMappedCheckpoints: a checkpoint of an id-mapped root, mounted,
// forked from and rolled back to, shows the same owners as the root.
func TestIDMappedCheckpoints(t *testing.T) {
	ctx, s := newTest(t)
	sb, root, _ := idmappedRoot(t, ctx, s)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "c1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "state")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "etc", "base.conf"), "changed\n")
	m, err := s.CheckpointMounts(ctx, sb.ctx(""), "c1")
	if err != nil {
		t.Fatal(err)
	}
	checkMapped(t, mountAt(t, m))
	kids, err := s.ForkFrom(ctx, sb.ctx(""), 1, "c1")
	if err != nil {
		t.Fatal(err)
	}
	checkMapped(t, mountAt(t, kids[0].Mounts))
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback(ctx, sb.ctx(""), "c1"); err != nil {
		t.Fatal(err)
	}
	checkMapped(t, root)
	if got := readFile(t, filepath.Join(root, "etc", "base.conf")); got != "from the image\n" {
		t.Fatalf("the root reads %q after the rollback", got)
	}
}

// TestIDMappedAlreadyChowned: a containerd that does not trust this
// snapshotter with remap-ids copies the image into a snapshot of its own,
// chowns it to the mapped ids, and prepares the container's snapshot on it
// with the labels all the same; that snapshot's mount must not map the
// chowned copy again.
func TestIDMappedAlreadyChowned(t *testing.T) {
	ctx, s := newTest(t)
	base, err := s.Prepare(ctx, "base-active", "")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(base[0].Source, "etc", "base.conf"), "from the image\n")
	if err := s.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	// What containerd's client does (client/snapshotter_opts_unix.go).
	remap, err := s.Prepare(ctx, "remapped-remap", "base")
	if err != nil {
		t.Fatal(err)
	}
	dir := mountAt(t, remap)
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, idmapHost, idmapHost)
	}); err != nil {
		t.Fatal(err)
	}
	if err := mount.UnmountAll(dir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "remapped", "remapped-remap"); err != nil {
		t.Fatal(err)
	}
	mapping := "0:300000:65536"
	m, err := s.Prepare(ctx, "ns/1/chowned", "remapped", snapshots.WithLabels(map[string]string{
		snapshots.LabelSnapshotUIDMapping: mapping,
		snapshots.LabelSnapshotGIDMapping: mapping,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(m[0].Options, ","), "uidmap=") {
		t.Fatalf("the mount of a snapshot on a chowned copy id-maps it again: %v", m)
	}
	root := mountAt(t, m)
	wantOwner(t, filepath.Join(root, "etc", "base.conf"), idmapHost, idmapHost)
	kids, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Key: "ns/1/chowned"}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	wantOwner(t, filepath.Join(mountAt(t, kids[0].Mounts), "etc", "base.conf"), idmapHost, idmapHost)
}

// TestIDMappedCommitUnmounted: a commit into an id-mapped root that is
// not mounted goes through a temporary mount of it, id-mapped as its
// own: the image's files keep their mapped owners, the branch's keep
// theirs.
func TestIDMappedCommitUnmounted(t *testing.T) {
	ctx, s := newTest(t)
	sb, root, _ := idmappedRoot(t, ctx, s)
	if err := mount.UnmountAll(root, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	kid := mountAt(t, kids[0].Mounts)
	writeFile(t, filepath.Join(kid, "etc", "base.conf"), "changed\n")
	writeFile(t, filepath.Join(kid, "made"), "the branch's\n")
	if err := unix.Lchown(filepath.Join(kid, "made"), idmapHost+5, idmapHost+5); err != nil {
		t.Fatal(err)
	}
	if err := mount.UnmountAll(kid, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	m, err := s.Mounts(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	again := mountAt(t, m)
	checkMapped(t, again)
	wantOwner(t, filepath.Join(again, "made"), idmapHost+5, idmapHost+5)
	if got := readFile(t, filepath.Join(again, "etc", "base.conf")); got != "changed\n" {
		t.Fatalf("the root reads %q after the commit", got)
	}
}
