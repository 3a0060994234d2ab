//go:build linux

package sandbox

import (
	"sync"
	"testing"
	"time"
)

// TestLockWithin: a lock held too long is given up on, and the lock taken
// late is released, so that the mutex ends free.
func TestLockWithin(t *testing.T) {
	var mu sync.Mutex
	if !lockWithin(&mu, time.Second) {
		t.Fatal("a free mutex was not locked")
	}
	if lockWithin(&mu, 10*time.Millisecond) {
		t.Fatal("a held mutex was locked")
	}
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !mu.TryLock() {
		if time.Now().After(deadline) {
			t.Fatal("the lock a waiter gave up on stayed held")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStartsWait: a Pause waits for the process starts under way, and no
// longer than its deadline.
func TestStartsWait(t *testing.T) {
	var s starts
	if !s.wait(time.Now()) {
		t.Fatal("waited with no start under way")
	}
	s.add()
	s.add()
	if s.wait(time.Now().Add(10 * time.Millisecond)) {
		t.Fatal("a start under way was not waited for")
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		s.done()
		s.done()
	}()
	if !s.wait(time.Now().Add(5 * time.Second)) {
		t.Fatal("the starts' end was not seen")
	}
}
