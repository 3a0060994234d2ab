//go:build linux

package procfd

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// Stat is what the project reads of /proc/PID/stat.
type Stat struct {
	State   byte   // R, S, D, Z, X...
	PPid    int    // the parent, as this process's PID namespace numbers it
	Session int    // the session id, likewise
	Flags   uint64 // the kernel's PF_* flags
}

// Exiting is the kernel's PF_EXITING: the process is on its way out (it
// has let go of its namespaces, and turns zombie next).
const Exiting = 0x4

// ReadStat reads pid's /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return parseStat(b)
}

// parseStat reads a /proc/PID/stat line. The command in parentheses may
// hold spaces and parentheses (a process names itself as it likes, ") R 1"
// included), so the fields are counted from the last ')'.
func parseStat(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("no command in %q", b)
	}
	// After the command: state, ppid, pgrp, session, tty, tpgid, flags.
	f := bytes.Fields(b[i+1:])
	if len(f) < 7 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("short stat line %q", b)
	}
	st := Stat{State: f[0][0]}
	var err error
	if st.PPid, err = strconv.Atoi(string(f[1])); err != nil {
		return Stat{}, fmt.Errorf("stat line %q: %w", b, err)
	}
	if st.Session, err = strconv.Atoi(string(f[3])); err != nil {
		return Stat{}, fmt.Errorf("stat line %q: %w", b, err)
	}
	if st.Flags, err = strconv.ParseUint(string(f[6]), 10, 64); err != nil {
		return Stat{}, fmt.Errorf("stat line %q: %w", b, err)
	}
	return st, nil
}
