//go:build linux

package sandbox

import (
	"context"

	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
)

// ThawSealForKill thaws the seal leaf of a sandbox being killed, so that
// the signal lands; its processes stay in the leaf, where the sandbox's
// end finds them.
func (c *Service) ThawSealForKill(ctx context.Context, id string) {
	sb, err := c.Sandbox(id)
	if err != nil || sb.cgroup == "" {
		return
	}
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return
	}
	for _, l := range cgroup.SealLeaves(ms, sb.cgroup) {
		if err := cgroup.SetFreezer(l.Dir, l.Path, cgroups.Thawed); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", id).Warn("thaw the sealed processes of a killed sandbox")
		}
	}
}
