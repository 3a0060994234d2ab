//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// PidsLevel is one cgroup with a process limit: a branch's, the
// sandbox's, or one above the sandbox's (a pod's, say).
type PidsLevel struct {
	Cgroup       string // its path on the hierarchy, as a spec names it
	Max, Current int64
}

// Room is how many more processes fit under the limit.
func (l PidsLevel) Room() int64 { return l.Max - l.Current }

// PidsLimit says a fork or clone was refused, or would be, by a process
// limit: the cgroup whose limit it is and that limit. Fork turns it into
// the user's terms (pidsRefusal).
type PidsLimit struct {
	PidsLevel
	Need int64 // what the fork needed, when it was refused up front; else 0
}

func (e *PidsLimit) Error() string {
	return fmt.Sprintf("the process limit of cgroup %s (pids.max %d) is reached", e.Cgroup, e.Max)
}

func (e *PidsLimit) Unwrap() error { return errdefs.ErrResourceExhausted }

// pidsDir is the directory of a cgroup path on the hierarchy that holds
// the pids controller, and that hierarchy's root; "" if there is none.
func pidsDir(ms []Dir, path string) (dir, root string) {
	for _, m := range ms {
		if m.Pids {
			return filepath.Join(m.Path, path), m.Path
		}
	}
	return "", ""
}

// PidsLimits reads the process limits that bound a cgroup path: its own
// and every ancestor's that has one (pids.max is not "max"), nearest
// first. The pids controller charges a process to every ancestor, so each
// of them can refuse a fork.
func PidsLimits(ms []Dir, path string) []PidsLevel {
	dir, root := pidsDir(ms, path)
	if dir == "" {
		return nil
	}
	var out []PidsLevel
	for _, a := range ancestors(dir, root) {
		b, err := os.ReadFile(filepath.Join(a.dir, "pids.max"))
		if err != nil {
			continue // not made yet, or no pids controller enabled here (v2)
		}
		max, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue // "max"
		}
		cur, err := readInt(filepath.Join(a.dir, "pids.current"))
		if err != nil {
			continue
		}
		out = append(out, PidsLevel{Cgroup: a.rel, Max: max, Current: cur})
	}
	return out
}

// level is one cgroup directory on a hierarchy, and its path there as a
// spec names it ("/" for the hierarchy's root).
type level struct{ dir, rel string }

// ancestors is dir, a cgroup directory under the hierarchy mounted at
// root, and each directory above it below root, nearest first: where a
// limit that bounds dir can be set.
func ancestors(dir, root string) []level {
	var out []level
	for d := dir; len(d) > len(root) && strings.HasPrefix(d, root); d = filepath.Dir(d) {
		rel := strings.TrimPrefix(d, root)
		if rel == "" {
			rel = "/"
		}
		out = append(out, level{d, rel})
	}
	return out
}

func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Tightest is the limit with the least room, if it has less than need;
// nil otherwise.
func Tightest(levels []PidsLevel, need int64) *PidsLevel {
	var t *PidsLevel
	for i := range levels {
		if levels[i].Room() < need && (t == nil || levels[i].Room() < t.Room()) {
			t = &levels[i]
		}
	}
	return t
}

// EAGAINText says whether a failure's text is a fork, clone or thread
// creation refused with EAGAIN, as the runtime (and the Go runtime in its
// init, and the branch init) word it.
func EAGAINText(err error) bool {
	s := strings.ToLower(err.Error())
	for _, w := range []string{"resource temporarily unavailable", "errno=11", "eagain", "failed to create new os thread", "pthread_create failed"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// LostInitText says whether the runtime lost its init before the init
// said it was ready: what a Go runtime that could not start its threads
// leaves, among other causes (so it counts only near a limit).
func LostInitText(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "procready not received")
}

// AsPidsLimit finds, among the errors of a fork's starts, one refused by a
// process limit: one a start named (the init path sees the clone's
// EAGAIN), or an EAGAIN in the runtime's words while a limit bounds the
// parent (levels), or, for starts by the runtime (slack > 0), its init
// lost before it was ready while a limit leaves less room than slack. A
// failure of another kind (a command not found, a bad mount) is not taken
// for a limit, however near it is. The runtime's processes are gone by the
// time it reports, so the limit with the least room is the one named.
func AsPidsLimit(errs []error, levels []PidsLevel, slack int64) *PidsLimit {
	for _, err := range errs {
		var pl *PidsLimit
		if errors.As(err, &pl) {
			return pl
		}
	}
	for _, err := range errs {
		if err != nil && len(levels) > 0 && (EAGAINText(err) || slack > 0 && LostInitText(err) && Tightest(levels, slack) != nil) {
			t := levels[0]
			for _, l := range levels[1:] {
				if l.Room() < t.Room() {
					t = l
				}
			}
			return &PidsLimit{PidsLevel: t}
		}
	}
	return nil
}

// PidsOnV1 says the pids controller is on a v1 hierarchy, where a fork
// into a limited cgroup needs room for the thread that forks too.
func PidsOnV1(ms []Dir) bool {
	for _, m := range ms {
		if m.Pids {
			return !m.V2
		}
	}
	return false
}

// PidsShort is the tightest process limit above path that has no room for
// need more processes, and one more on a v1 hierarchy for the thread that
// forks (nil: every limit has room): a fork's check, in one call.
func PidsShort(ms []Dir, path string, need int64) *PidsLimit {
	levels := PidsLimits(ms, path)
	if len(levels) == 0 {
		return nil
	}
	if need > 0 && PidsOnV1(ms) {
		need++
	}
	if t := Tightest(levels, need); t != nil {
		return &PidsLimit{PidsLevel: *t, Need: need}
	}
	return nil
}
