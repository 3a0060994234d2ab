//go:build linux

package sandbox

import (
	"os"
	"testing"
)

// TestAnonymousBytes: the estimate of a process's memory image counts the
// anonymous memory it wrote (this test's own 32 MiB).
func TestAnonymousBytes(t *testing.T) {
	before := anonymousBytes(os.Getpid())
	buf := make([]byte, 32<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	after := anonymousBytes(os.Getpid())
	if after-before < 30<<20 {
		t.Fatalf("anonymous memory %d before and %d after writing 32 MiB", before, after)
	}
	if anonymousBytes(-1) != 0 {
		t.Fatal("a process that does not exist holds memory")
	}
	_ = buf[len(buf)-1]
}
