//go:build linux

package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// errUnsent is detached's answer for a call it did not send: its caller
// left while it waited for what earlier calls undo. Its orphan is told,
// to release what was made ready for it (an exec's FIFOs).
var errUnsent = errors.New("not sent")

// answer is a shim call's result.
type answer[T any] struct {
	v   T
	err error
}

// detached runs call, which makes something in the shim (a process, a
// branch), to its answer even if ctx is cancelled first. ttrpc carries no
// cancel: a call cut short on the client's side goes on in the shim, and
// what it makes would be there with nobody knowing. So the call runs on
// ctx's values alone, within bound (past ctx's deadline, which the shim is
// sent and gives up at, undoing what it began); a caller whose ctx ends
// first has ctx's error at once (after what, which names the call), and
// orphan is given the answer once it comes, to undo what was made;
// undoing counts it, for a Close to wait for (a program that exits at once
// would leave it undone).
func detached[T any](ctx context.Context, undoing *undos, what string, bound time.Duration, call func(context.Context) (T, error), orphan func(context.Context, T, error)) (T, error) {
	// Sent after what earlier calls' orphans undo (undos.after), but not
	// after its own orphan, added once ctx ends.
	before := undoing.seq()
	answered := make(chan answer[T], 1)
	go func() {
		detachedCtx := context.WithValue(context.WithoutCancel(ctx), undoingKey{}, true)
		cctx, cancel := context.WithTimeout(detachedCtx, bound)
		if dl, ok := ctx.Deadline(); ok {
			// The shim gives up at dl (branch.DeadlineHeader); its answer
			// is waited for past it.
			cancel()
			cctx, cancel = context.WithDeadline(withCallerDeadline(detachedCtx, dl), dl.Add(bound))
		}
		defer cancel()
		if ctx.Value(undoingKey{}) == nil {
			if err := undoing.waitBefore(ctx, before); err != nil {
				// The caller left first: the call is not made.
				answered <- answer[T]{err: fmt.Errorf("%s: %w: %w", what, errUnsent, err)}
				return
			}
		}
		v, err := call(cctx)
		answered <- answer[T]{v, err}
	}()
	select {
	case a := <-answered:
		if errors.Is(a.err, errUnsent) {
			// Its wait saw ctx end before this select did: the orphan is
			// told here, as it is below, to release what was made ready.
			orphan(context.WithValue(context.WithoutCancel(ctx), undoingKey{}, true), a.v, a.err)
		}
		return a.v, a.err
	case <-ctx.Done():
		id := undoing.add()
		go func() {
			defer undoing.done(id)
			a := <-answered
			octx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(ctx), undoingKey{}, true), bound)
			defer cancel()
			orphan(octx, a.v, a.err)
		}()
		var zero T
		return zero, fmt.Errorf("%s: %w", what, ctx.Err())
	}
}

// undos counts what detached calls' orphans still undo, in the order they
// began. Unlike a WaitGroup's, its count may go up while wait waits (a
// Close of a client that a call still uses, such as the HTTP API's cache
// dropping one); wait returns once it is zero. The zero value is ready.
type undos struct {
	mu      sync.Mutex
	next    uint64
	pending map[uint64]bool
	// changed is closed, and replaced, when an undo is done.
	changed chan struct{}
}

// seq is the number the next undo will have.
func (u *undos) seq() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.next
}

func (u *undos) add() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pending == nil {
		u.pending = map[uint64]bool{}
	}
	id := u.next
	u.next++
	u.pending[id] = true
	return id
}

func (u *undos) done(id uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.pending, id)
	if u.changed != nil {
		close(u.changed)
		u.changed = nil
	}
}

func (u *undos) wait() { _ = u.waitBefore(context.Background(), ^uint64(0)) }

// waitBefore waits until the undos numbered below seq are done, or ctx
// ends (its error).
func (u *undos) waitBefore(ctx context.Context, seq uint64) error {
	for {
		u.mu.Lock()
		left := false
		for id := range u.pending {
			if id < seq {
				left = true
				break
			}
		}
		if !left {
			u.mu.Unlock()
			return nil
		}
		if u.changed == nil {
			u.changed = make(chan struct{})
		}
		changed := u.changed
		u.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// undoingKey marks the context of an orphan's calls (detached), which the
// client's other calls wait for (after), and of a detached call, which
// waits in detached: those do not wait in after.
type undoingKey struct{}

// after waits, before a call on ctx, until what earlier calls whose
// callers left still undo is done, so that the call sees the state their
// errors said ("not made"): a listing right after a checkpoint cut at its
// deadline showed the checkpoint its orphan was deleting, and a retry
// under its name was refused "already exists". Not for the orphans' own
// calls, nor past ctx's end (the call then fails with ctx's error).
func (u *undos) after(ctx context.Context) {
	if ctx.Value(undoingKey{}) == nil {
		_ = u.waitBefore(ctx, u.seq())
	}
}

// abortOrphans returns detached's orphan for a fork (what names it): it
// aborts the branches made for a caller that left before the answer,
// which nobody knows and which would count against the sandbox's live
// branches until it ends. A memory fork of the caller's own branch, whose
// answer is a call still to be made in each copy (SelfClient.Fork), is
// left as it is.
func abortOrphans(what string, abort func(context.Context, string) ([]string, error)) func(context.Context, *shimv1.ForkResponse, error) {
	return func(ctx context.Context, resp *shimv1.ForkResponse, err error) {
		if err != nil || resp.Pending != "" {
			return
		}
		for _, b := range resp.Branches {
			if _, err := abort(ctx, b.Id); err != nil && !errdefs.IsNotFound(err) {
				log.G(ctx).WithError(err).Warnf("%s, its caller gone: abort branch %s", what, b.Id)
			}
		}
	}
}

// deleteOrphan returns detached's orphan for a checkpoint (what names it):
// it deletes checkpoint name, made for a caller that left before the
// answer, so that the caller's error means "not kept". A checkpoint of the
// caller itself (pending), whose copies return from it, is left as it is.
func deleteOrphan(what, name string, del func(context.Context, string) error) func(context.Context, *shimv1.CheckpointResponse, error) {
	return func(ctx context.Context, resp *shimv1.CheckpointResponse, err error) {
		if err != nil || resp.Pending != "" {
			return
		}
		if err := del(ctx, name); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).Warnf("%s, its caller gone: delete it", what)
		}
	}
}

// withCallerDeadline adds the caller's deadline dl to ctx's ttrpc metadata
// (branch.DeadlineHeader), beside what is there (the namespace's).
func withCallerDeadline(ctx context.Context, dl time.Time) context.Context {
	md, ok := ttrpc.GetMetadata(ctx)
	if ok {
		md = md.Clone()
	} else {
		md = ttrpc.MD{}
	}
	md.Set(branch.DeadlineHeader, strconv.FormatInt(dl.UnixNano(), 10))
	return ttrpc.WithMetadata(ctx, md)
}
