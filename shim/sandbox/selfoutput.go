package sandbox

// The output of a process started through a branch socket is kept by the
// shim until the process is waited for: the end of each stream, up to
// selfOutputMax bytes. What a sandbox's processes write must not grow the
// shim (its memory is outside the sandbox's limits), so the output is
// kept in chunks: each stream has two of its own, and takes more from its
// sandbox's budget, up to selfOutputMax; once the budget is spent, a
// stream keeps what it holds and drops its oldest chunk for each new one.
// A process's output is thus never blocked and never unbounded: a sandbox
// holds at most selfExecMax x 2 streams x 2 chunks plus its budget.

import "sync"

const (
	// outputChunk is the unit output is kept in.
	outputChunk = 8 << 10
	// outputOwnChunks are the chunks each stream has whatever the budget
	// says: a process always keeps at least the last 8 KiB.
	outputOwnChunks = 2
	// selfOutputMax is how much of each stream is kept at most: its end.
	selfOutputMax = 1 << 20
	// selfOutputBudget is what one sandbox's streams may hold beyond their
	// own chunks.
	selfOutputBudget = 16 << 20
)

// outputBudget counts the chunks a sandbox's streams may still take.
type outputBudget struct {
	mu   sync.Mutex
	free int
}

func newOutputBudget() *outputBudget {
	return &outputBudget{free: selfOutputBudget / outputChunk}
}

func (b *outputBudget) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free == 0 {
		return false
	}
	b.free--
	return true
}

func (b *outputBudget) give(n int) {
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
}

// tailBuffer keeps the end of what is written to it, in chunks, all full
// but the last.
type tailBuffer struct {
	mu        sync.Mutex
	budget    *outputBudget
	chunks    [][]byte
	taken     int // chunks taken from the budget
	truncated bool
	released  bool
}

func newTailBuffer(b *outputBudget) *tailBuffer { return &tailBuffer{budget: b} }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if t.released {
		return n, nil // nobody will read it
	}
	for len(p) > 0 {
		last := len(t.chunks) - 1
		if last < 0 || len(t.chunks[last]) == outputChunk {
			switch {
			case len(t.chunks) < outputOwnChunks:
				t.chunks = append(t.chunks, make([]byte, 0, outputChunk))
			case len(t.chunks) < selfOutputMax/outputChunk && t.budget.take():
				t.taken++
				t.chunks = append(t.chunks, make([]byte, 0, outputChunk))
			default:
				// Full, or no budget left: the oldest chunk is reused.
				c := t.chunks[0][:0]
				copy(t.chunks, t.chunks[1:])
				t.chunks[len(t.chunks)-1] = c
				t.truncated = true
			}
			last = len(t.chunks) - 1
		}
		c := t.chunks[last]
		k := copy(c[len(c):outputChunk], p)
		t.chunks[last] = c[:len(c)+k]
		p = p[k:]
	}
	return n, nil
}

// bytes is what is kept, and whether anything was dropped.
func (t *tailBuffer) bytes() ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []byte
	for _, c := range t.chunks {
		out = append(out, c...)
	}
	return out, t.truncated
}

// release drops what is kept and gives its chunks back to the budget;
// what is written afterwards is dropped.
func (t *tailBuffer) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released {
		return
	}
	t.released = true
	t.budget.give(t.taken)
	t.chunks, t.taken = nil, 0
}
