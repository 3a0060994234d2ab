//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// SealLeaf is the child cgroup a branch's own processes are moved into
// to freeze them (--seal freeze): freezing the branch's cgroup itself
// would freeze its branches too, since they are nested below it.
const SealLeaf = ".sealed"

// Leaf is the seal leaf of a cgroup in one hierarchy.
type Leaf struct {
	Dir  Dir    // the hierarchy
	Path string // the leaf's directory
}

// SealLeaves is the seal leaves of the cgroup path, in those hierarchies
// of ms that freeze where the leaf exists.
func SealLeaves(ms []Dir, path string) []Leaf {
	var leaves []Leaf
	for _, d := range DirsIn(ms, path) {
		if leaf := filepath.Join(d.Path, SealLeaf); d.Freezes() && IsDir(leaf) {
			leaves = append(leaves, Leaf{Dir: d, Path: leaf})
		}
	}
	return leaves
}

// Thaw thaws a cgroup and every cgroup below it: on cgroup v1 a frozen
// task ignores SIGKILL until thawed, and a child frozen by itself stays
// frozen when its parent thaws.
func Thaw(dirs []Dir) {
	for _, d := range dirs {
		if !d.Freezes() {
			continue // no freezer here: nothing to walk
		}
		for _, dir := range Subdirs(d.Path) {
			_ = SetFreezer(d, dir, cgroups.Thawed)
		}
	}
}

// SetFreezer freezes or thaws one cgroup directory dir of the hierarchy
// m, a v1 freezer or cgroup v2, with the library's freezer: it checks the
// state the kernel reports after its write, and a freeze returns once
// frozen (at once for an empty cgroup).
func SetFreezer(m Dir, dir string, state cgroups.FreezerState) error {
	return m.hier().setFreezer(dir, state)
}

// FreezeOwn freezes the processes that are directly in a cgroup path (not
// its children's, which are branches) by moving them into a child leaf
// (SealLeaf) and freezing that; the freeze is done once the kernel says
// so. On cgroup v2 they come from the leaf they live in once the branch
// has branches (OwnLeaf), into which an exec into the branch still goes,
// unfrozen, as one into the branch's own cgroup does on v1.
func FreezeOwn(ctx context.Context, path string) error {
	dirs, err := Dirs(path)
	if err != nil {
		return err
	}
	v2 := cgroups.IsCgroup2UnifiedMode()
	if v2 {
		if err := PrepareBranchParent(ctx, path); err != nil {
			return fmt.Errorf("freeze %s: %w", path, err)
		}
	}
	for _, d := range dirs {
		if !(d.Freezer || (v2 && d.V2)) {
			continue
		}
		from := d.Path
		if v2 {
			from = filepath.Join(d.Path, OwnLeaf)
		}
		leaf := filepath.Join(d.Path, SealLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("freeze %s: make leaf cgroup: %w", path, err)
		}
		// The leaf starts thawed; it is frozen first so moved processes
		// stop the moment they arrive.
		if err := SetFreezer(d, leaf, cgroups.Frozen); err != nil {
			return fmt.Errorf("freeze %s: %w", path, err)
		}
		if v2 {
			// A process left out would run on: a failed move fails the
			// freeze.
			if err := moveAll(from, leaf); err != nil {
				return fmt.Errorf("freeze %s: %w", path, err)
			}
			// One that got into the branch's own cgroup before its
			// controllers were enabled.
			if err := moveAll(d.Path, leaf); err != nil {
				return fmt.Errorf("freeze %s: %w", path, err)
			}
		} else {
			// Repeat: a process can fork while the others are being moved.
			for i := 0; i < 100; i++ {
				pids := ReadPids(from)
				if len(pids) == 0 {
					break
				}
				for _, pid := range pids {
					if err := cgroups.WriteCgroupProc(leaf, pid); err != nil && !errors.Is(err, unix.ESRCH) {
						log.G(ctx).WithError(err).WithField("pid", pid).Warn("move process to seal cgroup")
					}
				}
			}
		}
		if err := waitFrozen(d, leaf); err != nil {
			return fmt.Errorf("freeze %s: %w", path, err)
		}
	}
	return nil
}

