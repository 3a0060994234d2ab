//go:build linux

package patterns

import (
	"strings"
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

// writeFileScript writes its arguments after the first, concatenated, to
// the file named by the first; the patterns use it to hand data (feedback,
// candidates) to a command in a branch, where only the branch's own
// processes can write. The data goes as arguments, not on stdin: a
// process's stdin reaches EOF only through a CloseIO that races the
// process's start, and a lost EOF would leave the writer waiting forever.
const writeFileScript = `printf %s "$@" > "$0"`

// argChunk stays under the kernel's limit on one argument (128 KiB).
const argChunk = 64 << 10

// writeFileArgs is the command that writes data to path. NUL bytes, which
// no argument can hold, are dropped.
func writeFileArgs(path string, data []byte) []string {
	args := []string{"sh", "-c", writeFileScript, path}
	d := strings.ReplaceAll(string(data), "\x00", "")
	for len(d) > 0 {
		n := min(len(d), argChunk)
		args = append(args, d[:n])
		d = d[n:]
	}
	return args
}

// parseWriteFileArgs undoes writeFileArgs (for tests).
func parseWriteFileArgs(args []string) (path, data string, ok bool) {
	if len(args) < 4 || args[0] != "sh" || args[1] != "-c" || args[2] != writeFileScript {
		return "", "", false
	}
	return args[3], strings.Join(args[4:], ""), true
}
