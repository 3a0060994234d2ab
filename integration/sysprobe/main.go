//go:build linux

// Command sysprobe issues raw system calls and prints, for each, its name
// and the errno it failed with (0 when it succeeded), so that tests can
// compare what a seccomp filter lets through in two processes. Built
// static and put into the test image by the integration tests.
//
//	sysprobe keyctl add_key bpf getpid nr:462
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func probe(name string) (uintptr, error) {
	var e syscall.Errno
	switch name {
	case "getpid":
		_, _, e = unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
	case "getppid":
		_, _, e = unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	case "unshare-user":
		// EINVAL if let through: a Go process has several threads.
		_, _, e = unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)
	case "unshare-uts":
		_, _, e = unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUTS, 0, 0)
	case "keyctl":
		_, _, e = unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 0) // the session keyring
	case "add_key":
		typ, _ := unix.BytePtrFromString("user")
		desc, _ := unix.BytePtrFromString("sysprobe")
		_, _, e = unix.RawSyscall6(unix.SYS_ADD_KEY, uintptr(unsafe.Pointer(typ)), uintptr(unsafe.Pointer(desc)), 0, 0, uintptr(0xfffffffe), 0)
	case "request_key":
		_, _, e = unix.RawSyscall6(unix.SYS_REQUEST_KEY, 0, 0, 0, 0, 0, 0)
	case "bpf":
		_, _, e = unix.RawSyscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0)
	case "prctl-dumpable":
		_, _, e = unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE, 0, 0)
	case "prctl-nnp":
		_, _, e = unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_NO_NEW_PRIVS, 0, 0)
	case "setpriority-7":
		_, _, e = unix.RawSyscall(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, 0, 7)
	case "setpriority-12":
		_, _, e = unix.RawSyscall(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, 0, 12)
	case "personality-query":
		_, _, e = unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	case "personality-0":
		_, _, e = unix.RawSyscall(unix.SYS_PERSONALITY, 0, 0, 0)
	case "mount":
		_, _, e = unix.RawSyscall6(unix.SYS_MOUNT, 0, 0, 0, 0, 0, 0)
	case "ptrace":
		_, _, e = unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, 1, 0, 0, 0, 0)
	default:
		n, ok := strings.CutPrefix(name, "nr:")
		if !ok {
			return 0, fmt.Errorf("unknown probe %q", name)
		}
		nr, err := strconv.Atoi(n)
		if err != nil {
			return 0, err
		}
		_, _, e = unix.RawSyscall6(uintptr(nr), 0, 0, 0, 0, 0, 0)
	}
	return uintptr(e), nil
}

func main() {
	for _, name := range os.Args[1:] {
		e, err := probe(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Printf("%s %d\n", name, e)
	}
}
