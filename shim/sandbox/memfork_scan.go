//go:build linux

package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/procfd"
	"github.com/branchbox/branchbox/shim/ocirt"
)

// unforkable lists what a memory fork of tree, the process tree of
// initPid, could not carry, each naming the process and the resource: a
// process of the branch's own (own) outside the tree, a TCP connection or a bound
// port (the branches share the parent's network namespace, where the
// parent holds them), a terminal or another device than the harmless
// ones, an anonymous inode CRIU cannot dump (an io_uring instance, say),
// a unix socket connected outside the tree, a deleted file too large to
// carry. CRIU refuses more; its errors are passed on as they come. The
// same walk of the descriptors finds the file locks the tree holds
// (sharedLocks judges them).
func unforkable(initPid int, tree map[int]bool, own []int, sharedNet bool) (out []string, ghostBytes int64, locks []heldLock) {
	ghosts := map[[2]uint64]int64{} // by device and inode: one file open twice is one ghost
	for _, pid := range own {
		// One that ended since the listing, or that a process of the
		// tree forked since it was read, is no stranger.
		if !tree[pid] && alive(pid) && !descends(pid, tree) {
			out = append(out, fmt.Sprintf("process %d (%s) was exec'd into it rather than started by its init, and a memory fork carries only the init's process tree (end it first)", pid, comm(pid)))
		}
	}
	var socks map[string]string // the /proc/net tables, read only if needed
	u := &unixScan{tree: tree, bound: map[string]bool{}}
	for pid := range tree {
		u.pid = pid
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		pidfd := -1
		for _, fd := range fds {
			p := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
			link, err := os.Readlink(p)
			if err != nil {
				continue
			}
			if ino, ok := strings.CutPrefix(link, "socket:["); ok {
				if pidfd == -1 {
					if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
						pidfd = -2
					}
				}
				what, read := "", false
				if n, err := strconv.Atoi(fd.Name()); err == nil && pidfd >= 0 {
					what, read = socketProblem(pidfd, n, sharedNet, u)
				}
				if !read {
					if socks == nil {
						socks = inetSockets(initPid, sharedNet)
					}
					what = socks[strings.TrimSuffix(ino, "]")]
				}
				if what != "" {
					out = append(out, fmt.Sprintf("process %d (%s) %s", pid, comm(pid), what))
				}
				continue
			}
			if l, ok := lockOf(pid, fd.Name(), link); ok {
				locks = append(locks, l)
			}
			if what := fileProblem(pid, fd.Name(), p, link, ghosts); what != "" {
				out = append(out, what)
			}
		}
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}
	out = append(out, u.outside()...)
	for _, size := range ghosts {
		ghostBytes += size
	}
	return out, ghostBytes, locks
}

// fileProblem says what a restored copy could not have of the descriptor
// fd of process pid, a file (p is its /proc path, link what it links to):
// an anonymous inode CRIU cannot dump, a terminal, a device, a deleted
// file larger than CRIU is let carry. A deleted file it can carry is
// added to ghosts: CRIU copies its content into the image (a "ghost
// file").
func fileProblem(pid int, fd, p, link string, ghosts map[[2]uint64]int64) string {
	if what := anonProblem(link); what != "" {
		return fmt.Sprintf("process %d (%s) holds %s (descriptor %s, %s), which CRIU cannot dump", pid, comm(pid), what, fd, link)
	}
	name, deleted := strings.CutSuffix(link, " (deleted)")
	// A memfd reads as deleted too; CRIU dumps it as a memfd, no ghost.
	deleted = deleted && !strings.HasPrefix(link, "/memfd:")
	if !deleted && !strings.HasPrefix(link, "/dev/") {
		return "" // a stat of every descriptor costs a many-file process
	}
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return ""
	}
	if deleted && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 0 {
		if st.Size > ocirt.GhostLimit {
			return fmt.Sprintf("process %d (%s) holds the deleted file %s open (descriptor %s), of %s, and a memory fork carries deleted files of at most %s", pid, comm(pid), name, fd, branch.Bytes(st.Size), branch.Bytes(ocirt.GhostLimit))
		}
		ghosts[[2]uint64{st.Dev, st.Ino}] = st.Size
		return ""
	}
	if !strings.HasPrefix(link, "/dev/") || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return ""
	}
	switch link {
	case "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom":
		return ""
	}
	if strings.HasPrefix(link, "/dev/pts/") || link == "/dev/console" || link == "/dev/tty" {
		return fmt.Sprintf("process %d (%s) holds the terminal %s open (descriptor %s), whose other end is outside the sandbox", pid, comm(pid), link, fd)
	}
	return fmt.Sprintf("process %d (%s) holds the device %s open (descriptor %s)", pid, comm(pid), link, fd)
}

// anonProblem names the kernel object behind a descriptor's link
// (/proc/PID/fd/N) if it is an anonymous inode CRIU cannot dump, "" if it
// can or the link is no anonymous inode. CRIU dumps those of its
// criu/files.c (eventfd, epoll, inotify, fanotify, signalfd, timerfd,
// pidfd; bpf maps only when built with libbpf, which ours is not) and
// fails the dump on any other after stopping the processes: an io_uring
// instance, whose descriptor the kernel will not pass to CRIU's parasite
// ("Can't retrieve FDs from socket"), a userfaultfd, a perf event, a KVM
// VM.
func anonProblem(link string) string {
	kind, ok := strings.CutPrefix(link, "anon_inode:")
	if !ok {
		return ""
	}
	switch kind {
	case "[eventfd]", "[eventpoll]", "inotify", "[fanotify]", "[signalfd]", "[timerfd]", "[pidfd]":
		return ""
	case "[io_uring]":
		return "an io_uring instance"
	}
	return "a kernel object of its own kind"
}

