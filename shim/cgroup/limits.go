//go:build linux

package cgroup

import (
	"fmt"
	"strconv"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/internal/cgroupfit"

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
		} else if err := setQuotaV1(paths, write, int64(l.Cpus*100000)); err != nil {
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

// setQuotaV1 writes a branch's CPU limit on cgroup v1, unless it is above
// what the nearest limited ancestor has: the kernel refuses that there
// (on v2 it takes it and bounds the branch by its parent), so the branch
// is left bounded by its ancestor's, as it would be on v2.
func setQuotaV1(paths map[string]string, write func(ctrl, file, v string) error, quota int64) error {
	if over, err := cgroupfit.QuotaAboveAncestors(paths["cpu"], quota, 100000); err != nil || over {
		return err
	}
	if err := write("cpu", "cpu.cfs_period_us", "100000"); err != nil {
		return err
	}
	return write("cpu", "cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
}
