//go:build linux

package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// answer is a shim call's result.
type answer[T any] struct {
	v   T
	err error
}

// detached runs call, which makes something in the shim (a process, a
// branch), to its answer even if ctx ends first. ttrpc carries no cancel:
// a call cut short on the client's side goes on in the shim, and what it
// makes would be there with nobody knowing. So the call runs on ctx's
// values alone, within bound; a caller whose ctx ends first has ctx's
// error at once (after what, which names the call), and orphan is given
// the answer once it comes, to undo what was made; undoing counts it, for
// a Close to wait for (a program that exits at once would leave it undone).
func detached[T any](ctx context.Context, undoing *sync.WaitGroup, what string, bound time.Duration, call func(context.Context) (T, error), orphan func(context.Context, T, error)) (T, error) {
	answered := make(chan answer[T], 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
		defer cancel()
		v, err := call(cctx)
		answered <- answer[T]{v, err}
	}()
	select {
	case a := <-answered:
		return a.v, a.err
	case <-ctx.Done():
		undoing.Add(1)
		go func() {
			defer undoing.Done()
			a := <-answered
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
			defer cancel()
			orphan(octx, a.v, a.err)
		}()
		var zero T
		return zero, fmt.Errorf("%s: %w", what, ctx.Err())
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
