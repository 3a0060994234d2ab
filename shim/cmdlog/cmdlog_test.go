//go:build linux

package cmdlog

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// stream is what a chatty process writes: numbered lines, so that a
// kept part shows where it came from.
func stream(lines int) []byte {
	var b bytes.Buffer
	for i := range lines {
		fmt.Fprintf(&b, "line %07d of the command's output\n", i)
	}
	return b.Bytes()
}

func waitDone(t *testing.T, l *Log) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the log did not end after its writers closed")
	}
}

// started starts a log at path with its FIFO in dir, and opens the FIFO
// for writing as the task service would (by name).
func started(t *testing.T, dir, path string, max int64) (*Log, *os.File) {
	t.Helper()
	fifo := filepath.Join(dir, "output")
	l, keep, err := FIFO(context.Background(), fifo, path, max)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	keep()
	return l, w
}

// logTo starts a log in a new directory, writes out through its FIFO as
// the task service would (its own open of the FIFO, by name), and
// returns what the log holds once complete.
func logTo(t *testing.T, dir string, max int64, out []byte) []byte {
	t.Helper()
	path := filepath.Join(dir, "init.log")
	l, w := started(t, dir, path, max)
	if _, err := w.Write(out); err != nil {
		t.Fatal(err)
	}
	w.Close()
	waitDone(t, l)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestLogKeepsTheEndWithinTheBound(t *testing.T) {
	const max = 64 << 10
	out := stream(20000) // about 11 times max
	got := logTo(t, t.TempDir(), max, out)
	if len(got) < max || len(got) >= 2*max {
		t.Fatalf("the log holds %d bytes, not between %d and %d", len(got), max, 2*max)
	}
	if !bytes.HasSuffix(out, got) {
		t.Fatalf("the log is not the end of the output: it starts %q", got[:80])
	}
}

func TestLogGoesOnAtItsEnd(t *testing.T) {
	dir := t.TempDir()
	// A log already there (processes restored again in the same bundle)
	// is continued, through a new FIFO.
	if got := string(logTo(t, dir, MaxSize, []byte("before\n"))); got != "before\n" {
		t.Fatalf("log %q", got)
	}
	if got := string(logTo(t, dir, MaxSize, []byte("after\n"))); got != "before\nafter\n" {
		t.Fatalf("log %q", got)
	}
}

func TestLogWaitsForItsWriter(t *testing.T) {
	dir := t.TempDir()
	l, keep, err := FIFO(context.Background(), filepath.Join(dir, "output"), filepath.Join(dir, "init.log"), MaxSize)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		t.Fatal("the log ended before its writer opened the fifo")
	case <-time.After(50 * time.Millisecond):
	}
	keep() // the writer never came: the log ends
	waitDone(t, l)
}

func TestUnwritableLogDoesNotBlockTheWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "init.log")
	if err := os.Mkdir(path, 0o700); err != nil { // not a file it can open
		t.Fatal(err)
	}
	l, w := started(t, dir, path, MaxSize)
	done := make(chan error, 1)
	go func() {
		_, err := w.Write(make([]byte, 4<<20)) // far beyond a pipe's buffer
		w.Close()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer is blocked by a log that cannot be written")
	}
	waitDone(t, l)
}
