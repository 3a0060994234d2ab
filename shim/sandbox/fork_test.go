//go:build linux

package sandbox

import (
	"context"
	"testing"
	"time"
)

// TestAnswerCtx: the context of a call whose answer is needed outlives
// its caller's by the grace, keeps its values, and ends when done.
func TestAnswerCtx(t *testing.T) {
	type key struct{}
	caller, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	actx, done := answerCtx(caller, 50*time.Millisecond)
	defer done()
	if actx.Value(key{}) != "v" {
		t.Fatal("the caller's values are lost")
	}
	cancel()
	select {
	case <-actx.Done():
		t.Fatal("ended with its caller")
	case <-time.After(10 * time.Millisecond):
	}
	select {
	case <-actx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not ended after the grace")
	}
	actx2, done2 := answerCtx(context.Background(), time.Hour)
	done2()
	if actx2.Err() == nil {
		t.Fatal("not ended when done")
	}
}
