//go:build linux

package sandbox

// The bounds on what one sandbox may make this shim hold: live branches,
// their depth, its checkpoints and the bytes they hold, and how fast its
// own processes may fork and checkpoint through its branch socket. Each
// branch costs the host a mount, a cgroup per hierarchy and an init, and
// each checkpoint a layer (and memory image) in the snapshotter's root,
// outside the sandbox's own limits, so a sandbox must not be able to make
// them without end. Each bound is set per sandbox by an annotation
// on its container, per node by the shim's environment (containerd's: the
// shim inherits it), and otherwise has a default (docs/limits.md).

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	units "github.com/docker/go-units"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/time/rate"

	"github.com/branchbox/branchbox/branch"
)

// The annotations that set a sandbox's bounds.
const (
	MaxBranchesAnnotation        = "io.branchbox.max-branches"
	MaxDepthAnnotation           = "io.branchbox.max-depth"
	ForkRateAnnotation           = "io.branchbox.fork-rate"
	MaxCheckpointsAnnotation     = "io.branchbox.max-checkpoints"
	MaxCheckpointBytesAnnotation = "io.branchbox.max-checkpoint-bytes"
	CallRateAnnotation           = "io.branchbox.call-rate"
)

// The environment variables that set the node's defaults.
const (
	MaxBranchesEnv        = "BRANCHBOX_MAX_BRANCHES"
	MaxDepthEnv           = "BRANCHBOX_MAX_DEPTH"
	ForkRateEnv           = "BRANCHBOX_FORK_RATE"
	MaxCheckpointsEnv     = "BRANCHBOX_MAX_CHECKPOINTS"
	MaxCheckpointBytesEnv = "BRANCHBOX_MAX_CHECKPOINT_BYTES"
	CallRateEnv           = "BRANCHBOX_CALL_RATE"
)

// The defaults, and the ranges a setting must be in.
const (
	// DefaultMaxBranches is how many branches a sandbox may have live at
	// once, counting every level.
	DefaultMaxBranches = 64
	// MaxMaxBranches is the most a setting may allow: the most one fork
	// may make.
	MaxMaxBranches = 1024
	// DefaultMaxDepth is how deep branches may nest: a branch of the
	// sandbox is at depth 1.
	DefaultMaxDepth = 32
	// MaxMaxDepth is the snapshotter's own bound (each level is one more
	// overlay layer under the branch).
	MaxMaxDepth = 256
	// DefaultForkRate is how many branches a second a sandbox's processes
	// may make through its branch socket, after a burst of its
	// max-branches. Forks from the host are not rate-limited.
	DefaultForkRate = 100
	// MaxForkRate is the highest rate a setting may give.
	MaxForkRate = 10000
	// DefaultMaxCheckpoints is how many checkpoints a sandbox may keep,
	// of all its branches; MaxMaxCheckpoints the most a setting may allow.
	DefaultMaxCheckpoints = 256
	MaxMaxCheckpoints     = 65536
	// DefaultMaxCheckpointBytes is how much its checkpoints' layers and
	// memory images may hold; a setting may allow from MinMaxCheckpointBytes
	// to MaxMaxCheckpointBytes.
	DefaultMaxCheckpointBytes = 10 << 30
	MinMaxCheckpointBytes     = 1 << 20
	MaxMaxCheckpointBytes     = 1 << 50
	// DefaultCallRate is how many calls a second a sandbox's processes
	// may make through its branch sockets, after a burst of callBurst:
	// each costs the shim's CPU, not the sandbox's (a tree of 9 branches
	// about 1.7 ms on a cgroup v1 node), and a process at 6% of a CPU
	// calling tree in a loop held the shim at 57%. MaxCallRate is the
	// highest a setting may give.
	DefaultCallRate = 100
	MaxCallRate     = 100000
	// callBurst is the calls a sandbox may make at once: a best of 64
	// (the fork, an exec and a wait in each, the commit) fits in it.
	callBurst = selfExecMax
	// selfForkMaxWait is how long an in-sandbox fork or call over its rate
	// waits for its turn; one that would wait longer is refused (a fork
	// at once, a call after that long: throttleCall).
	selfForkMaxWait = time.Second
)

// bounds are one sandbox's (or the node's default) bounds, and where each
// came from, for the messages that enforce them.
type bounds struct {
	maxBranches, maxDepth int
	forkRate              float64
	maxCheckpoints        int
	maxCheckpointBytes    int64
	callRate              float64
	branchesFrom          string
	depthFrom             string
	rateFrom              string
	checkpointsFrom       string
	checkpointBytesFrom   string
	callRateFrom          string
}

