//go:build linux

// Package cmdlog keeps what a branch's processes write to their standard
// output and error, when the task service runs them (a memory branch's
// restored processes, a command on the runtime), in a file of bounded
// size: the shim reads their output from a FIFO and writes it to the
// file, and once the file holds 2*max bytes its last max bytes are moved
// to its start, so it holds the last max to 2*max bytes written. The
// branch init does the same for the branches it runs (brinit.c, op log).
// A process writing is never blocked by the log: what cannot be written
// to the file (a full disk) is read and dropped.
package cmdlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// MaxSize is the max of a branch's log: it keeps the last 1 to 2 MiB.
const MaxSize = 1 << 20

// ReadSize is the most one read of the output adds to a log before it is
// cut (the branch init reads as much at once, brinit.c's log_buf): a log
// is at most 2*MaxSize+ReadSize bytes.
const ReadSize = 64 << 10

// Log is the copy of one branch's output into its file.
type Log struct {
	path string
	max  int64
	r    *os.File
	done chan struct{}
}

// FIFO starts a log at path fed by a FIFO made at fifo, for a writer that
// opens it by name (the task service, given it as a process's stdout).
// Until keep is called the log holds the FIFO open for writing itself, so
// that it does not end before that writer has opened it; after, it is
// complete when the last writer closes it.
func FIFO(ctx context.Context, fifo, path string, max int64) (l *Log, keep func(), err error) {
	// A new FIFO each time: a log still reading the one before (the
	// processes a rollback replaced) must not take this one's output.
	if err := os.Remove(fifo); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("output fifo: %w", err)
	}
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return nil, nil, fmt.Errorf("output fifo: %w", err)
	}
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("output fifo: %w", err)
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("output fifo: %w", err)
	}
	return start(ctx, path, max, r), func() { w.Close() }, nil
}

func start(ctx context.Context, path string, max int64, r *os.File) *Log {
	if max <= 0 {
		max = MaxSize
	}
	l := &Log{path: path, max: max, r: r, done: make(chan struct{})}
	go l.run(context.WithoutCancel(ctx))
	return l
}

// Done is closed once every writer has closed its end and what they
// wrote is in the log.
func (l *Log) Done() <-chan struct{} {
	return l.done
}

func (l *Log) run(ctx context.Context) {
	defer close(l.done)
	defer l.r.Close()
	f, size, err := l.open()
	buf := make([]byte, ReadSize)
	for err == nil {
		var n int
		if n, err = l.r.Read(buf); n > 0 {
			if _, werr := f.WriteAt(buf[:n], size); werr != nil {
				err = werr
				break
			}
			size += int64(n)
			if size >= 2*l.max {
				size, err = keepEnd(f, size, l.max, buf)
			}
		}
	}
	if f != nil {
		f.Close()
	}
	if err == io.EOF {
		return
	}
	// The file could not take it (a full disk): the writers go on, and
	// what they write goes nowhere.
	log.G(ctx).WithError(err).WithField("log", l.path).Warn("branch output log: dropping output from here on")
	_, _ = io.Copy(io.Discard, l.r)
}

// open opens the log's file, to go on at its end (a branch's processes
// restored again in the same bundle go on in the same log).
func (l *Log) open() (*os.File, int64, error) {
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// keepEnd moves the last max bytes of f, size bytes long, to its start
// and returns its new size.
func keepEnd(f *os.File, size, max int64, buf []byte) (int64, error) {
	from := size - max
	for to := int64(0); to < max; {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), max-to)], from+to)
		if n == 0 {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		if _, err := f.WriteAt(buf[:n], to); err != nil {
			return 0, err
		}
		to += int64(n)
	}
	return max, f.Truncate(max)
}
