//go:build linux

package sandbox

import (
	"context"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// Describe says whether this shim runs the sandbox: a map lookup, no lock
// of the sandbox and no call to the snapshotter, so that a client that
// dialled the shim's socket straight from the sandbox's id (branchctl's
// commands) can check it for less than containerd's record costs.
func (c *Service) Describe(ctx context.Context, req *shimv1.DescribeRequest) (_ *shimv1.DescribeResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	c.warmSoon(ctx, sb)
	return &shimv1.DescribeResponse{Sandbox: sb.id}, nil
}
