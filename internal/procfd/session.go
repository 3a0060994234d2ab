//go:build linux

package procfd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Session is the session id of pid, as this process's PID namespace
// numbers it (/proc/PID/stat's sixth field).
func Session(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseSession(b)
}

// parseSession reads the session of a /proc/PID/stat line: the command
// in parentheses may hold spaces and parentheses, so the fields are
// counted from the last ')'.
func parseSession(b []byte) (int, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command in %q", b)
	}
	// After the command: state, ppid, pgrp, session.
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return 0, fmt.Errorf("short stat line %q", b)
	}
	return strconv.Atoi(string(f[3]))
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
