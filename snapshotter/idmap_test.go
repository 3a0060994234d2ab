//go:build linux

package snapshotter

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
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
func TestIDMappedSnapshotAndBranches(t *testing.T) {
	ctx, s := newTest(t)
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
	wantOwner(t, root, idmapHost, idmapHost)
	wantOwner(t, filepath.Join(root, "etc", "base.conf"), idmapHost, idmapHost)
	wantOwner(t, filepath.Join(root, "home", "user.txt"), idmapHost+1000, idmapHost+1000)
	// What the container's root writes is the mapped root's on the host.
	writeFile(t, filepath.Join(root, "state"), "the sandbox's\n")
	if err := unix.Lchown(filepath.Join(root, "state"), idmapHost, idmapHost); err != nil {
		t.Fatal(err)
	}

	sb := sandbox{s: s, key: "ns/1/userns"}
	sb.root.Key = sb.key
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
	for _, m := range kids[0].Mounts {
		for _, o := range m.Options {
			if strings.HasPrefix(o, "uidmap=") || strings.HasPrefix(o, "gidmap=") {
				t.Fatalf("a branch's mount would id-map every lower, its ancestors' uppers too: %v", m)
			}
		}
	}
	kid := mountAt(t, kids[0].Mounts)
	check := func(dir string) {
		t.Helper()
		wantOwner(t, filepath.Join(dir, "etc", "base.conf"), idmapHost, idmapHost)
		wantOwner(t, filepath.Join(dir, "home", "user.txt"), idmapHost+1000, idmapHost+1000)
		// Mapped twice it would be out of the range (the overflow id).
		wantOwner(t, filepath.Join(dir, "state"), idmapHost, idmapHost)
	}
	check(kid)
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
	check(inner)
	wantOwner(t, filepath.Join(inner, "made"), idmapHost+5, idmapHost+5)
	wantOwner(t, filepath.Join(inner, "etc", "base.conf"), idmapHost, idmapHost)
	if _, err := s.Abort(ctx, sb.ctx(nested[0].ID)); err != nil {
		t.Fatal(err)
	}
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
	wantOwner(t, filepath.Join(base[0].Source, "etc", "base.conf"), 0, 0)

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
