//go:build linux

package client

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// The shim serves its branch API under two names: Branches, and Contexts,
// its name before a node of the tree was called a branch. A shim outlives
// the upgrade of the package that started it, so a client meets shims that
// serve only Contexts until they exit (docs/design.md#names).
const (
	branchesService = "branchbox.shim.v1.Branches"
	contextsService = "branchbox.shim.v1.Contexts"
)

// dialShim makes the ttrpc client of a connection to a shim and the branch
// API over it: Branches, or Contexts from the first call a shim answers
// that it has no Branches service, for the rest of the connection. A shim
// that serves Branches pays nothing for the old name (no probe: a fork's
// latency is the API's point), one that does not pays a round trip once.
func dialShim(conn net.Conn) (*ttrpc.Client, shimv1.BranchesService) {
	f := &oldShim{}
	tc := ttrpc.NewClient(conn, ttrpc.WithUnaryClientInterceptor(f.intercept))
	return tc, shimv1.NewBranchesClient(tc)
}

// oldShim is what a connection learnt of its shim: whether it serves the
// branch API only under its old name.
type oldShim struct {
	contexts atomic.Bool
}

func (f *oldShim) intercept(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	if req.Service != branchesService {
		return invoke(ctx, req, resp)
	}
	if f.contexts.Load() {
		req.Service = contextsService
		return invoke(ctx, req, resp)
	}
	if err := invoke(ctx, req, resp); err != nil || !noService(resp, branchesService) {
		return err
	}
	// ttrpc refuses a call to a service it does not serve before any
	// method runs: calling again under the old name repeats nothing.
	f.contexts.Store(true)
	req.Service = contextsService
	resp.Reset()
	return invoke(ctx, req, resp)
}

// noService is whether resp is a ttrpc server's answer to a call of a
// service it does not serve (its message as ttrpc's services.go makes it).
func noService(resp *ttrpc.Response, service string) bool {
	st := resp.GetStatus()
	return st.GetCode() == int32(codes.Unimplemented) && st.GetMessage() == "service "+service
}
