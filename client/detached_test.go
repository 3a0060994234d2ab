//go:build linux

package client

import (
	"context"
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
