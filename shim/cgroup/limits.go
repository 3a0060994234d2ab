//go:build linux

package cgroup

import (
	"fmt"
	"strconv"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
)

// SetLimits writes the limits given at fork into a branch's cgroup.
func SetLimits(paths map[string]string, l *shimv1.Limits) error {
	if l == nil {
		return nil
	}
	write := func(ctrl, file, v string) error {
		dir, ok := paths[ctrl]
		if !ok {
			return fmt.Errorf("no %s cgroup for limit %s: %w", ctrl, file, errdefs.ErrNotImplemented)
		}
		return cgroups.WriteFile(dir, file, v)
	}
	v2 := cgroups.IsCgroup2UnifiedMode()
	if l.Memory > 0 {
		m := strconv.FormatInt(l.Memory, 10)
		if v2 {
			if err := write("", "memory.max", m); err != nil {
				return err
			}
		} else if err := write("memory", "memory.limit_in_bytes", m); err != nil {
			return err
		}
	}
	if l.Cpus > 0 {
		quota := strconv.FormatInt(int64(l.Cpus*100000), 10)
		if v2 {
			if err := write("", "cpu.max", quota+" 100000"); err != nil {
				return err
			}
		} else if err := write("cpu", "cpu.cfs_period_us", "100000"); err != nil {
			return err
		} else if err := write("cpu", "cpu.cfs_quota_us", quota); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		ctrl := "pids"
		if v2 {
			ctrl = ""
		}
		if err := write(ctrl, "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}
