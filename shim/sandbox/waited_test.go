//go:build linux

package sandbox

import (
	"strconv"
	"testing"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// An exec's Wait answer, kept once its exec is forgotten, is given to
// one later Wait of it, and the answers kept stay bounded.
func TestWaitedKept(t *testing.T) {
	sb := &Sandbox{}
	if sb.takeWaited("1", "e1") != nil {
		t.Fatal("an answer for an exec never waited for")
	}
	sb.keepWaited("1", "e1", &shimv1.WaitResponse{ExitStatus: 137})
	if r := sb.takeWaited("2", "e1"); r != nil {
		t.Fatalf("another branch's exec of the same id got %v", r)
	}
	if r := sb.takeWaited("1", "e1"); r == nil || r.ExitStatus != 137 {
		t.Fatalf("the kept answer: %v", r)
	}
	if sb.takeWaited("1", "e1") != nil {
		t.Fatal("an answer given twice")
	}
	for i := range maxEnded + 10 {
		sb.keepWaited("1", strconv.Itoa(i), &shimv1.WaitResponse{})
	}
	if n := len(sb.waited); n > maxEnded {
		t.Fatalf("%d answers kept, bound %d", n, maxEnded)
	}
}
