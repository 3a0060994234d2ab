//go:build linux

package integration

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/branchbox/branchbox/internal/daemons"
)

// nodeState is what a node holds that an image operation (load, pull,
// push) may make, as lines to compare: image records, content (committed
// and in progress, in containerd's metadata and as files of its content
// store), leases, containers, snapshots as containerd knows them and as
// the branch snapshotter's own Walk lists them, and the directories of
// the branch snapshotter's root (snapshots, checkpoints, branches).
type nodeState map[string][]string

// collectGarbage runs containerd's garbage collector to its end (a lease
// deleted synchronously), so that a state taken after it holds nothing
// that an earlier operation left for the collector.
func collectGarbage(t *testing.T, ctx context.Context, cc *containerd.Client) {
	t.Helper()
	lm := cc.LeasesService()
	l, err := lm.Create(ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	if err := lm.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		t.Fatal(err)
	}
}

// stateOf takes the node's state.
func stateOf(t *testing.T, ctx context.Context, env *daemons.Env, cc *containerd.Client) nodeState {
	t.Helper()
	st := nodeState{}
	imgs, err := cc.ImageService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range imgs {
		st["image"] = append(st["image"], fmt.Sprintf("%s -> %s %v", i.Name, i.Target.Digest, sortedLabels(i.Labels)))
	}
	cs := cc.ContentStore()
	if err := cs.Walk(ctx, func(info content.Info) error {
		st["content"] = append(st["content"], fmt.Sprintf("%s %d %v", info.Digest, info.Size, sortedLabels(info.Labels)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ingests, err := cs.ListStatuses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ingests {
		st["ingest"] = append(st["ingest"], fmt.Sprintf("%s %s %d/%d", s.Ref, s.Expected, s.Offset, s.Total))
	}
	ls, err := cc.LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		rs, err := cc.LeasesService().ListResources(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		st["lease"] = append(st["lease"], fmt.Sprintf("%s %v %d resources", l.ID, sortedLabels(l.Labels), len(rs)))
	}
	ctrs, err := cc.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctrs {
		st["container"] = append(st["container"], c.ID())
	}
	walk := func(kind string, sn snapshots.Snapshotter) {
		if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
			st[kind] = append(st[kind], fmt.Sprintf("%s %s parent=%s %v", i.Name, i.Kind, i.Parent, sortedLabels(i.Labels)))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	walk("snapshot(branch)", cc.SnapshotService("branch"))
	walk("snapshot(overlayfs)", cc.SnapshotService("overlayfs"))
	// The snapshotter's own Walk, straight on its socket.
	conn, err := grpc.NewClient("unix://"+env.SnapshotterAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	walk("snapshotter walk", proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "branch"))
	// The content store's own files: what the collector really removed.
	contentRoot := filepath.Join(env.ContainerdRoot, "io.containerd.content.v1.content")
	st["content file"] = filesUnder(t, contentRoot, 3)
	// Its top directories (snapshots/, checkpoints/, branches/, ...) are
	// its layout, made when first needed and kept; what is in them is
	// state.
	for _, f := range filesUnder(t, env.SnapshotterRoot, 2) {
		if strings.Count(f, "/") > 1 || !strings.HasSuffix(f, "/") {
			st["snapshotter dir"] = append(st["snapshotter dir"], f)
		}
	}
	for k := range st {
		sort.Strings(st[k])
	}
	return st
}

// filesUnder lists the paths under root down to depth levels, with the
// size of each regular file.
func filesUnder(t *testing.T, root string, depth int) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if strings.Count(rel, "/") >= depth {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			// The snapshotter's and containerd's databases change on
			// any call; they are compared through the APIs above.
			if strings.HasSuffix(rel, ".db") || strings.HasSuffix(rel, ".db-lock") || rel == "lock" || rel == "address" {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s %d", rel, fi.Size()))
			return nil
		}
		out = append(out, rel+"/")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sortedLabels(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// diff says how after differs from st, or "" if it does not.
func (st nodeState) diff(after nodeState) string {
	var kinds []string
	for k := range st {
		kinds = append(kinds, k)
	}
	for k := range after {
		if _, ok := st[k]; !ok {
			kinds = append(kinds, k)
		}
	}
	sort.Strings(kinds)
	var b strings.Builder
	for _, k := range kinds {
		for _, l := range after[k] {
			if !slices.Contains(st[k], l) {
				fmt.Fprintf(&b, "  + %s: %s\n", k, l)
			}
		}
		for _, l := range st[k] {
			if !slices.Contains(after[k], l) {
				fmt.Fprintf(&b, "  - %s: %s\n", k, l)
			}
		}
	}
	return b.String()
}

// assertUnchanged fails the test if the node's state is not before's.
func assertUnchanged(t *testing.T, ctx context.Context, env *daemons.Env, cc *containerd.Client, before nodeState, what string) {
	t.Helper()
	if d := before.diff(stateOf(t, ctx, env, cc)); d != "" {
		t.Fatalf("after %s the node is not as before:\n%s", what, d)
	}
}