// defaultBounds are the built-in defaults.
func defaultBounds() bounds {
	const from = "the default"
	return bounds{
		maxBranches: DefaultMaxBranches, maxDepth: DefaultMaxDepth, forkRate: DefaultForkRate,
		maxCheckpoints: DefaultMaxCheckpoints, maxCheckpointBytes: DefaultMaxCheckpointBytes, callRate: DefaultCallRate,
		branchesFrom:        from + "; annotation " + MaxBranchesAnnotation + " sets it",
		depthFrom:           from + "; annotation " + MaxDepthAnnotation + " sets it",
		rateFrom:            from + "; annotation " + ForkRateAnnotation + " sets it",
		checkpointsFrom:     from + "; annotation " + MaxCheckpointsAnnotation + " sets it",
		checkpointBytesFrom: from + "; annotation " + MaxCheckpointBytesAnnotation + " sets it",
		callRateFrom:        from + "; annotation " + CallRateAnnotation + " sets it",
	}
}

// boundSetting is one bound: where it is read from and its range.
type boundSetting struct {
	env, annotation string
	from            *string
	set             func(v float64)
	integer         bool
	// size: a number of bytes, with or without a binary unit ("10GiB").
	size     bool
	min, max float64
}

func (b *bounds) settings() []boundSetting {
	return []boundSetting{
		{MaxBranchesEnv, MaxBranchesAnnotation, &b.branchesFrom, func(v float64) { b.maxBranches = int(v) }, true, false, 1, MaxMaxBranches},
		{MaxDepthEnv, MaxDepthAnnotation, &b.depthFrom, func(v float64) { b.maxDepth = int(v) }, true, false, 1, MaxMaxDepth},
		{ForkRateEnv, ForkRateAnnotation, &b.rateFrom, func(v float64) { b.forkRate = v }, false, false, 0.01, MaxForkRate},
		{MaxCheckpointsEnv, MaxCheckpointsAnnotation, &b.checkpointsFrom, func(v float64) { b.maxCheckpoints = int(v) }, true, false, 1, MaxMaxCheckpoints},
		{MaxCheckpointBytesEnv, MaxCheckpointBytesAnnotation, &b.checkpointBytesFrom, func(v float64) { b.maxCheckpointBytes = int64(v) }, true, true, MinMaxCheckpointBytes, MaxMaxCheckpointBytes},
		{CallRateEnv, CallRateAnnotation, &b.callRateFrom, func(v float64) { b.callRate = v }, false, false, 1, MaxCallRate},
	}
}

// parseBound reads one setting's value, refusing anything out of range.
func parseBound(s boundSetting, what, value string) (float64, error) {
	var v float64
	var err error
	switch {
	case s.size:
		var n int64
		n, err = units.RAMInBytes(value)
		v = float64(n)
	case s.integer:
		var i int64
		i, err = strconv.ParseInt(value, 10, 32)
		v = float64(i)
	default:
		v, err = strconv.ParseFloat(value, 64)
	}
	if err != nil || math.IsNaN(v) || v < s.min || v > s.max {
		kind, lo, hi := "a number", fmt.Sprint(s.min), fmt.Sprint(s.max)
		switch {
		case s.size:
			kind, lo, hi = "a size (bytes, or with a unit: 512MiB, 10GiB)", branch.Bytes(int64(s.min)), branch.Bytes(int64(s.max))
		case s.integer:
			kind = "a whole number"
		}
		return 0, fmt.Errorf("%s = %q: want %s from %s to %s: %w", what, value, kind, lo, hi, errdefs.ErrInvalidArgument)
	}
	return v, nil
}

// nodeBounds are the defaults with the node's environment applied.
func nodeBounds(getenv func(string) string) (bounds, error) {
	b := defaultBounds()
	for _, s := range b.settings() {
		value := getenv(s.env)
		if value == "" {
			continue
		}
		v, err := parseBound(s, s.env+" in the shim's environment", value)
		if err != nil {
			return defaultBounds(), err
		}
		s.set(v)
		*s.from = fmt.Sprintf("set for the node by %s; annotation %s sets it per sandbox", s.env, s.annotation)
	}
	return b, nil
}

// sandboxBounds are node with a sandbox's annotations applied.
func sandboxBounds(node bounds, spec *specs.Spec) (bounds, error) {
	b := node
	for _, s := range b.settings() {
		value, ok := spec.Annotations[s.annotation]
		if !ok {
			continue
		}
		v, err := parseBound(s, "annotation "+s.annotation, value)
		if err != nil {
			return node, err
		}
		s.set(v)
		*s.from = "annotation " + s.annotation
	}
	return b, nil
}

