//go:build linux

package client

import (
	"context"
	"fmt"
	"sync"
	"time"
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
