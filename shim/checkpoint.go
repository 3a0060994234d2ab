//go:build linux

package shim

import (
	"context"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// Checkpoint dumps a container's task, which containerd pauses first; a
// sandbox's processes that a fork's seal froze are thawed under that pause
// for the dump (sandbox.TaskCheckpoint), and no branch operation runs
// meanwhile.
func (s *taskService) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	var resp *ptypes.Empty
	err := s.sandboxes.TaskCheckpoint(ctx, r.ID, func() (err error) {
		resp, err = s.TTRPCTaskService.Checkpoint(ctx, r)
		return err
	})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return resp, nil
}
