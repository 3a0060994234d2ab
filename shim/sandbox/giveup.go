//go:build linux

package sandbox

import (
	"context"
	"sync"
	"time"
)

// A caller of a branch operation may give up (its deadline passes, or it
// hangs up) at any point. What it left unfinished must not go on to
// happen later, unseen: an operation checks whether its caller is still
// there once it holds the sandbox (load), and a fork made after its caller
// left is undone (Fork). A call to the snapshotter that the caller gives
// up on midway may still be carried out there, so one whose result the
// shim needs in order to undo it is waited for regardless (answerCtx).

// answerGrace bounds how long a call to the snapshotter is still waited
// for once its caller gave up.
const answerGrace = time.Minute

// answerCtx is ctx for a call to the snapshotter whose answer is needed
// even if the caller gives up: it keeps ctx's values, is not cancelled
// with ctx, and ends grace after ctx does. Call the returned func when
// the call is done.
func answerCtx(ctx context.Context, grace time.Duration) (context.Context, func()) {
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu    sync.Mutex
		timer *time.Timer
		done  bool
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			timer = time.AfterFunc(grace, cancel)
		}
	})
	return actx, func() {
		stop()
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}
