package ops

import (
	"context"
	"testing"
	"time"
)

// lateTimer is a context past its deadline whose timer has not fired yet.
type lateTimer struct{ context.Context }

func (lateTimer) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

func TestEnded(t *testing.T) {
	if Ended(context.Background()) {
		t.Fatal("a context with no deadline ended")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	if Ended(ctx) {
		t.Fatal("a context an hour from its deadline ended")
	}
	cancel()
	if !Ended(ctx) {
		t.Fatal("a cancelled context did not end")
	}
	if !Ended(lateTimer{context.Background()}) {
		t.Fatal("a context past its deadline did not end before its timer fired")
	}
}
