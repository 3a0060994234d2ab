// Package fifoio connects a process's standard streams through FIFOs the
// shim opens by path, as containerd's clients do, for the Go client's
// execs and the shim's in-sandbox ones.
package fifoio

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Dir is where a client makes a process's FIFOs, as containerd's clients
// do (its cio's default).
const Dir = "/run/containerd/fifo"

// IO is a process's standard streams through FIFOs the shim opens by
// path. containerd's cio opens each FIFO in the background through
// containerd/fifo, which reopens it as /proc/self/fd/N and, closing one
// not yet open (an exec refused, a Wait that failed), reopens it from the
// other side by that path to wake its own open, from two goroutines at
// once: the descriptor N can be closed by one and reused meanwhile for
// another exec's FIFO, which the other then opens and closes. That other
// exec's stdout reader saw a writer come and go, read EOF and closed; its
// shim then waited for a reader until the exec's deadline (one exec in
// about 70,000 with eight callers in one process, TestConcurrentAgents).
// Here no FIFO is reopened by a descriptor's path: the read ends are
// opened non-blocking before the exec (a FIFO's read end opens without a
// writer), so the shim's writes find them, and are read once the exec has
// started, when the process holds the write ends; stdin's write end is
// opened once the shim holds its read end, after the exec.
type IO struct {
	dir            string
	stdin          io.Reader
	stdout, stderr io.Writer
	// StdinPath, Stdout and Stderr are the FIFOs to give the shim; ""
	// for stdin without input and stderr with a terminal.
	StdinPath, Stdout, Stderr string
	outs                      [2]*os.File
	copies                    sync.WaitGroup
	closeOnce                 sync.Once
	stdinMu                   sync.Mutex
	stdinW                    *os.File
	stdinCancelled            bool
	stdinOpening              bool     // Start's open of stdin waits
	stdinWake                 *os.File // a reader that ended that wait
	releaseOnce               sync.Once
	released                  chan struct{} // closed once Release's wait and Close are done
}

// New makes the FIFOs of process id in a new directory below root
// (stdin only if stdin is not nil, stderr only without a terminal) and
// opens their read ends. Output nobody asked for (a nil writer) is
// discarded rather than left unread, which would fail the process's
// writes.
func New(root, id string, terminal bool, stdin io.Reader, stdout, stderr io.Writer) (_ *IO, retErr error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(root, "")
	if err != nil {
		return nil, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	s := &IO{dir: dir, stdin: stdin, stdout: stdout, stderr: stderr}
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	mk := func(name string) (string, error) {
		p := filepath.Join(dir, id+"-"+name)
		return p, syscall.Mkfifo(p, 0o700)
	}
	if stdin != nil {
		if s.StdinPath, err = mk("stdin"); err != nil {
			return nil, err
		}
	}
	names := [2]string{"stdout", "stderr"}
	paths := [2]*string{&s.Stdout, &s.Stderr}
	for i := range names {
		if i == 1 && terminal {
			continue
		}
		if *paths[i], err = mk(names[i]); err != nil {
			return nil, err
		}
		// Pollable (a FIFO), so its reads wait in the runtime's poller.
		if s.outs[i], err = os.OpenFile(*paths[i], os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Start copies the process's output, and its input if any, once the
// shim has started it; afterStdin is called once stdin is all written
// (the shim holds the FIFO open until told).
func (s *IO) Start(afterStdin func()) {
	ws := [2]io.Writer{s.stdout, s.stderr}
	for i, f := range s.outs {
		if f == nil {
			continue
		}
		s.copies.Add(1)
		go func() {
			defer s.copies.Done()
			_, _ = io.Copy(ws[i], f)
		}()
	}
	if s.StdinPath == "" {
		return
	}
	go func() {
		defer afterStdin()
		w, err := s.openStdin()
		if err != nil {
			return
		}
		_, _ = io.Copy(w, s.stdin)
		s.stdinMu.Lock()
		s.stdinW = nil
		s.stdinMu.Unlock()
		w.Close()
	}()
}

// openStdin opens the write end of the stdin FIFO once the shim holds its
// read end. runc-v2's shim opens it in the background (containerd/fifo)
// and may not have when the exec's Start returns; an open that does not
// wait then fails (ENXIO) and the process's input was closed before it
// was written (an interactive exec of the sandbox's task read nothing, 2
// in 300). So the open waits, and Cancel or Close ends the wait by opening
// a reader of their own.
func (s *IO) openStdin() (*os.File, error) {
	s.stdinMu.Lock()
	if s.stdinCancelled {
		s.stdinMu.Unlock()
		return nil, os.ErrClosed
	}
	s.stdinOpening = true
	s.stdinMu.Unlock()
	w, err := os.OpenFile(s.StdinPath, os.O_WRONLY, 0)
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	s.stdinOpening = false
	if s.stdinWake != nil {
		s.stdinWake.Close()
		s.stdinWake = nil
	}
	if err == nil && s.stdinCancelled {
		w.Close()
		err = os.ErrClosed
	}
	if err != nil {
		return nil, err
	}
	s.stdinW = w
	return w, nil
}

// wakeStdin ends openStdin's wait, under stdinMu: the reader it opens is
// closed once that open has returned.
func (s *IO) wakeStdin() {
	if s.stdinOpening && s.stdinWake == nil {
		s.stdinWake, _ = os.OpenFile(s.StdinPath, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	}
}

// Wait waits until the output has been read to its end: every writer of
// it (the process, and what it started) gone.
func (s *IO) Wait() { s.copies.Wait() }

// Release waits, at most as long as ctx, until the output has been read to
// its end, then releases the FIFOs (Close). If ctx ends first the wait goes
// on: a process left in the background may hold the output, and a later
// Release (once what held it is killed) ends with the same wait.
func (s *IO) Release(ctx context.Context) error {
	s.releaseOnce.Do(func() {
		s.released = make(chan struct{})
		go func() {
			s.Wait()
			s.Close()
			close(s.released)
		}()
	})
	select {
	case <-s.released:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cancel stops the copies: for a process that will not be waited for.
func (s *IO) Cancel() {
	for _, f := range s.outs {
		if f != nil {
			_ = f.SetReadDeadline(time.Unix(1, 0))
		}
	}
	s.stdinMu.Lock()
	s.stdinCancelled = true
	if s.stdinW != nil {
		_ = s.stdinW.SetWriteDeadline(time.Unix(1, 0))
	}
	s.wakeStdin()
	s.stdinMu.Unlock()
}

// Close releases the FIFOs: the read ends, and the directory.
func (s *IO) Close() {
	// A stdin open still waiting (the shim let go of its read end first)
	// gives up.
	s.stdinMu.Lock()
	s.stdinCancelled = true
	s.wakeStdin()
	s.stdinMu.Unlock()
	s.closeOnce.Do(func() {
		for _, f := range s.outs {
			if f != nil {
				f.Close()
			}
		}
		_ = os.RemoveAll(s.dir)
	})
}
