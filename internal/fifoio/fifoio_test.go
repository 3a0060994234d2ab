package fifoio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shimWrites does what the shim does with an exec's output FIFOs: opens
// each for writing, without waiting for a reader (it must be there),
// and writes what the process would.
func shimWrites(paths [2]string, data string) error {
	for i, p := range paths {
		if p == "" {
			continue
		}
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s for writing: %w", p, err)
		}
		_, err = unix.Write(fd, []byte(data+strconv.Itoa(i)))
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// TestStdioReadersBeforeExec: the output FIFOs have their readers before
// the exec is asked for, so the shim's writes find them at once, and what
// the process writes (before the copies start, or after) is read whole;
// the FIFOs' directory goes at the end.
func TestStdioReadersBeforeExec(t *testing.T) {
	root := t.TempDir()
	var out, errOut bytes.Buffer
	s, err := New(root, "p1", false, nil, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if err := shimWrites([2]string{s.Stdout, s.Stderr}, "early"); err != nil {
		t.Fatal(err)
	}
	s.Start(func() { t.Error("stdin closed without stdin") })
	s.Wait()
	s.Close()
	if out.String() != "early0" || errOut.String() != "early1" {
		t.Fatalf("read %q and %q, want early0 and early1", out.String(), errOut.String())
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("left %v", entries)
	}
}

// TestStdioStdin: the input is written once the shim holds the FIFO's
// read end (after the exec), then the shim is told it ended.
func TestStdioStdin(t *testing.T) {
	s, err := New(t.TempDir(), "p2", false, strings.NewReader("input"), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The shim's read end, opened as the exec starts the process.
	r, err := os.OpenFile(s.StdinPath, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := shimWrites([2]string{s.Stdout, s.Stderr}, ""); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	s.Start(func() { close(ended) })
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("stdin's end was not told")
	}
	b, err := io.ReadAll(r)
	if err != nil || string(b) != "input" {
		t.Fatalf("the shim read %q (%v)", b, err)
	}
	s.Wait()
}

// TestStdioStdinReaderLate: runc-v2's shim opens the stdin FIFO's read
// end in the background and may not have when the exec's Start returns;
// the input is written once it has (an open that did not wait failed and
// closed the process's input before any was written), and Close ends a
// wait for a reader that never comes.
func TestStdioStdinReaderLate(t *testing.T) {
	s, err := New(t.TempDir(), "p3", false, strings.NewReader("late"), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := shimWrites([2]string{s.Stdout, s.Stderr}, ""); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	s.Start(func() { close(ended) })
	time.Sleep(50 * time.Millisecond) // the shim's open, late
	opened := make(chan *os.File, 1)
	go func() {
		// Waits for a writer, as a read of the shim's would find its
		// end without one.
		r, err := os.OpenFile(s.StdinPath, os.O_RDONLY, 0)
		if err != nil {
			t.Error(err)
		}
		opened <- r
	}()
	var r *os.File
	select {
	case r = <-opened:
	case <-time.After(10 * time.Second):
		// No writer came: wake the open, and fail.
		if w, err := os.OpenFile(s.StdinPath, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		(<-opened).Close()
		t.Fatal("no writer of stdin came once its reader was there: the input was given up")
	}
	defer r.Close()
	<-ended
	if b, err := io.ReadAll(r); err != nil || string(b) != "late" {
		t.Fatalf("the shim read %q (%v)", b, err)
	}
	s.Wait()

	never, err := New(t.TempDir(), "p4", false, strings.NewReader("never read"), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan struct{})
	never.Start(func() { close(gaveUp) })
	time.Sleep(20 * time.Millisecond)
	never.Close()
	select {
	case <-gaveUp:
	case <-time.After(10 * time.Second):
		t.Fatal("Close left stdin's open waiting for a reader")
	}
}

// TestStdioConcurrentRefusals: one process making execs from several
// goroutines, some refused (their FIFOs released unopened) while others
// start. With containerd's cio, releasing an unopened FIFO reopened it
// from the other side by /proc/self/fd/N from two goroutines, N being
// closed by one and reused meanwhile for another exec's FIFO, which the
// other opened and closed: that exec's stdout reader saw a writer come and
// go, read EOF and closed, and its shim waited for a reader until the
// exec's deadline (here, the shim's open found no reader: about once in
// 30 s of this loop). BRANCHBOX_STDIO_SECONDS sets how long it runs
// (default 3).
func TestStdioConcurrentRefusals(t *testing.T) {
	secs := 3
	if s, err := strconv.Atoi(os.Getenv("BRANCHBOX_STDIO_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	root := t.TempDir()
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var (
		wg               sync.WaitGroup
		started, refused atomic.Int64
		failMu           sync.Mutex
		failures         []error
		fail             = func(err error) { failMu.Lock(); failures = append(failures, err); failMu.Unlock() }
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				var out, errOut bytes.Buffer
				id := fmt.Sprintf("w%d-%d", w, i)
				s, err := New(root, id, false, nil, &out, &errOut)
				if err != nil {
					fail(err)
					return
				}
				if (w+i)%4 != 0 {
					// Refused: the shim never opens them.
					s.Cancel()
					s.Close()
					refused.Add(1)
					continue
				}
				// The exec's round trip to the shim.
				time.Sleep(2 * time.Millisecond)
				if err := shimWrites([2]string{s.Stdout, s.Stderr}, id); err != nil {
					fail(err)
				}
				s.Start(func() {})
				s.Wait()
				s.Close()
				if out.String() != id+"0" || errOut.String() != id+"1" {
					fail(fmt.Errorf("%s read %q and %q", id, out.String(), errOut.String()))
				}
				started.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d started, %d refused", started.Load(), refused.Load())
	if err := errors.Join(failures...); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("left %d FIFO directories", len(entries))
	}
}

// TestRelease: while a writer holds the output, Release ends with its
// context and the wait goes on; once the writer is gone a later Release
// returns, the output read whole and the FIFOs' directory gone.
func TestRelease(t *testing.T) {
	root := t.TempDir()
	var out bytes.Buffer
	s, err := New(root, "p1", true, nil, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A background process of the exec, holding stdout open.
	fd, err := unix.Open(s.Stdout, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.Start(func() {})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Release(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release with the output held: %v", err)
	}
	if _, err := unix.Write(fd, []byte("late")); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out.String() != "late" {
		t.Fatalf("read %q, want late", out.String())
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("left in %s: %v", root, entries)
	}
}
