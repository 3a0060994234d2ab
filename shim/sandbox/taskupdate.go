//go:build linux

package sandbox

import "context"

// TaskUpdate runs update, containerd's update of the task id's resources
// (nerdctl update, the CRI's UpdateContainerResources: a pod's in-place
// resize, the CPU manager's cpusets), with no fork, commit or abort at the
// same time: on cgroup v1 the runtime first makes the branch cgroups below
// the sandbox's fit the update (internal/cgroupfit), and a branch cgroup
// made meanwhile would copy the sandbox's old cpuset.
func (c *Service) TaskUpdate(ctx context.Context, id string, update func() error) error {
	sb, err := c.Sandbox(id)
	if err != nil {
		return update() // not one of ours to branch
	}
	if err := lockDrained(sb, "update of "+id, "not updated"); err != nil {
		return err
	}
	defer sb.mu.Unlock()
	return update()
}
