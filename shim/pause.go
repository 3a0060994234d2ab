//go:build linux

package shim

import (
	"context"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// Pause freezes a container once its branch operations under way are
// done (see branches.pause); its branches are frozen with it.
func (s *taskService) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	var resp *ptypes.Empty
	err := s.sandboxes.Pause(ctx, r.ID, func() (err error) {
		resp, err = s.TTRPCTaskService.Pause(ctx, r)
		return err
	})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return resp, nil
}

// Resume thaws a container and its branches, and lets the branch
// operations deferred while it was paused (reconciling) go on.
func (s *taskService) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	resp, err := s.TTRPCTaskService.Resume(ctx, r)
	s.sandboxes.Resumed(ctx, r.ID)
	return resp, err
}
