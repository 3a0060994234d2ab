//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// Host is the host's cgroup hierarchies, read once: they are mounted at
// boot, and reading the mount table at every fork, commit and listing
// costs more than the rest of a listing. It also makes the clones into
// cgroups under a process limit on a v1 pids hierarchy one at a time
// (StartIn).
type Host struct {
	once sync.Once
	list []Dir

	// cloneMu: the thread that forks each clone is moved in unchecked
	// first (start.go).
	cloneMu sync.Mutex
}

// Mounts is the host's cgroup hierarchies.
func (h *Host) Mounts() ([]Dir, error) {
	h.once.Do(func() {
		h.list, _ = Mounts()
	})
	if len(h.list) == 0 {
		return Mounts()
	}
	return h.list, nil
}

// Dir is one mounted cgroup hierarchy.
type Dir struct {
	Path    string
	V2      bool
	Freezer bool
	Memory  bool
	Pids    bool // the pids controller is here (on v2: enabled at its root)
}

// Mounts lists the host's cgroup hierarchies (v1 controllers and the
// unified v2 tree), read afresh: hierarchies are not mutable state of ours.
// Not cgroups.GetCgroupMounts: on a v1 or hybrid host it leaves out the
// unified hierarchy and lists only this process's controllers, read once.
func Mounts() ([]Dir, error) {
	infos, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup mounts: %w", err)
	}
	seen := map[string]bool{}
	var out []Dir
	for _, m := range infos {
		if seen[m.Mountpoint] || m.Root != "/" {
			continue
		}
		seen[m.Mountpoint] = true
		opts := "," + m.VFSOptions + ","
		v2 := m.FSType == "cgroup2"
		pids := strings.Contains(opts, ",pids,")
		if v2 {
			s, _ := cgroups.ReadFile(m.Mountpoint, "cgroup.controllers")
			pids = slices.Contains(strings.Fields(s), "pids")
		}
		out = append(out, Dir{
			Path:    m.Mountpoint,
			V2:      v2,
			Freezer: strings.Contains(opts, ",freezer,"),
			Memory:  strings.Contains(opts, ",memory,"),
			Pids:    pids,
		})
	}
	return out, nil
}

// Dirs returns the directories of a cgroup path on every hierarchy
// where it exists.
func Dirs(path string) ([]Dir, error) {
	ms, err := Mounts()
	if err != nil {
		return nil, err
	}
	return DirsIn(ms, path), nil
}

// DirsIn is Dirs on hierarchies already listed, so that one Teardown
// reads the mount table once rather than at every step.
func DirsIn(ms []Dir, path string) []Dir {
	var out []Dir
	for _, m := range ms {
		d := filepath.Join(m.Path, path)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			m.Path = d
			out = append(out, m)
		}
	}
	return out
}

// OneHierarchy picks, of a cgroup's directories, the one a listing of its
// processes reads: every process of a branch is in it on every hierarchy
// (the runtime and the branch init put it there, and a branch cannot
// write to cgroupfs), so one hierarchy answers; the freezer's, which
// --seal freeze moves processes in, is preferred.
func OneHierarchy(dirs []Dir) []Dir {
	for i, d := range dirs {
		if d.Freezes() {
			return dirs[i : i+1]
		}
	}
	if len(dirs) > 1 {
		return dirs[:1]
	}
	return dirs
}

// Subdirs lists dir and every cgroup below it, parents first. A cgroup's
// directory counts its subdirectories in its link count (kernfs: two more
// than it has), so a leaf, as a branch's cgroup nearly always is, costs
// one stat instead of a read of its files (dozens on a v1 hierarchy, on
// each of a dozen hierarchies, at every abort).
func Subdirs(dir string) []string {
	var st unix.Stat_t
	switch err := unix.Lstat(dir, &st); {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Nlink == 2:
		return []string{dir}
	}
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// ReadPids lists the processes of the cgroup dir, none if they cannot be
// read: for what is shown, not for what is killed (ReadPidsErr).
func ReadPids(dir string) []int {
	pids, _ := ReadPidsErr(dir)
	return pids
}

// ReadPidsErr lists the processes of the cgroup dir (its cgroup.procs; a
// threaded cgroup, whose cgroup.procs cannot be read, lists its threads:
// a signal to or a move of a thread acts on its whole process). A cgroup
// that is gone has none; any other failure is an error, not an empty list.
func ReadPidsErr(dir string) ([]int, error) {
	pids, err := cgroups.GetPids(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return pids, nil
}

// PidsIn lists the processes of a cgroup's own (its directories on every
// hierarchy), not its branches'.
func PidsIn(dirs []Dir) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		for _, dir := range OwnDirs(d.Path) {
			for _, pid := range ReadPids(dir) {
				if !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// SubtreePids lists the processes in dirs and every cgroup below them; a
// list that cannot be read is an error. Not cgroups.GetAllPids, which
// reads every cgroup's directory: Subdirs spares a leaf that read.
func SubtreePids(dirs []Dir) ([]int, error) {
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		for _, dir := range Subdirs(d.Path) {
			list, err := ReadPidsErr(dir)
			if err != nil {
				return nil, fmt.Errorf("list processes of cgroup %s: %w", dir, err)
			}
			for _, pid := range list {
				if !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids, nil
}
