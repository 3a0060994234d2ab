//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cmdlog"
)

// Output returns a branch's log (init.log): what its command, or a
// memory branch's restored processes, wrote to stdout and stderr. A branch
// with neither has none. The log holds at most 2*cmdlog.MaxSize, plus
// what one read of the pipe adds before it is cut; a file the bundle
// holds beyond that (it is the shim's own) is read no further.
func (c *Service) Output(ctx context.Context, req *shimv1.OutputRequest) (_ *shimv1.OutputResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if req.Branch == "" || req.Branch == branch.RootID {
		return nil, fmt.Errorf("output of sandbox %s: name a branch (SANDBOX/BRANCH); the sandbox's own output is containerd's (nerdctl logs, kubectl logs): %w", req.Sandbox, errdefs.ErrInvalidArgument)
	}
	sb, n, err := c.branchFor(ctx, req.Sandbox, req.Branch, true, false)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(n.bundle, initLog)
	sb.mu.Unlock()
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return &shimv1.OutputResponse{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("output of %s/%s: %w", sb.id, n.id, err)
	}
	defer f.Close()
	out, err := io.ReadAll(io.LimitReader(f, 2*cmdlog.MaxSize+cmdlog.ReadSize))
	if err != nil {
		return nil, fmt.Errorf("output of %s/%s: %w", sb.id, n.id, err)
	}
	return &shimv1.OutputResponse{Output: out}, nil
}
