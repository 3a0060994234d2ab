//go:build linux

package integration

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/ttrpc"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestContextsServiceNames: the shim serves its branch API under its name,
// branchbox.shim.v1.Branches, and under its old one,
// branchbox.shim.v1.Contexts, which the clients built before the rename
// call (docs/design.md#names): the same service, so a branch forked
// through one name is the other's too. Raw ttrpc clients, as such a
// client is, with no fallback of the client package between.
func TestContextsServiceNames(t *testing.T) {
	ctx, env, _ := sandboxCtxEnv(t)
	ctx, tc := shimTTRPC(t, ctx, env, "sb")
	old, cur := shimv1.NewContextsClient(tc), shimv1.NewBranchesClient(tc)
	for name, api := range map[string]shimv1.BranchesService{"Contexts": old, "Branches": cur} {
		if d, err := api.Describe(ctx, &shimv1.DescribeRequest{Sandbox: "sb"}); err != nil || d.GetSandbox() != "sb" {
			t.Fatalf("%s.Describe: %v, %v", name, d, err)
		}
	}
	// Forked under each name, seen and ended under the other.
	for _, c := range []struct {
		name     string
		fork, do shimv1.BranchesService
	}{{"Contexts then Branches", old, cur}, {"Branches then Contexts", cur, old}} {
		f, err := c.fork.Fork(ctx, &shimv1.ForkRequest{Sandbox: "sb", Count: 1})
		if err != nil || len(f.GetBranches()) != 1 {
			t.Fatalf("%s: Fork: %v, %v", c.name, f, err)
		}
		id := f.GetBranches()[0].GetId()
		if !live(t, ctx, c.do, id) {
			t.Fatalf("%s: branch %s forked through one name is not live in the other's tree", c.name, id)
		}
		if a, err := c.do.Abort(ctx, &shimv1.AbortRequest{Sandbox: "sb", Branch: id}); err != nil || len(a.GetAborted()) != 1 {
			t.Fatalf("%s: Abort of %s: %v, %v", c.name, id, a, err)
		}
		if live(t, ctx, c.fork, id) {
			t.Fatalf("%s: branch %s aborted through one name is live in the other's tree", c.name, id)
		}
	}
}

// live is whether the tree a name's Tree gives has branch id live.
func live(t *testing.T, ctx context.Context, api shimv1.BranchesService, id string) bool {
	t.Helper()
	tr, err := api.Tree(ctx, &shimv1.TreeRequest{Sandbox: "sb"})
	if err != nil {
		t.Fatalf("Tree: %v", err)
	}
	for _, n := range tr.GetNodes() {
		if n.GetId() == id {
			return n.GetState() == "live"
		}
	}
	return false
}

// shimTTRPC is a raw ttrpc client of sandbox id's shim, closed when the
// test ends, and ctx in the env's namespace.
func shimTTRPC(t *testing.T, ctx context.Context, env *daemons.Env, id string) (context.Context, *ttrpc.Client) {
	t.Helper()
	ctx = namespaces.WithNamespace(ctx, env.Namespace)
	sock, err := cshim.SocketAddress(ctx, env.Address, id, false)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", strings.TrimPrefix(sock, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	tc := ttrpc.NewClient(conn)
	t.Cleanup(func() { tc.Close() })
	return ctx, tc
}
