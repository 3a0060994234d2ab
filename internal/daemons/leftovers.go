//go:build linux

// What the env's containers leave behind, which Stop clears and the tests
// check: shims and their sockets, cgroups, mounts; and a task's rootfs upper.

package daemons

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// ContainerCgroups lists the cgroups left below the env's namespace level,
// on every mounted hierarchy: after a clean teardown of its containers there
// are none.
func (e *Env) ContainerCgroups() []string {
	var out []string
	for _, top := range cgroupDirs(e.Namespace) {
		sub, _ := filepath.Glob(filepath.Join(top, "*"))
		for _, s := range sub {
			if isDir(s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// cgroupDirs lists the namespace's cgroup directory on every mounted
// hierarchy (v1 controllers and the unified v2 tree).
func cgroupDirs(namespace string) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", namespace))
	if d := filepath.Join("/sys/fs/cgroup", namespace); isDir(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

// KillCgroups SIGKILLs every process in the namespace's cgroups, on every
// hierarchy (a branch's cgroup is below its container's; a frozen one is
// thawed so that the kill is taken), until none is left (10 s at most),
// and returns the cgroups that held one.
func KillCgroups(namespace string) ([]string, error) {
	held := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, top := range cgroupDirs(namespace) {
			_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				if err != nil || len(strings.TrimSpace(string(b))) == 0 {
					return nil
				}
				left = append(left, p)
				_ = os.WriteFile(filepath.Join(p, "freezer.state"), []byte("THAWED"), 0o644)
				_ = os.WriteFile(filepath.Join(p, "cgroup.freeze"), []byte("0"), 0o644)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		for _, p := range left {
			held[p] = true
		}
		if len(left) == 0 {
			return slices.Sorted(maps.Keys(held)), nil
		}
		if time.Now().After(deadline) {
			return slices.Sorted(maps.Keys(held)), fmt.Errorf("processes left in cgroups %v after 10s of SIGKILL", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func removeCgroups(namespace string) error {
	var errs []error
	for _, top := range cgroupDirs(namespace) {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first: a cgroup directory can only go once it has no children.
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// ShimSockets returns the sockets a shim process of this env serves on,
// worked out as containerd's shim package names them: a hash of
// containerd's address, the namespace and the id (plus the debug variant),
// under /run/containerd/s.
func (e *Env) ShimSockets(pid int) []string {
	address := e.Address
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	args := strings.Split(string(b), "\x00")
	var ns, id string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-namespace":
			ns = args[i+1]
		case "-id":
			id = args[i+1]
		}
	}
	if ns == "" || id == "" {
		return nil
	}
	var out []string
	for _, p := range []string{filepath.Join(address, ns, id), filepath.Join(address, ns, id, "debug")} {
		out = append(out, fmt.Sprintf("/run/containerd/s/%x", sha256.Sum256([]byte(p))))
	}
	return out
}

// ShimPids lists the shim processes serving this env's containerd.
func (e *Env) ShimPids() []int {
	return pidsWithArgs("-address", e.Address)
}

// MountsUnder lists mount points at or below dir, deepest first.
func MountsUnder(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	// PrefixFilter alone would also match /tmp/bbx-12 for /tmp/bbx-1.
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != dir && !strings.HasPrefix(m.Mountpoint, dir+"/"), false
	})
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var out []string
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// pidsWithArgs finds processes whose argv holds flag immediately followed
// by value.
func pidsWithArgs(flag, value string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == flag && args[i+1] == value {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killTree SIGKILLs pid and every descendant of it.
func killTree(pid int) {
	for _, child := range children(pid) {
		killTree(child)
	}
	_ = unix.Kill(pid, unix.SIGKILL)
}

func children(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// RootfsUpperdir returns the upper directory of the overlay that is the
// rootfs of the running task id, as a shim would read it from its mounts.
func (e *Env) RootfsUpperdir(id string) (string, error) {
	target := filepath.Join(e.ContainerdState, "io.containerd.runtime.v2.task", e.Namespace, id, "rootfs")
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil {
		return "", err
	}
	if len(infos) == 0 {
		return "", fmt.Errorf("task %s has no rootfs mount at %s", id, target)
	}
	for _, o := range strings.Split(infos[0].VFSOptions, ",") {
		if u, ok := strings.CutPrefix(o, "upperdir="); ok {
			return u, nil
		}
	}
	return "", fmt.Errorf("rootfs of task %s is not an overlay with an upper: %s", id, infos[0].VFSOptions)
}