// socketProblem says what of socket fd of the process of pidfd a
// restored copy could not have, as inetSockets does, from a duplicate of
// the descriptor (pidfd_getfd): reading /proc/PID/net/tcp walks the
// kernel's whole TCP hash table, sized by the node's memory, about 3.4 ms
// for each of tcp and tcp6 on a 24 GiB node, whatever the sandbox holds.
// read is false where the duplicate or its options could not be had.
func socketProblem(pidfd, fd int, sharedNet bool, u *unixScan) (what string, read bool) {
	s, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return "", false
	}
	defer unix.Close(s)
	domain, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return "", false
	}
	switch domain {
	case unix.AF_UNIX:
		return u.check(s, fd), true
	case unix.AF_INET, unix.AF_INET6:
	case unix.AF_PACKET, unix.AF_NETLINK:
		return "", true
	default:
		// CRIU dumps these five families only (criu/sockets.c), and
		// fails the dump on another after stopping the processes.
		return fmt.Sprintf("has a socket of address family %d (descriptor %d: vsock, AF_ALG, Bluetooth, ...), which CRIU cannot dump", domain, fd), true
	}
	proto, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return "", false
	}
	local := sockPort(unix.Getsockname(s))
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_MPTCP: // Go listens with MPTCP by default
		info, err := unix.GetsockoptTCPInfo(s, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return "", false
		}
		switch info.State {
		case tcpListen:
			if !sharedNet {
				return "", true // bound again in the branch's own namespace
			}
			return fmt.Sprintf("listens on TCP port %d, which its branches could not bind beside it in the network namespace they share", local), true
		case tcpClose:
			return "", true
		}
		return fmt.Sprintf("has a TCP connection from port %d to port %d, which cannot be copied", local, sockPort(unix.Getpeername(s))), true
	case unix.IPPROTO_UDP:
		if local == 0 || !sharedNet {
			return "", true
		}
		return fmt.Sprintf("has a UDP socket bound to port %d, which its branches could not bind beside it in the network namespace they share", local), true
	}
	return "", true
}

// The TCP states of the kernel's tcp_states.h that the checks tell apart.
const (
	tcpClose  = 7
	tcpListen = 10
)

// sockPort is the port of a socket address (0 for none).
func sockPort(sa unix.Sockaddr, err error) int {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return 0
}

// descends says whether pid is a descendant of a process of tree, from
// the parent pids in /proc.
func descends(pid int, tree map[int]bool) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		st, err := procfd.ReadStat(pid)
		if err != nil {
			return false
		}
		if pid = st.PPid; tree[pid] {
			return true
		}
	}
	return false
}

// inetSockets maps the inode of each TCP and UDP socket of pid's network
// namespace that a restored copy could not have to why: a listener or a
// bound UDP port (the copy could not bind it beside the parent's), or a
// connection (one peer cannot talk to N copies).
func inetSockets(pid int, sharedNet bool) map[string]string {
	out := map[string]string{}
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		s.Scan() // the header
		for s.Scan() {
			fs := strings.Fields(s.Text())
			if len(fs) < 10 {
				continue
			}
			local, remote, state, ino := fs[1], fs[2], fs[3], fs[9]
			port := hexPort(local)
			switch {
			case strings.HasPrefix(proto, "tcp") && state == "0A":
				if !sharedNet {
					continue // bound again in the branch's own namespace
				}
				out[ino] = fmt.Sprintf("listens on TCP port %d, which its branches could not bind beside it in the network namespace they share", port)
			case strings.HasPrefix(proto, "tcp") && state != "07":
				out[ino] = fmt.Sprintf("has a TCP connection from port %d to port %d, which cannot be copied", port, hexPort(remote))
			case strings.HasPrefix(proto, "udp") && port != 0:
				if !sharedNet {
					continue
				}
				out[ino] = fmt.Sprintf("has a UDP socket bound to port %d, which its branches could not bind beside it in the network namespace they share", port)
			}
		}
		f.Close()
	}
	return out
}

// hexPort is the port of a /proc/net address ("0100007F:1F90").
func hexPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseUint(p, 16, 16)
	return int(n)
}

// comm is a process's command name, for messages.
func comm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// nestedNamespaces names the processes of tree in a namespace of their own
// below the init's that CRIU cannot dump: it dumps nested mount and network
// namespaces, and fails on a nested user, PID, IPC, UTS, cgroup or time
// namespace ("Can't dump nested user namespace") after stopping the
// processes. unshare, bubblewrap and a browser's own sandbox make them.
func nestedNamespaces(initPid int, tree map[int]bool) []string {
	kinds := []string{"user", "pid", "ipc", "uts", "cgroup", "time"}
	ino := func(pid int, kind string) uint64 {
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st) != nil {
			return 0
		}
		return st.Ino
	}
	root := make([]uint64, len(kinds))
	for i, k := range kinds {
		root[i] = ino(initPid, k)
	}
	var out []string
	for pid := range tree {
		if pid == initPid {
			continue
		}
		for i, k := range kinds {
			if n := ino(pid, k); n != 0 && root[i] != 0 && n != root[i] {
				out = append(out, fmt.Sprintf("process %d (%s) is in a %s namespace of its own, below the sandbox's (unshare, bubblewrap or a browser's sandbox makes one), which CRIU cannot dump", pid, comm(pid), k))
				break
			}
		}
	}
	sort.Strings(out)
	return out
}
