//go:build linux

package sandbox

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// A unix socket of the tree connected to a socket outside it (the host's,
// another container's, through a bind mount: docker.sock, /dev/log) cannot
// be dumped: CRIU fails the dump after stopping the processes ("External
// socket is used", "Unix socket ... without peer"), and one peer could not
// talk to N copies anyway. unixScan finds them among the tree's sockets.
type unixScan struct {
	tree  map[int]bool
	pid   int             // the process whose descriptors are read
	bound map[string]bool // names the tree's unix sockets are bound to
	dgram []dgramPeer     // the tree's connected datagram sockets
}

// dgramPeer is a connected datagram socket: its holder, its descriptor
// and the name of the socket it sends to.
type dgramPeer struct {
	pid, fd int
	peer    string
}

// check reads the unix socket s (a duplicate of descriptor fd of u.pid):
// its name, and, if connected, its peer. A stream or seqpacket socket's
// peer is the process that connected (or made the pair), as the kernel
// recorded it (SO_PEERCRED): one that ended since is not known to be
// outside, and left to CRIU. A datagram socket's peer is only a name,
// judged once every socket of the tree is read (outside).
func (u *unixScan) check(s, fd int) string {
	if u == nil {
		return ""
	}
	if sa, err := unix.Getsockname(s); err == nil {
		if un, ok := sa.(*unix.SockaddrUnix); ok && un.Name != "" {
			u.bound[un.Name] = true
		}
	}
	typ, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return ""
	}
	if typ == unix.SOCK_DGRAM {
		if sa, err := unix.Getpeername(s); err == nil {
			if un, ok := sa.(*unix.SockaddrUnix); ok && un.Name != "" {
				u.dgram = append(u.dgram, dgramPeer{pid: u.pid, fd: fd, peer: un.Name})
			}
		}
		return ""
	}
	if typ != unix.SOCK_STREAM && typ != unix.SOCK_SEQPACKET {
		return ""
	}
	cred, err := unix.GetsockoptUcred(s, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil || cred.Pid <= 0 {
		return "" // not connected
	}
	peer := int(cred.Pid)
	if u.tree[peer] || !alive(peer) || descends(peer, u.tree) {
		return ""
	}
	return fmt.Sprintf("has a unix socket connected to process %d (%s) outside its process tree (the host's, or another container's, through a bind mount), which a copy could not share", peer, comm(peer))
}

// outside names the connected datagram sockets whose peer is no socket of
// the tree's.
func (u *unixScan) outside() []string {
	var out []string
	for _, d := range u.dgram {
		if !u.bound[d.peer] {
			out = append(out, fmt.Sprintf("process %d (%s) has a unix datagram socket (descriptor %d) connected to %s, a socket outside its process tree (the host's, or another container's, through a bind mount), which a copy could not share", d.pid, comm(d.pid), d.fd, d.peer))
		}
	}
	return out
}
