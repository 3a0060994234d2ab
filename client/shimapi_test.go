//go:build linux

package client

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// treeOnly answers Tree; the shim's other methods are not called here.
type treeOnly struct{ shimv1.BranchesService }

func (treeOnly) Tree(context.Context, *shimv1.TreeRequest) (*shimv1.TreeResponse, error) {
	return &shimv1.TreeResponse{Nodes: []*shimv1.Branch{{Id: "0"}}}, nil
}

// serveShim serves the branch API under the names given on a ttrpc socket
// and connects to it.
func serveShim(t *testing.T, branches, contexts bool) net.Conn {
	t.Helper()
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	if branches {
		shimv1.RegisterBranchesService(srv, treeOnly{})
	}
	if contexts {
		shimv1.RegisterContextsService(srv, treeOnly{})
	}
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestShimServiceNames: the client calls Branches, and a shim that serves
// only its old name, Contexts (one started before an upgrade), costs one
// more call on the connection's first call only; a shim that serves
// neither (runc's) answers Unimplemented, as callers check.
func TestShimServiceNames(t *testing.T) {
	const (
		b = "/" + branchesService + "/Tree"
		c = "/" + contextsService + "/Tree"
	)
	for _, tc := range []struct {
		name               string
		branches, contexts bool
		want               []string
	}{
		{"new shim", true, true, []string{b, b, b}},
		{"old shim", false, true, []string{b, c, c, c}},
		{"not ours", false, false, []string{b, c, c, c}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sent []string
			count := func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
				sent = append(sent, "/"+req.Service+"/"+req.Method)
				return invoke(ctx, req, resp)
			}
			tc0 := ttrpc.NewClient(serveShim(t, tc.branches, tc.contexts), ttrpc.WithChainUnaryClientInterceptor((&oldShim{}).intercept, count))
			defer tc0.Close()
			api := shimv1.NewBranchesClient(tc0)
			for range 3 {
				resp, err := api.Tree(context.Background(), &shimv1.TreeRequest{})
				if tc.contexts && (err != nil || len(resp.GetNodes()) != 1) {
					t.Fatalf("Tree: %v, %v", resp, err)
				}
				if !tc.contexts && status.Code(err) != codes.Unimplemented {
					t.Fatalf("Tree of a shim without the branch API: %v; want Unimplemented", err)
				}
			}
			if !slices.Equal(sent, tc.want) {
				t.Errorf("calls sent: %v; want %v", sent, tc.want)
			}
		})
	}
	// dialShim is the client every SandboxClient uses.
	tc0, api := dialShim(serveShim(t, false, true))
	defer tc0.Close()
	if _, err := api.Tree(context.Background(), &shimv1.TreeRequest{}); err != nil {
		t.Fatalf("Tree of an old shim through dialShim: %v", err)
	}
}
