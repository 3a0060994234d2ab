//go:build linux

package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// undos' count may go up while wait waits, and wait returns once it is
// zero (a WaitGroup panics when an Add races a Wait it is waking).
func TestUndos(t *testing.T) {
	var u undos
	u.wait() // none: returns at once
	first := u.add()
	waited := make(chan struct{})
	go func() {
		u.wait()
		close(waited)
	}()
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u.done(u.add())
		}()
	}
	wg.Wait()
	select {
	case <-waited:
		t.Fatal("wait returned with one undo left")
	case <-time.After(50 * time.Millisecond):
	}
	u.done(first)
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return once none was left")
	}
}

// after waits for what is being undone, but not in an orphan's own calls
// (they would wait for themselves) nor past its context's end.
func TestUndosAfter(t *testing.T) {
	var u undos
	u.after(context.Background()) // none: returns at once
	id := u.add()
	u.after(context.WithValue(context.Background(), undoingKey{}, true)) // an orphan's call
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	u.after(ctx)
	if ctx.Err() == nil {
		t.Fatal("after returned before its context ended, one undo left")
	}
	returned := make(chan struct{})
	go func() {
		u.after(context.Background())
		close(returned)
	}()
	select {
	case <-returned:
		t.Fatal("after returned with one undo left")
	case <-time.After(20 * time.Millisecond):
	}
	if err := u.waitBefore(context.Background(), id); err != nil {
		t.Fatal(err) // an undo begun after: not waited for
	}
	u.done(id)
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("after did not return once none was left")
	}
}

// A detached call waits for the undos begun before it, not for its own
// orphan; one whose caller leaves during that wait is not made, and its
// orphan is told so (errUnsent), to release what was made ready for it.
func TestDetachedAfterUndos(t *testing.T) {
	var u undos
	earlier := u.add()
	made := make(chan struct{}, 2)
	call := func(context.Context) (int, error) { made <- struct{}{}; return 1, nil }
	orphaned := make(chan error, 2)
	orphan := func(_ context.Context, _ int, err error) { orphaned <- err }

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err := detached(ctx, &u, "call", time.Minute, call, orphan)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose caller left while an earlier undo ran: %v", err)
	}
	u.done(earlier)
	// Whichever of the call's wait and the caller saw the end first.
	select {
	case err := <-orphaned:
		if !errors.Is(err, errUnsent) {
			t.Fatalf("its orphan was told %v, want errUnsent", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("its orphan was not called")
	}
	if len(made) != 0 {
		t.Fatal("the call was made after its caller left")
	}
	u.wait()
	// Its own orphan is not waited for: a call whose caller left at once
	// is made, and undone.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := detached(ctx, &u, "call", time.Minute, call, orphan); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose caller had left: %v", err)
	}
	select {
	case err := <-orphaned:
		if err != nil && !errors.Is(err, errUnsent) {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call waited for its own orphan")
	}
}
