package sandbox

import (
	"bytes"
	"testing"
)

// pattern is n bytes that differ from chunk to chunk, so a wrong tail
// shows.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/outputChunk)
	}
	return b
}

// TestTailBuffer: a stream keeps the exact end of what was written, up to
// selfOutputMax; once its sandbox's budget is spent it keeps only what it
// holds (at least its own chunks), and release gives the budget back.
func TestTailBuffer(t *testing.T) {
	budget := newOutputBudget()
	full := budget.free

	b := newTailBuffer(budget)
	_, _ = b.Write([]byte("abc"))
	if got, trunc := b.bytes(); string(got) != "abc" || trunc {
		t.Fatalf("short output %q truncated %v", got, trunc)
	}
	b.release()

	// Written in odd pieces, more than the maximum: the end is kept.
	data := pattern(3*selfOutputMax + 12345)
	b = newTailBuffer(budget)
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 5000)
		_, _ = b.Write(rest[:n])
		rest = rest[n:]
	}
	got, trunc := b.bytes()
	if !trunc || len(got) > selfOutputMax || len(got) < selfOutputMax-outputChunk || !bytes.HasSuffix(data, got) {
		t.Fatalf("kept %d bytes (truncated %v), want the last %d or a chunk less", len(got), trunc, selfOutputMax)
	}
	if used := full - budget.free; used != selfOutputMax/outputChunk-outputOwnChunks {
		t.Fatalf("one full stream took %d chunks of the budget", used)
	}
	b.release()
	if budget.free != full {
		t.Fatalf("budget %d after release, want %d", budget.free, full)
	}
	if _, err := b.Write(data[:100]); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.bytes(); len(got) != 0 {
		t.Fatalf("a released stream kept %d bytes", len(got))
	}

	// Many streams: together they never take more than the budget, and
	// each still keeps its own chunks' worth of its end.
	var bs []*tailBuffer
	for i := 0; i < 2*selfOutputBudget/selfOutputMax; i++ {
		b := newTailBuffer(budget)
		_, _ = b.Write(data)
		bs = append(bs, b)
	}
	if budget.free != 0 {
		t.Fatalf("budget %d left after %d full streams", budget.free, len(bs))
	}
	for _, b := range bs {
		got, _ := b.bytes()
		if len(got) < (outputOwnChunks-1)*outputChunk || !bytes.HasSuffix(data, got) {
			t.Fatalf("a stream over budget kept %d bytes, not the end", len(got))
		}
		b.release()
	}
	if budget.free != full {
		t.Fatalf("budget %d after all releases, want %d", budget.free, full)
	}
}