// waitFrozen waits until the kernel says the cgroup dir of hierarchy m is
// frozen: FROZEN in its v1 freezer.state, frozen 1 in its v2
// cgroup.events. Not the library's freeze: on v1 it thaws and refreezes a
// cgroup slow to freeze (letting sealed processes run), on v2 it polls
// every 10ms, a sleep nearly every seal would pay.
func waitFrozen(m Dir, dir string) error {
	h := m.hier()
	for i := 0; i < 2000; i++ {
		frozen, err := h.frozen(dir)
		if err != nil {
			return err
		}
		if frozen {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	file, want := h.frozenMark()
	return fmt.Errorf("%s has no %q after 2s: %w", filepath.Join(dir, file), want, errdefs.ErrUnavailable)
}

// ThawOwn undoes FreezeOwn: the processes go back to the branch's cgroup
// (on cgroup v2 its leaf).
func ThawOwn(ctx context.Context, path string) error {
	dirs, err := Dirs(path)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		leaf := filepath.Join(d.Path, SealLeaf)
		if _, err := os.Stat(leaf); err != nil {
			continue
		}
		to := d.Path
		if d.V2 && IsDir(filepath.Join(d.Path, OwnLeaf)) {
			to = filepath.Join(d.Path, OwnLeaf)
		}
		if d.Freezes() {
			_ = SetFreezer(d, leaf, cgroups.Thawed)
		}
		if err := emptyLeaf(ctx, leaf, to); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// emptyLeaf moves the processes of the seal leaf to the cgroup to and
// removes the leaf. Thawed, they fork again: a child made while its
// parent was moved starts in the leaf, so it is read until empty. A
// process in the middle of exiting (killed while frozen, by a rollback
// with memory or an abort) is listed but not moved, and keeps the leaf
// busy until its exit is through, so an EBUSY is retried with a growing
// pause, about a second in all, as the cgroups library's RemovePath does.
func emptyLeaf(ctx context.Context, leaf, to string) error {
	delay := time.Millisecond
	for attempt := 0; ; attempt++ {
		for try := 0; try < 20; try++ {
			pids := ReadPids(leaf)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				if err := cgroups.WriteCgroupProc(to, pid); err != nil && !errors.Is(err, unix.ESRCH) {
					log.G(ctx).WithError(err).WithField("pid", pid).Warn("move process back from seal cgroup")
				}
			}
		}
		err := unix.Rmdir(leaf)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || attempt == 10 {
			return fmt.Errorf("remove seal cgroup %s: %w", leaf, err)
		}
		time.Sleep(delay)
		delay *= 2
	}
}

// HeldFrozen says whether a held branch is frozen by now: every process of
// it stopped, so the list of its processes is complete.
func HeldFrozen(dirs []Dir) bool {
	d, ok := freezerOf(dirs)
	if !ok {
		return false
	}
	frozen, err := d.hier().frozen(d.Path)
	return err == nil && frozen
}

// freezerOf picks the directory of a cgroup that freezes it whole: the v1
// freezer's if there is one, else the cgroup2 one.
func freezerOf(dirs []Dir) (Dir, bool) {
	for _, d := range dirs {
		if d.Freezer {
			return d, true
		}
	}
	for _, d := range dirs {
		if d.V2 {
			return d, true
		}
	}
	return Dir{}, false
}

// FreezeAll freezes a cgroup and everything below it, and waits until it
// is frozen, unless its only process is alone (not 0).
func FreezeAll(dirs []Dir, alone int) error {
	d, ok := freezerOf(dirs)
	if !ok {
		return fmt.Errorf("no freezer for cgroup: %w", errdefs.ErrNotImplemented)
	}
	h := d.hier()
	if err := h.requestFreeze(d.Path, true); err != nil {
		return fmt.Errorf("freeze %s: %w", d.Path, err)
	}
	if pids, err := SubtreePids([]Dir{d}); err == nil && alone > 0 && len(pids) == 1 && pids[0] == alone {
		return nil
	}
	// Frozen once each process got the CPU to stop: the poll starts short
	// and stays short, as a wait of a busy machine's scheduling delay
	// (milliseconds) is overshot by no more than a step.
	delay := 20 * time.Microsecond
	for deadline := time.Now().Add(2 * time.Second); ; {
		frozen, err := h.frozen(d.Path)
		if err != nil {
			return fmt.Errorf("freeze %s: %w", d.Path, err)
		}
		if frozen {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freeze %s: not frozen after 2s: %w", d.Path, errdefs.ErrUnavailable)
		}
		time.Sleep(delay)
		if delay < 160*time.Microsecond {
			delay *= 2
		}
	}
}

// freezerKey is a child cgroup of a sandbox's, empty and frozen (v1
// freezer) while the sandbox has branches loaded: the kernel turns its
// freezer on and off (a static key, patched into running code on every
// CPU) as the first cgroup starts freezing and the last thaws, which
// costs milliseconds on a busy machine; held on, freezing and thawing a
// branch for a commit only counts.
const freezerKey = ".freezer-key"

// HoldFreezerKey freezes an empty child of cgroup path on the v1 freezer
// hierarchy, if there is one.
func HoldFreezerKey(ms []Dir, path string) {
	for _, d := range DirsIn(ms, path) {
		if !d.Freezer {
			continue
		}
		key := filepath.Join(d.Path, freezerKey)
		if err := os.Mkdir(key, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return
		}
		_ = os.WriteFile(filepath.Join(key, "freezer.state"), []byte("FROZEN"), 0)
	}
}

// ReleaseFreezerKey thaws and removes what HoldFreezerKey made.
func ReleaseFreezerKey(ms []Dir, path string) {
	for _, d := range DirsIn(ms, path) {
		if !d.Freezer {
			continue
		}
		key := filepath.Join(d.Path, freezerKey)
		_ = os.WriteFile(filepath.Join(key, "freezer.state"), []byte("THAWED"), 0)
		_ = unix.Rmdir(key)
	}
}

// ThawAll undoes FreezeAll.
func ThawAll(dirs []Dir) error {
	d, ok := freezerOf(dirs)
	if !ok {
		return nil
	}
	if err := d.hier().requestFreeze(d.Path, false); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("thaw %s: %w", d.Path, err)
	}
	return nil
}

// Freezers is the hierarchies of ms that freeze: the v1 freezer, cgroup2.
func Freezers(ms []Dir) []Dir {
	var out []Dir
	for _, m := range ms {
		if m.Freezes() {
			out = append(out, m)
		}
	}
	return out
}

// Frozen says whether a cgroup is frozen or being frozen, by itself
// or by an ancestor: its v1 freezer's state (FROZEN or FREEZING; the
// state of a child frozen by itself does not reach it), or on cgroup v2
// its own cgroup.freeze or the frozen flag of cgroup.events.
func Frozen(dirs []Dir) bool {
	d, ok := freezerOf(dirs)
	if !ok {
		return false
	}
	return d.hier().freezing(d.Path)
}

// Frozen says whether the cgroup at path is frozen or freezing (Frozen).
// Only the hierarchies that can freeze are looked at: this is asked
// before every operation, and a stat of each v1 hierarchy cost more than
// the answer.
func (h *Host) Frozen(path string) bool {
	ms, err := h.Mounts()
	if err != nil {
		return false
	}
	return Frozen(DirsIn(Freezers(ms), path))
}
