//go:build linux

package sandbox

import (
	"context"
	"strconv"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/branchbox/branchbox/branch"
)

// callerDeadline is ctx ending at its caller's deadline, where the client
// sent one (branch.DeadlineHeader): the call's own deadline is later, so
// that the client hears what was made just before the caller's, and a
// fork or an exec gives up at the caller's and undoes what it began.
func callerDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	v, ok := ttrpc.GetMetadataValue(ctx, branch.DeadlineHeader)
	if !ok {
		return ctx, func() {}
	}
	ns, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, time.Unix(0, ns))
}
