//go:build linux

package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// TestActionable: a tool error names its kind and the next call.
func TestActionable(t *testing.T) {
	for _, c := range []struct {
		err        error
		kind, next string
	}{
		{&branch.StaleError{Branch: "2", Winner: "1"}, "stale", "call fork"},
		{fmt.Errorf("no branch 9: %w", errdefs.ErrNotFound), "not-found", "call tree"},
		{fmt.Errorf("/a: read-only file system: %w", errdefs.ErrFailedPrecondition), "failed-precondition", "write in a branch"},
		{fmt.Errorf("too many: %w", errdefs.ErrResourceExhausted), "resource-exhausted", "abort branches"},
		{fmt.Errorf("other: %w", errdefs.ErrPermissionDenied), "permission-denied", "scoped"},
	} {
		got := actionable(c.err).Error()
		if !strings.Contains(got, "kind "+c.kind) || !strings.Contains(got, c.next) {
			t.Errorf("%v: %q, want kind %s and %q", c.err, got, c.kind, c.next)
		}
	}
	if actionable(nil) != nil {
		t.Error("actionable(nil) is not nil")
	}
}

func TestCapped(t *testing.T) {
	c := &capped{max: 5}
	for _, s := range []string{"ab", "cd", "ef", "gh"} {
		if n, err := c.Write([]byte(s)); n != 2 || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	if c.String() != "abcde" || !c.truncated || c.Len() != 8 {
		t.Fatalf("%q %v %d", c.String(), c.truncated, c.Len())
	}
}

// slowProcess is a process whose Wait ends when exit is closed, or with
// its context.
type slowProcess struct{ exit chan struct{} }

func (p slowProcess) Wait(ctx context.Context) (client.ExitStatus, error) {
	select {
	case <-p.exit:
		return client.ExitStatus{Code: 7}, nil
	case <-ctx.Done():
		return client.ExitStatus{}, ctx.Err()
	}
}
func (slowProcess) Kill(context.Context, uint32) error    { return nil }
func (slowProcess) KillAll(context.Context, uint32) error { return nil }

// TestWaitReporting: a wait with progress reports how long the command has
// run, every ProgressEvery and increasing, until it ends; without a
// progress it is the process's Wait.
func TestWaitReporting(t *testing.T) {
	s := &Server{cfg: Config{ProgressEvery: 10 * time.Millisecond}}
	p := slowProcess{exit: make(chan struct{})}
	var mu sync.Mutex
	var seen []time.Duration
	report := func(_ context.Context, running time.Duration, output int) {
		mu.Lock()
		defer mu.Unlock()
		if output != 42 {
			t.Errorf("output %d, want 42", output)
		}
		if seen = append(seen, running); len(seen) == 3 {
			close(p.exit)
		}
	}
	st, err := s.waitReporting(context.Background(), p, report, func() int { return 42 })
	if err != nil || st.Code != 7 {
		t.Fatalf("wait: %v %v", st, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 3 || seen[0] < 10*time.Millisecond || seen[1] <= seen[0] || seen[2] <= seen[1] {
		t.Fatalf("reports %v", seen)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.waitReporting(ctx, slowProcess{exit: make(chan struct{})}, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait without progress past its context: %v", err)
	}
}