// BoundsFor are the bounds of the sandbox whose bundle this is; a bad
// setting (of the node or the sandbox) fails its creation.
func (c *Service) BoundsFor(bundle string) (bounds, error) {
	if c.nodeBoundsErr != nil {
		return bounds{}, c.nodeBoundsErr
	}
	spec, err := ReadSpec(bundle)
	if err != nil {
		return bounds{}, err
	}
	return sandboxBounds(c.nodeBounds, spec)
}

// readNodeBounds reads the node's bounds from the shim's environment.
func readNodeBounds() (bounds, error) { return nodeBounds(os.Getenv) }

// newForkLimiter is a sandbox's bucket of in-sandbox forks: its rate, and
// a burst of its max-branches, so that any fork it allows can be made.
func newForkLimiter(b bounds) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(b.forkRate), b.maxBranches)
}

// throttleSelfFork takes count branches from the sandbox's bucket of
// in-sandbox forks, waiting up to selfForkMaxWait for them. A fork the
// bounds then refuse has spent them too: a loop of refused forks costs
// the shim as well.
func (sb *Sandbox) throttleSelfFork(ctx context.Context, count int) error {
	if count < 1 || count > sb.bounds.maxBranches {
		return nil // refused by Fork, with the reason
	}
	return sb.throttleSelf(ctx, count, func(d time.Duration) string {
		return fmt.Sprintf("sandbox %s forks from inside at most %v branches a second (%s), and %d more would wait %v", sb.id, sb.bounds.forkRate, sb.bounds.rateFrom, count, d)
	})
}

// throttleSelfOne takes one token from the same bucket for a checkpoint
// or a rollback (what) asked for from inside: each reads the branch's
// upper and copies its changes (with memory, dumps or restores its
// processes) on the host's time, as a fork costs it.
func (sb *Sandbox) throttleSelfOne(ctx context.Context, what string) error {
	return sb.throttleSelf(ctx, 1, func(d time.Duration) string {
		return fmt.Sprintf("sandbox %s makes from inside at most %v branches, checkpoints and rollbacks a second (%s), and this %s would wait %v", sb.id, sb.bounds.forkRate, sb.bounds.rateFrom, what, d)
	})
}

// newCallLimiter is a sandbox's bucket of calls through its branch
// sockets.
func newCallLimiter(b bounds) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(b.callRate), callBurst)
}

// throttleCall takes one call from the sandbox's bucket of calls through
// its branch sockets (every call, before its own bounds), waiting up to
// selfForkMaxWait for it. A call refused is answered only after that
// wait: refused at once, a loop of calls would cost the shim a refusal
// each, as fast as it could send them.
func (sb *Sandbox) throttleCall(ctx context.Context) error {
	err := throttle(ctx, sb.calls, 1, func(d time.Duration) string {
		return fmt.Sprintf("sandbox %s makes at most %v calls a second through its branch sockets (%s), and this one would have waited %v", sb.id, sb.bounds.callRate, sb.bounds.callRateFrom, d)
	})
	if errdefs.IsResourceExhausted(err) {
		t := time.NewTimer(selfForkMaxWait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return err
}

func (sb *Sandbox) throttleSelf(ctx context.Context, count int, over func(wait time.Duration) string) error {
	r := sb.forks.ReserveN(time.Now(), count)
	if !r.OK() {
		return fmt.Errorf("fork: count %d is more than sandbox %s may fork at once: %w", count, sb.id, errdefs.ErrInvalidArgument)
	}
	return wait(ctx, r, over)
}

// throttle takes count tokens from lim, waiting up to selfForkMaxWait.
func throttle(ctx context.Context, lim *rate.Limiter, count int, over func(wait time.Duration) string) error {
	return wait(ctx, lim.ReserveN(time.Now(), count), over)
}

// wait waits for a reservation, or cancels it and refuses (over words
// why) if it would wait more than selfForkMaxWait.
func wait(ctx context.Context, r *rate.Reservation, over func(wait time.Duration) string) error {
	d := r.Delay()
	if d > selfForkMaxWait {
		r.Cancel()
		return fmt.Errorf("%s: retry later: %w", over(d.Round(time.Millisecond)), errdefs.ErrResourceExhausted)
	}
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			r.Cancel()
			return ctx.Err()
		}
	}
	return nil
}

// counted is n of a thing, in the singular for one: messages about bounds
// of 1 read right.
func counted(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
