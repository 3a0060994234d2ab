//go:build linux

package shim

import (
	"context"
	"os"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/procfd"
)

// drainMax bounds how long a process's exit waits for its output to be
// read: a client that does not read, or a child of the process that keeps
// its output open, delays the exit only so long.
const drainMax = 2 * time.Second

// copyGrace is how long the copy of a process's output may stay open with
// nothing unread after the exit before a child is taken to hold it: the
// copy's last write after the exit is what the wait is for.
const copyGrace = 200 * time.Millisecond

// awaitDrained returns once what the exited process id/execID wrote to its
// stdout and stderr FIFOs has been read by the client, or after drainMax.
//
// A client's Wait returns at the exit, and the client then deletes the
// process. containerd's client closes its ends of the FIFOs in Delete
// before it waits for their copies, so output still in a FIFO is lost:
// ctr 2.2 and nerdctl delete at once, and under load printed nothing for a
// process that wrote (containerd/containerd#13931, #14120). Holding the
// exit until the FIFOs are empty makes that safe for every client: the
// task service's copy of the process's output has ended (it closes its
// writer then) and the client has read what the copy wrote.
func (s *taskService) awaitDrained(ctx context.Context, id, execID string) {
	st, err := s.TTRPCTaskService.State(ctx, &taskAPI.StateRequest{ID: id, ExecID: execID})
	if err != nil {
		return
	}
	var (
		paths []string
		fifos []procfd.File
	)
	for _, p := range []string{st.Stdout, st.Stderr} {
		var fs unix.Stat_t
		if p != "" && unix.Stat(p, &fs) == nil && fs.Mode&unix.S_IFMT == unix.S_IFIFO {
			paths, fifos = append(paths, p), append(fifos, procfd.File{Dev: fs.Dev, Ino: fs.Ino})
		}
	}
	if len(fifos) == 0 {
		return
	}
	start, empty := time.Now(), time.Time{}
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 5*time.Millisecond) {
		copying, unread := state(paths, fifos)
		switch {
		case !copying && unread == 0:
			if took := time.Since(start); took > time.Millisecond {
				log.G(ctx).WithFields(log.Fields{"id": id, "exec": execID, "took": took}).Debug("exit held until its output was read")
			}
			return
		case unread > 0:
			empty = time.Time{}
		case empty.IsZero():
			empty = time.Now()
		case time.Since(empty) > copyGrace:
			// Read, and the copy still open with nothing to write: a
			// child of the process holds its output (a daemon started
			// with &), which may be for as long as it lives.
			return
		}
		if time.Since(start) > drainMax || ctx.Err() != nil {
			log.G(ctx).WithFields(log.Fields{"id": id, "exec": execID}).Warn("exit reported with output not yet read by the client")
			return
		}
		time.Sleep(wait)
	}
}

// state says whether this process still holds one of fifos for writing
// (the task service's copy of the output, which closes it once the
// process's output ends) and how many bytes they hold unread. The writer
// is looked at first: once it is closed nothing more comes, so nothing
// unread then means all was read.
func state(paths []string, fifos []procfd.File) (copying bool, unread int) {
	copying = procfd.HoldsForWriting(os.Getpid(), fifos)
	for _, p := range paths {
		unread += unreadIn(p)
	}
	return copying, unread
}

// unreadIn is the number of bytes in FIFO path that no reader has read yet.
// Opening it to read, without blocking, neither waits for a writer nor
// takes anything out of it.
func unreadIn(path string) int {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return 0
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0
	}
	return n
}
