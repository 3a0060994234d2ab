//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// pidsLevel is one cgroup with a process limit: a branch's, the
// sandbox's, or one above the sandbox's (a pod's, say).
type pidsLevel struct {
	cgroup       string // its path on the hierarchy, as a spec names it
	max, current int64
}

// room is how many more processes fit under the limit.
func (l pidsLevel) room() int64 { return l.max - l.current }

// pidsLimit says a fork or clone was refused, or would be, by a process
// limit: the cgroup whose limit it is and that limit. Fork turns it into
// the user's terms (pidsRefusal).
type pidsLimit struct {
	pidsLevel
	need int64 // what the fork needed, when it was refused up front; else 0
}

func (e *pidsLimit) Error() string {
	return fmt.Sprintf("the process limit of cgroup %s (pids.max %d) is reached", e.cgroup, e.max)
}

func (e *pidsLimit) Unwrap() error { return errdefs.ErrResourceExhausted }

// pidsDir is the directory of a cgroup path on the hierarchy that holds
// the pids controller, and that hierarchy's root; "" if there is none.
func pidsDir(ms []cgroupMount, path string) (dir, root string) {
	for _, m := range ms {
		if m.pids {
			return filepath.Join(m.dir, path), m.dir
		}
	}
	return "", ""
}

// pidsLimits reads the process limits that bound a cgroup path: its own
// and every ancestor's that has one (pids.max is not "max"), nearest
// first. The pids controller charges a process to every ancestor, so each
// of them can refuse a fork.
func pidsLimits(ms []cgroupMount, path string) []pidsLevel {
	dir, root := pidsDir(ms, path)
	if dir == "" {
		return nil
	}
	var out []pidsLevel
	for d := dir; len(d) > len(root) && strings.HasPrefix(d, root); d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "pids.max"))
		if err != nil {
			continue // not made yet, or no pids controller enabled here (v2)
		}
		max, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue // "max"
		}
		cur, err := readInt(filepath.Join(d, "pids.current"))
		if err != nil {
			continue
		}
		rel := strings.TrimPrefix(d, root)
		if rel == "" {
			rel = "/"
		}
		out = append(out, pidsLevel{cgroup: rel, max: max, current: cur})
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

// tightest is the limit with the least room, if it has less than need;
// nil otherwise.
func tightest(levels []pidsLevel, need int64) *pidsLevel {
	var t *pidsLevel
	for i := range levels {
		if levels[i].room() < need && (t == nil || levels[i].room() < t.room()) {
			t = &levels[i]
		}
	}
	return t
}

// eagainText says whether a failure's text is a fork, clone or thread
// creation refused with EAGAIN, as the runtime (and the Go runtime in its
// init, and the branch init) word it.
func eagainText(err error) bool {
	s := strings.ToLower(err.Error())
	for _, w := range []string{"resource temporarily unavailable", "errno=11", "eagain", "failed to create new os thread", "pthread_create failed"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// lostInitText says whether the runtime lost its init before the init
// said it was ready: what a Go runtime that could not start its threads
// leaves, among other causes (so it counts only near a limit).
func lostInitText(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "procready not received")
}

// runtimeStartPids is what a branch the runtime starts may hold while it
// starts: the runtime's init is a Go program, whose threads count as
// processes (6 to 7 measured here, waiting for its start), besides the
// runtime's helper processes. Its failure for want of them shows as a
// missing thread or a lost init ("procReady not received"), rarely as an
// EAGAIN in its words.
const runtimeStartPids = 8

// asPidsLimit finds, among the errors of a fork's starts, one refused by a
// process limit: one a start named (the init path sees the clone's
// EAGAIN), or an EAGAIN in the runtime's words while a limit bounds the
// parent (levels), or, for starts by the runtime (slack > 0), its init
// lost before it was ready while a limit leaves less room than slack. A
// failure of another kind (a command not found, a bad mount) is not taken
// for a limit, however near it is. The runtime's processes are gone by the
// time it reports, so the limit with the least room is the one named.
func asPidsLimit(errs []error, levels []pidsLevel, slack int64) *pidsLimit {
	for _, err := range errs {
		var pl *pidsLimit
		if errors.As(err, &pl) {
			return pl
		}
	}
	for _, err := range errs {
		if err != nil && len(levels) > 0 && (eagainText(err) || slack > 0 && lostInitText(err) && tightest(levels, slack) != nil) {
			t := levels[0]
			for _, l := range levels[1:] {
				if l.room() < t.room() {
					t = l
				}
			}
			return &pidsLimit{pidsLevel: t}
		}
	}
	return nil
}

// pidsRefusal is a fork refused by a process limit, in one line in the
// user's terms: whose limit (the sandbox's, a branch's, the new branch's
// own, or a cgroup's above the sandbox) and its value.
func (sb *sandbox) pidsRefusal(parent *bctx, pl *pidsLimit) error {
	what := "fork of sandbox " + sb.id
	if parent.id != branch.RootID {
		what = "fork of branch " + sb.id + "/" + parent.id
	}
	cg := filepath.Clean(pl.cgroup)
	whose := ""
	for _, n := range sb.nodes {
		if filepath.Clean(n.cgroup) != cg {
			continue
		}
		if n.id == branch.RootID {
			whose = "the sandbox's"
		} else {
			whose = "branch " + n.id + "'s"
		}
	}
	if whose == "" {
		if strings.HasPrefix(cg, filepath.Clean(parent.cgroup)+"/") {
			whose = "the new branch's own"
		} else {
			whose = "cgroup " + cg + "'s (above the sandbox)"
		}
	}
	need := ""
	if pl.need > 0 {
		need = fmt.Sprintf(" (%d free, the fork needs %d)", max(pl.room(), 0), pl.need)
	}
	return fmt.Errorf("%s: %s process limit (pids.max %d) is reached%s: %w", what, whose, pl.max, need, errdefs.ErrResourceExhausted)
}

// pidsRoom refuses up front, before anything is made or sealed, a fork
// that needs more processes than the limits above its parent leave: one
// per branch init, one more per branch given a command on the branch-init
// path (the init forks it), less the inits started ahead that a fork of
// the root takes (they are counted already), and on a v1 pids hierarchy
// one for the moment of a clone (the shim's forking thread, or the
// runtime's first process, is in the cgroup unchecked while it forks). A
// fork that passes can still be refused by the kernel, as the sandbox's
// own processes fork meanwhile or the runtime's helper processes need
// more; the branches it made so far are then rolled back (Fork).
func (c *Service) pidsRoom(sb *sandbox, parent *bctx, ms []cgroupMount, runtimePath bool, req *shimv1.ForkRequest) error {
	levels := pidsLimits(ms, parent.cgroup)
	if len(levels) == 0 {
		return nil
	}
	per := int64(1)
	if len(req.Args) > 0 && !runtimePath {
		per = 2
	}
	need := int64(req.Count) * per
	if !runtimePath && parent.id == branch.RootID && req.Net == NetShared && sb.pool != nil {
		need -= int64(min(sb.pool.count(), int(req.Count)))
	}
	if need > 0 && pidsOnV1(ms) {
		need++
	}
	if t := tightest(levels, need); t != nil {
		return sb.pidsRefusal(parent, &pidsLimit{pidsLevel: *t, need: need})
	}
	return nil
}
