//go:build linux

package sandbox

import (
	"context"
	"net"
	"sync"

	"github.com/containerd/ttrpc"
)

// sockConns counts the connections open on one branch socket. A memory
// dump of the branch must wait until there are none: a process holding
// one holds a socket connected to the shim, which CRIU cannot copy, and a
// caller that asked for a memory fork of its own branch closes its
// connection before it is dumped (selfcall.go).
type sockConns struct {
	mu      sync.Mutex
	open    int
	changed chan struct{} // closed and replaced on every change
}

func newSockConns() *sockConns { return &sockConns{changed: make(chan struct{})} }

func (s *sockConns) add(d int) {
	s.mu.Lock()
	s.open += d
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// count is the number open, and a channel closed at the next change.
func (s *sockConns) count() (int, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open, s.changed
}

// waitNone waits until no connection is open, or ctx ends; it returns how
// many were open last.
func (s *sockConns) waitNone(ctx context.Context) (int, error) {
	for {
		n, changed := s.count()
		if n == 0 {
			return 0, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
}

// countingHandshaker counts the connections its inner handshaker approved
// until each is closed (the ttrpc server closes a connection when its peer
// does). It wraps the handshaker, not the listener: ttrpc's credentials
// check needs the *net.UnixConn itself.
type countingHandshaker struct {
	inner ttrpc.Handshaker
	conns *sockConns
}

func (h countingHandshaker) Handshake(ctx context.Context, conn net.Conn) (net.Conn, interface{}, error) {
	approved, info, err := h.inner.Handshake(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	h.conns.add(1)
	return &countedConn{Conn: approved, conns: h.conns}, info, nil
}

type countedConn struct {
	net.Conn
	conns *sockConns
	once  sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.conns.add(-1) })
	return c.Conn.Close()
}
