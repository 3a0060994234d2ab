//go:build linux

package sandbox

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/shim/ocirt"
)

// TestSocketProblem: what a memory fork refuses of a process's sockets,
// read from duplicates of its descriptors (this test's own), as the
// /proc/net tables said it before: a listener and a bound UDP port only
// where the branches share the network, a connection always, nothing of
// a unix socket or an unbound one.
func TestSocketProblem(t *testing.T) {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(pidfd)
	fdOf := func(c fileConn) int { return fdOf(t, c) }
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	conn, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	udp, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		udp, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
	}
	defer udp.Close()
	udpPort := udp.LocalAddr().(*net.UDPAddr).Port
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	unbound, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unbound)

	for _, c := range []struct {
		name      string
		fd        int
		sharedNet bool
		want      string
	}{
		{"listener, shared", fdOf(ln), true, "listens on TCP port " + strconv.Itoa(port) + ","},
		{"listener, isolated", fdOf(ln), false, ""},
		{"connection", fdOf(conn), false, "to port " + strconv.Itoa(port) + ", which cannot be copied"},
		{"udp, shared", fdOf(udp), true, "has a UDP socket bound to port " + strconv.Itoa(udpPort) + ","},
		{"udp, isolated", fdOf(udp), false, ""},
		{"unix", pair[0], true, ""},
		{"unbound tcp", unbound, true, ""},
	} {
		what, read := socketProblem(pidfd, c.fd, c.sharedNet, nil)
		if !read || (c.want == "") != (what == "") || !strings.Contains(what, c.want) {
			t.Errorf("%s: %q (read %v), want %q", c.name, what, read, c.want)
		}
	}
	if _, read := socketProblem(pidfd, 1<<20, true, nil); read {
		t.Error("a descriptor the process does not have was read")
	}
	// A family CRIU does not dump (the kernel's crypto API), where the
	// kernel has it.
	if alg, err := unix.Socket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0); err == nil {
		defer unix.Close(alg)
		if what, _ := socketProblem(pidfd, alg, false, nil); !strings.Contains(what, "address family 38") {
			t.Errorf("AF_ALG socket: %q; want refused naming its family", what)
		}
	}
}

// TestUnixScan: a datagram socket connected to a name no socket of the
// tree is bound to is outside; to one it is bound to, inside.
func TestUnixScan(t *testing.T) {
	dir := t.TempDir()
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(pidfd)
	server, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: dir + "/d", Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	client, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: dir + "/d", Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, withServer := range []bool{false, true} {
		u := &unixScan{tree: map[int]bool{os.Getpid(): true}, pid: os.Getpid(), bound: map[string]bool{}}
		if withServer {
			socketProblem(pidfd, fdOf(t, server), false, u)
		}
		socketProblem(pidfd, fdOf(t, client), false, u)
		if got := u.outside(); (len(got) == 1) == withServer || (len(got) == 1 && !strings.Contains(got[0], "connected to "+dir+"/d")) {
			t.Errorf("tree holding the server %v: outside %q", withServer, got)
		}
	}
}

func TestAnonProblem(t *testing.T) {
	for link, bad := range map[string]bool{
		"anon_inode:[eventfd]":     false,
		"anon_inode:[eventpoll]":   false,
		"anon_inode:inotify":       false,
		"anon_inode:[timerfd]":     false,
		"anon_inode:[pidfd]":       false,
		"anon_inode:[io_uring]":    true,
		"anon_inode:[userfaultfd]": true,
		"anon_inode:[perf_event]":  true,
		"/tmp/file":                false,
		"pipe:[1234]":              false,
	} {
		if got := anonProblem(link); (got != "") != bad {
			t.Errorf("anonProblem(%q) = %q; want refused %v", link, got, bad)
		}
	}
}

// fileConn is a connection or listener whose descriptor can be had.
type fileConn interface{ File() (*os.File, error) }

// fdOf is a duplicate of c's descriptor, closed when the test ends.
func fdOf(t *testing.T, c fileConn) int {
	t.Helper()
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// TestFileProblemGhosts: a deleted file is counted once however often it
// is open, one above the limit refused; a memfd, which reads as deleted
// too, is no ghost.
func TestFileProblemGhosts(t *testing.T) {
	dir := t.TempDir()
	open := func(name string, size int64) int {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f.Name()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	small, big := open("small", 3<<20), open("big", ocirt.GhostLimit+1)
	again, err := unix.Dup(small)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(again)
	mfd, err := unix.MemfdCreate("big", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, ocirt.GhostLimit+1); err != nil {
		t.Fatal(err)
	}
	ghosts := map[[2]uint64]int64{}
	check := func(fd int) string {
		p := fmt.Sprintf("/proc/self/fd/%d", fd)
		link, err := os.Readlink(p)
		if err != nil {
			t.Fatal(err)
		}
		return fileProblem(os.Getpid(), strconv.Itoa(fd), p, link, ghosts)
	}
	for _, fd := range []int{small, again, mfd} {
		if what := check(fd); what != "" {
			t.Errorf("descriptor %d: %q; want carried", fd, what)
		}
	}
	if what := check(big); !strings.Contains(what, "holds the deleted file "+filepath.Join(dir, "big")+" open") {
		t.Errorf("a deleted file above the limit: %q; want refused", what)
	}
	if len(ghosts) != 1 {
		t.Errorf("ghosts %v; want the small file once", ghosts)
	}
}
