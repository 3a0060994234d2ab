//go:build linux

// Package cgroupfit keeps the branch cgroups below a sandbox's inside what
// cgroup v1 lets a child have. On v1 the kernel refuses a cpuset that
// leaves out a CPU or memory node one of the cgroup's children has
// (EBUSY), and a CFS quota below a child's or a child's above its
// parent's (EINVAL); on v2 it takes both and bounds the child by its
// parent. The shim makes cgroups below a sandbox's (a branch's, its warm
// inits', its seal and v2 leaves), whose cpusets are copies of their
// parent's and whose quota is a fork's --cpus: runc's update, which knows
// of no children, failed for a sandbox with branches, and so did a fork
// asking for more CPU than its sandbox has.
package cgroupfit

import (
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fscommon"
	"k8s.io/utils/cpuset"
)

// Update readies the cgroups below a container's for the update res of
// the container's own (paths: the container's cgroup directory on each
// v1 hierarchy): they take its new cpuset, as on v2 they would follow it,
// and a quota above its new one is removed, so that the branch is bounded
// by the sandbox's. The container's own cgroup is left to the caller,
// except that its cpuset is widened first by what the update adds. On
// cgroup v2 nothing is done.
func Update(paths map[string]string, res *cgroups.Resources) error {
	if cgroups.IsCgroup2UnifiedMode() {
		return nil
	}
	if dir := paths["cpuset"]; dir != "" {
		for _, s := range []struct{ file, v string }{{"cpuset.cpus", res.CpusetCpus}, {"cpuset.mems", res.CpusetMems}} {
			if s.v == "" {
				continue
			}
			if err := spreadCpuset(dir, s.file, s.v); err != nil {
				return err
			}
		}
	}
	if dir := paths["cpu"]; dir != "" && res.CpuQuota > 0 {
		period := int64(res.CpuPeriod)
		if period == 0 {
			p, err := fscommon.GetCgroupParamInt(dir, "cpu.cfs_period_us")
			if err != nil {
				return err
			}
			period = p
		}
		return unboundQuotasAbove(dir, res.CpuQuota, period)
	}
	return nil
}

// spreadCpuset gives the cgroups below dir the cpuset v (of file,
// cpuset.cpus or cpuset.mems): first every cgroup from dir down is
// widened by v, which no child can refuse, then each below dir is
// narrowed to v from the deepest up, where every child already has v.
func spreadCpuset(dir, file, v string) error {
	want, err := cpuset.Parse(v)
	if err != nil {
		return fmt.Errorf("%s %q: %w", file, v, err)
	}
	all := append([]string{dir}, descendants(dir)...)
	set := func(d string, to func(cpuset.CPUSet) cpuset.CPUSet) error {
		v, err := fscommon.GetCgroupParamString(d, file)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a branch's cgroup removed meanwhile
		}
		if err != nil {
			return err
		}
		have, err := cpuset.Parse(v)
		if err != nil {
			return fmt.Errorf("%s of %s: %w", file, d, err)
		}
		if next := to(have); !next.Equals(have) {
			return write(dir, d, file, next.String())
		}
		return nil
	}
	for _, d := range all {
		if err := set(d, func(have cpuset.CPUSet) cpuset.CPUSet { return have.Union(want) }); err != nil {
			return err
		}
	}
	for i := len(all) - 1; i > 0; i-- {
		if err := set(all[i], func(cpuset.CPUSet) cpuset.CPUSet { return want }); err != nil {
			return err
		}
	}
	return nil
}

// unboundQuotasAbove removes the quota of each cgroup below dir whose
// share of CPU is above quota/period: such a cgroup is then bounded by
// its nearest ancestor's, the new one. Removing a quota is never refused.
func unboundQuotasAbove(dir string, quota, period int64) error {
	for _, d := range descendants(dir) {
		q, err := fscommon.GetCgroupParamInt(d, "cpu.cfs_quota_us")
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if q <= 0 {
			continue
		}
		p, err := fscommon.GetCgroupParamInt(d, "cpu.cfs_period_us")
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err == nil && above(q, p, quota, period) {
			if err := write(dir, d, "cpu.cfs_quota_us", "-1"); err != nil {
				return err
			}
		}
	}
	return nil
}

// QuotaAboveAncestors reports whether a CFS quota of quota per period on
// the cgroup dir would give it more CPU than its nearest ancestor with a
// quota has, which cgroup v1 refuses (on v2 it is false: the kernel takes
// it and bounds the cgroup by its parent).
func QuotaAboveAncestors(dir string, quota, period int64) (bool, error) {
	if cgroups.IsCgroup2UnifiedMode() {
		return false, nil
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		q, err := fscommon.GetCgroupParamInt(d, "cpu.cfs_quota_us")
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil // above the hierarchy's root
		}
		if err != nil {
			return false, err
		}
		if q <= 0 {
			continue
		}
		p, err := fscommon.GetCgroupParamInt(d, "cpu.cfs_period_us")
		if err != nil {
			return false, err
		}
		return above(quota, period, q, p), nil
	}
	return false, nil
}

// CPUsAboveAncestors is QuotaAboveAncestors for a limit of cpus CPUs
// (a fork's --cpus, at the period of 100ms the shim writes) on the cgroup
// path of a spec (linux.cgroupsPath, cgroupfs form).
func CPUsAboveAncestors(cgroupPath string, cpus float64) (bool, error) {
	if cgroups.IsCgroup2UnifiedMode() || cpus <= 0 {
		return false, nil
	}
	mnt, err := cgroups.FindCgroupMountpoint("", "cpu")
	if err != nil {
		return false, nil // no cpu hierarchy: nothing to refuse the quota
	}
	return QuotaAboveAncestors(filepath.Join(mnt, cgroupPath), int64(cpus*100000), 100000)
}

// above reports whether q1/p1 > q2/p2, without overflow.
func above(q1, p1, q2, p2 int64) bool {
	if p1 <= 0 || p2 <= 0 {
		return false
	}
	h1, l1 := bits.Mul64(uint64(q1), uint64(p2))
	h2, l2 := bits.Mul64(uint64(q2), uint64(p1))
	return h1 > h2 || (h1 == h2 && l1 > l2)
}

// descendants lists the cgroup directories below dir, each before its
// children. A directory removed while it is read is left out.
func descendants(dir string) []string {
	var out []string
	var walk func(string)
	walk = func(d string) {
		entries, err := os.ReadDir(d)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.IsDir() {
				c := filepath.Join(d, e.Name())
				out = append(out, c)
				walk(c)
			}
		}
	}
	walk(dir)
	return out
}

// write writes v to file of the cgroup d below top; a cgroup removed
// meanwhile is no error. The error names the cgroup relative to top.
func write(top, d, file, v string) error {
	err := cgroups.WriteFile(d, file, v)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	rel, _ := filepath.Rel(top, d)
	if rel == "." {
		return fmt.Errorf("%s %s: %w", file, v, err)
	}
	return fmt.Errorf("%s %s of the cgroup %s below the container's: %w", file, v, rel, err)
}
