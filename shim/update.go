//go:build linux

package shim

import (
	"context"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// Update sets a container's resources; a sandbox's branch cgroups are
// kept from changing meanwhile (sandbox.TaskUpdate).
func (s *taskService) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	var resp *ptypes.Empty
	err := s.sandboxes.TaskUpdate(ctx, r.ID, func() (err error) {
		resp, err = s.TTRPCTaskService.Update(ctx, r)
		return err
	})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return resp, nil
}
