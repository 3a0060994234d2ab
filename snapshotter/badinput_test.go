//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

func newTest(t *testing.T) (context.Context, *Snapshotter) {
	t.Helper()
	return newTestAt(t, t.TempDir())
}

// newTestAt is newTest with the snapshotter's root at root.
func newTestAt(t *testing.T, root string) (context.Context, *Snapshotter) {
	t.Helper()
	requireRoot(t)
	ctx := context.Background()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return ctx, s
}

// state is everything a bad call must leave untouched: the metadata and the
// snapshot directories.
func state(t *testing.T, ctx context.Context, s *Snapshotter) string {
	t.Helper()
	var rows []string
	if err := s.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		rows = append(rows, fmt.Sprintf("%s<-%s %v %v", i.Name, i.Parent, i.Kind, i.Labels))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(s.Root(), "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		rows = append(rows, "dir "+e.Name())
	}
	sort.Strings(rows)
	return strings.Join(rows, "\n")
}

func TestBadInput(t *testing.T) {
	ctx, s := newTest(t)
	if _, err := s.Prepare(ctx, "base-active", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "child", "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.View(ctx, "view", "base"); err != nil {
		t.Fatal(err)
	}
	before := state(t, ctx, s)

	for _, tc := range []struct {
		name    string
		call    func() error
		is      func(error) bool
		mention []string
	}{
		{"stat unknown key", func() error { _, err := s.Stat(ctx, "nope"); return err }, errdefs.IsNotFound, []string{`"nope"`}},
		{"mounts unknown key", func() error { _, err := s.Mounts(ctx, "nope"); return err }, errdefs.IsNotFound, []string{`"nope"`}},
		{"usage unknown key", func() error { _, err := s.Usage(ctx, "nope"); return err }, errdefs.IsNotFound, []string{`"nope"`}},
		{"remove unknown key", func() error { return s.Remove(ctx, "nope") }, errdefs.IsNotFound, []string{`"nope"`}},
		{"commit unknown key", func() error { return s.Commit(ctx, "x", "nope") }, errdefs.IsNotFound, []string{`"nope"`}},
		{"update unknown key", func() error {
			_, err := s.Update(ctx, snapshots.Info{Name: "nope", Labels: map[string]string{"a": "b"}}, "labels.a")
			return err
		}, errdefs.IsNotFound, []string{`"nope"`}},
		{"prepare on unknown parent", func() error { _, err := s.Prepare(ctx, "k", "nope"); return err }, errdefs.IsNotFound, []string{`parent "nope" does not exist`}},
		{"prepare on active parent", func() error { _, err := s.Prepare(ctx, "k", "child"); return err }, errdefs.IsInvalidArgument, []string{`parent "child"`, "commit it first"}},
		{"prepare on view parent", func() error { _, err := s.Prepare(ctx, "k", "view"); return err }, errdefs.IsInvalidArgument, []string{`parent "view"`}},
		{"duplicate key", func() error { _, err := s.Prepare(ctx, "child", "base"); return err }, errdefs.IsAlreadyExists, []string{`"child" already exists`}},
		{"duplicate of committed name", func() error { _, err := s.View(ctx, "base", ""); return err }, errdefs.IsAlreadyExists, []string{`"base" already exists`}},
		{"commit onto existing name", func() error { return s.Commit(ctx, "base", "child") }, errdefs.IsAlreadyExists, []string{`"child"`}},
		{"commit a view", func() error { return s.Commit(ctx, "x", "view") }, errdefs.IsFailedPrecondition, []string{"only active snapshots"}},
		{"remove with children", func() error { return s.Remove(ctx, "base") }, errdefs.IsFailedPrecondition, []string{"child", "remove its children first"}},
		{"empty key", func() error { _, err := s.Prepare(ctx, "", ""); return err }, errdefs.IsInvalidArgument, []string{"empty"}},
		{"dotdot key", func() error { _, err := s.Prepare(ctx, "../../etc", ""); return err }, errdefs.IsInvalidArgument, []string{`".."`}},
		{"dotdot inside key", func() error { _, err := s.Prepare(ctx, "ns/1/a/../b", ""); return err }, errdefs.IsInvalidArgument, []string{`".."`}},
		{"dotdot parent", func() error { _, err := s.Prepare(ctx, "k", "../base"); return err }, errdefs.IsInvalidArgument, []string{`".."`}},
		{"dotdot stat", func() error { _, err := s.Stat(ctx, ".."); return err }, errdefs.IsInvalidArgument, []string{`".."`}},
		{"dotdot remove", func() error { return s.Remove(ctx, "a/..") }, errdefs.IsInvalidArgument, []string{`".."`}},
		{"dotdot commit name", func() error { return s.Commit(ctx, "../x", "child") }, errdefs.IsInvalidArgument, []string{`".."`}},
		{"NUL in key", func() error { _, err := s.Prepare(ctx, "a\x00b", ""); return err }, errdefs.IsInvalidArgument, []string{"control character"}},
		{"dotdot label key", func() error {
			_, err := s.Prepare(ctx, "k", "base", snapshots.WithLabels(map[string]string{"containerd.io/snapshot/../x": "v"}))
			return err
		}, errdefs.IsInvalidArgument, []string{"label key", `".."`}},
		{"dotdot label key on update", func() error {
			_, err := s.Update(ctx, snapshots.Info{Name: "base", Labels: map[string]string{"../x": "v"}}, "labels.../x")
			return err
		}, errdefs.IsInvalidArgument, []string{"label key"}},
		{"oversized label", func() error {
			_, err := s.Prepare(ctx, "k", "base", snapshots.WithLabels(map[string]string{"big": strings.Repeat("x", 5000)}))
			return err
		}, errdefs.IsInvalidArgument, []string{"maximum size"}},
		{"bad uid mapping", func() error {
			_, err := s.Prepare(ctx, "k", "base", snapshots.WithLabels(map[string]string{
				snapshots.LabelSnapshotUIDMapping: "1:1000:10", snapshots.LabelSnapshotGIDMapping: "0:1000:10"}))
			return err
		}, errdefs.IsInvalidArgument, []string{"container root"}},
		{"update of immutable field", func() error {
			_, err := s.Update(ctx, snapshots.Info{Name: "base", Parent: "x"}, "parent")
			return err
		}, errdefs.IsInvalidArgument, []string{"parent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !tc.is(err) {
				t.Fatalf("got error %v, want one of the right kind", err)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			if after := state(t, ctx, s); after != before {
				t.Fatalf("a failed call changed state:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func TestRootLock(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(ctx, root)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("second snapshotter on one root: got %v, want failed precondition", err)
	}
	if want := fmt.Sprintf("in use by process %d", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = New(ctx, root)
	if err != nil {
		t.Fatalf("root not reusable after Close: %v", err)
	}
	s.Close()
}

func TestRelativeRootRefused(t *testing.T) {
	if _, err := New(context.Background(), "relative/root"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("got %v, want invalid argument", err)
	}
}

// TestRecovery simulates a crash: a half-created snapshot directory and the
// directory of a snapshot whose removal committed but whose files were not
// yet deleted. A new snapshotter removes both and keeps the live snapshot.
func TestRecovery(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "live", ""); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Stat(ctx, "live")
	s.Close()

	half := filepath.Join(root, "snapshots", "new-123456")
	removed := filepath.Join(root, "snapshots", "99")
	for _, d := range []string{filepath.Join(half, "fs"), filepath.Join(removed, "fs", "data")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s, err = New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, d := range []string{half, removed} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s survived recovery (stat: %v)", d, err)
		}
	}
	got, err := s.Stat(ctx, "live")
	if err != nil || got.Name != st.Name {
		t.Fatalf("live snapshot lost in recovery: %v", err)
	}
	if _, err := s.Mounts(ctx, "live"); err != nil {
		t.Fatal(err)
	}
}

func TestMappedRoot(t *testing.T) {
	for _, tc := range []struct {
		uid, gid         string
		wantUID, wantGID int
		wantErr          bool
	}{
		{"0:1000:65536", "0:2000:65536", 1000, 2000, false},
		{"1:5:2,0:7:1", "0:8:1", 7, 8, false},
		{"0:1000", "0:1000:1", 0, 0, true},
		{"0:x:1", "0:1:1", 0, 0, true},
		{"0:1:0", "0:1:1", 0, 0, true},
	} {
		uid, gid, mapped, err := mappedRoot(map[string]string{
			snapshots.LabelSnapshotUIDMapping: tc.uid,
			snapshots.LabelSnapshotGIDMapping: tc.gid,
		})
		if tc.wantErr {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s/%s: got %v, want invalid argument", tc.uid, tc.gid, err)
			}
			continue
		}
		if err != nil || !mapped || uid != tc.wantUID || gid != tc.wantGID {
			t.Errorf("%s/%s: got %d %d %v %v", tc.uid, tc.gid, uid, gid, mapped, err)
		}
	}
	if _, _, mapped, err := mappedRoot(nil); mapped || err != nil {
		t.Errorf("no labels: mapped=%v err=%v", mapped, err)
	}
}
