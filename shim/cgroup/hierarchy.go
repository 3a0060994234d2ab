//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	cgfs "github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
)

// The host's cgroup hierarchies (Host, Dir), and what differs between a
// v1 hierarchy and cgroup v2 (hierarchy).

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

// ReadDirs are the directories of cgroup path that tell what it holds,
// not checked to exist (a reader of a missing one finds nothing): one
// hierarchy for its processes (one that freezes, else the first, as
// OneHierarchy picks), and those that count its OOM kills (memory, or
// cgroup2). Not DirsIn, whose stat of the path in every hierarchy (a
// dozen on a v1 node) was a quarter of the CPU of a tree's description
// of each branch.
func ReadDirs(ms []Dir, path string) []Dir {
	var out []Dir
	picked := -1
	for i, d := range ms {
		if d.Freezes() {
			picked = i
			break
		}
	}
	if picked < 0 && len(ms) > 0 {
		picked = 0
	}
	for i, d := range ms {
		if i == picked || d.Memory || d.V2 {
			d.Path = filepath.Join(d.Path, path)
			out = append(out, d)
		}
	}
	return out
}

// hierarchy is what differs between a cgroup v1 hierarchy and cgroup v2
// for one cgroup directory: how it is frozen and thawed, how its freeze
// is read, and whether its processes can be killed at once. The callers
// loop over a cgroup's directories and ask each its hierarchy, rather
// than testing Dir.V2 and Dir.Freezer themselves.
type hierarchy interface {
	// freezes says whether the hierarchy can freeze a cgroup (a v1
	// hierarchy only if it holds the freezer controller).
	freezes() bool
	// setFreezer freezes or thaws dir with the library's freezer, which
	// checks the state the kernel reports after its write.
	setFreezer(dir string, state cgroups.FreezerState) error
	// requestFreeze writes the freeze (or thaw) of dir and returns at
	// once.
	requestFreeze(dir string, freeze bool) error
	// frozen says whether dir is frozen, every process of it stopped.
	frozen(dir string) (bool, error)
	// freezing says whether dir is frozen or being frozen, by itself or
	// by an ancestor.
	freezing(dir string) bool
	// frozenMark is the file frozen reads and what it holds once frozen,
	// for messages.
	frozenMark() (file, want string)
	// killsAtOnce says whether the hierarchy has cgroup.kill (cgroup v2),
	// so that its processes are not killed one by one.
	killsAtOnce() bool
	// kill kills every process of dir and below it at once where the
	// kernel can (cgroup.kill, Linux 5.14); elsewhere it does nothing.
	kill(dir string) error
	// populated says whether dir or a cgroup below it holds a process,
	// if the hierarchy says so in one read (known).
	populated(dir string) (populated, known bool, err error)
}

// Freezes says whether d's hierarchy can freeze a cgroup: the v1 freezer
// controller's, or cgroup v2.
func (d Dir) Freezes() bool { return d.hier().freezes() }

// hier is d's hierarchy.
func (d Dir) hier() hierarchy {
	if d.V2 {
		return v2{}
	}
	return v1{freezer: d.Freezer}
}

// v1 is a cgroup v1 hierarchy, the freezer controller's or another's.
type v1 struct{ freezer bool }

func (h v1) freezes() bool { return h.freezer }

func (h v1) setFreezer(dir string, state cgroups.FreezerState) error {
	if !h.freezer {
		return v2{}.setFreezer(dir, state) // as before: the library's v2 freezer
	}
	return (&cgfs.FreezerGroup{}).Set(dir, &cgroups.Resources{Freezer: state})
}

func (v1) requestFreeze(dir string, freeze bool) error {
	value := "THAWED"
	if freeze {
		value = "FROZEN"
	}
	return os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(value), 0)
}

func (v1) frozen(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "FROZEN", nil
}

// freezing is FROZEN or FREEZING: the state of a child frozen by itself
// does not reach it.
func (v1) freezing(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	return err == nil && strings.TrimSpace(string(b)) != "THAWED"
}

func (v1) frozenMark() (string, string) { return "freezer.state", "FROZEN" }

// A v1 hierarchy has no cgroup.kill: its processes are killed one by
// one, and only a listing says whether it is populated.
func (v1) killsAtOnce() bool                    { return false }
func (v1) kill(string) error                    { return nil }
func (v1) populated(string) (bool, bool, error) { return false, false, nil }

// v2 is the cgroup v2 (unified) hierarchy.
type v2 struct{}

func (v2) freezes() bool { return true }

func (v2) setFreezer(dir string, state cgroups.FreezerState) error {
	mgr, err := fs2.NewManager(&cgroups.Cgroup{Resources: &cgroups.Resources{}}, dir)
	if err != nil {
		return err
	}
	return mgr.Freeze(state)
}

func (v2) requestFreeze(dir string, freeze bool) error {
	value := "0"
	if freeze {
		value = "1"
	}
	return os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(value), 0)
}

func (v2) frozen(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false, err
	}
	return frozenLine(b), nil
}

// freezing is its own cgroup.freeze, or the frozen flag of cgroup.events.
func (v2) freezing(dir string) bool {
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); err == nil && strings.TrimSpace(string(b)) == "1" {
		return true
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && frozenLine(b)
}

func (v2) frozenMark() (string, string) { return "cgroup.events", "frozen 1" }

// kill writes cgroup.kill, which kills the whole subtree atomically. A
// kernel without it (no such file) is left to the kill one by one; any
// other failure (a threaded cgroup refuses it) is an error.
func (v2) kill(dir string) error {
	// cgroups.WriteFile, as it does not create: os.WriteFile's O_CREAT
	// makes a missing file EACCES, not ENOENT.
	err := cgroups.WriteFile(dir, "cgroup.kill", "1")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	return nil
}

func (v2) killsAtOnce() bool { return true }

// populated is the populated flag of cgroup.events, which covers the
// subtree.
func (v2) populated(dir string) (bool, bool, error) {
	s, err := cgroups.ReadFile(dir, "cgroup.events")
	if err != nil {
		return false, false, err
	}
	return !strings.Contains(s, "populated 0"), true, nil
}

// frozenLine says whether cgroup.events b has the line "frozen 1".
func frozenLine(b []byte) bool {
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.TrimSpace(l) == "frozen 1" {
			return true
		}
	}
	return false
}
