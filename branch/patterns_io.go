//go:build linux

package branch

import (
	"sync"
	"unicode/utf8"
)

// tailBuffer keeps the last max bytes written to it; safe for the two
// goroutines that copy a process's stdout and stderr.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// multiWriter copies each write to every buffer.
type multiWriter []*tailBuffer

func (m multiWriter) Write(p []byte) (int, error) {
	for _, w := range m {
		_, _ = w.Write(p)
	}
	return len(p), nil
}

// tail returns at most the last n bytes of s, cut at a rune boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}

// writeFileScript writes its stdin to the file named by its first
// argument; the patterns use it to hand data (feedback, candidates) to a
// command in a branch, where only the branch's own processes can write.
const writeFileScript = `cat > "$0"`

func writeFileArgs(path string) []string { return []string{"sh", "-c", writeFileScript, path} }
