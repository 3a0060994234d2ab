//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// The processes of a cgroup: listed on one hierarchy, on every one, or
// with every cgroup below it.

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
