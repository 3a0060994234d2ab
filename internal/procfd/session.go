//go:build linux

package procfd

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Session is the session id of pid, as this process's PID namespace
// numbers it (/proc/PID/stat's sixth field).
func Session(pid int) (int, error) {
	st, err := ReadStat(pid)
	return st.Session, err
}

// SignalSession sends sig to those of pids that are in session sid and
// says how many it signalled. Each is signalled through a pidfd opened
// before its session is read: a pid that a new process took meanwhile
// is either read as that process (not of the session, which holds its
// id while one of its processes lives) or, if the old one is what the
// pidfd holds, signalled as the old one, never the new.
func SignalSession(pids []int, sid int, sig unix.Signal) (int, error) {
	n := 0
	var errs []error
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		s, err := Session(pid)
		if err == nil && s == sid {
			err = unix.PidfdSendSignal(fd, sig, nil, 0)
			if err == nil {
				n++
			} else if !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("signal process %d: %w", pid, err))
			}
		}
		unix.Close(fd)
	}
	return n, errors.Join(errs...)
}
