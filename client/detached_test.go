//go:build linux

package client

import (
	"sync"
	"testing"
	"time"
)

// undos' count may go up while wait waits, and wait returns once it is
// zero (a WaitGroup panics when an Add races a Wait it is waking).
func TestUndos(t *testing.T) {
	var u undos
	u.wait() // none: returns at once
	u.add()
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
			u.add()
			u.done()
		}()
	}
	wg.Wait()
	select {
	case <-waited:
		t.Fatal("wait returned with one undo left")
	case <-time.After(50 * time.Millisecond):
	}
	u.done()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return once none was left")
	}
}
