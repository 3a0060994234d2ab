//go:build linux

package sandbox

import (
	"context"
	"io"
	"net"
	"sync"

	"github.com/containerd/log"
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

// selfConnMax bounds the connections open at once to the branch sockets
// of one sandbox. Each costs the shim about 15 KB (ttrpc's goroutines and
// buffers), outside the sandbox's limits: before the bound, a process in a
// sandbox opened 5,206 in a second, which took the shim from 24 to 102 MB,
// kept after they closed. A self exec that waits for its process holds
// one, and at most selfExecMax processes wait.
const selfConnMax = 2 * selfExecMax

// selfCallsMax bounds the calls in flight at once through the branch
// sockets of one sandbox: each holds its request (up to
// branch.SelfRequestMax) and a goroutine in the shim while it waits, for
// the call rate or for a process to exit, and ttrpc takes any number on
// one connection. A self exec that waits holds one.
const selfCallsMax = 128

// connBudget counts the connections open to a sandbox's branch sockets,
// and the calls in flight through them.
type connBudget struct {
	mu      sync.Mutex
	open    int
	refused bool // since the count was last below the maximum
	calls   int
}

// takeCall counts one more call in flight, or says it is one too many.
func (b *connBudget) takeCall() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.calls >= selfCallsMax {
		return false
	}
	b.calls++
	return true
}

func (b *connBudget) giveCall() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls--
}

// take counts one more connection, or says it is one too many (and
// whether it is the first refused since the count was below the maximum,
// so that a flood is logged once).
func (b *connBudget) take() (ok, first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open >= selfConnMax {
		first = !b.refused
		b.refused = true
		return false, first
	}
	b.open++
	return true, false
}

func (b *connBudget) give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open--
	b.refused = false
}

// countingHandshaker counts the connections its inner handshaker approved
// until each is closed (the ttrpc server closes a connection when its peer
// does), and refuses those past the sandbox's budget. It wraps the
// handshaker, not the listener: ttrpc's credentials check needs the
// *net.UnixConn itself.
type countingHandshaker struct {
	inner   ttrpc.Handshaker
	conns   *sockConns
	budget  *connBudget
	sandbox string
}

func (h countingHandshaker) Handshake(ctx context.Context, conn net.Conn) (net.Conn, interface{}, error) {
	approved, info, err := h.inner.Handshake(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	if ok, first := h.budget.take(); !ok {
		if first {
			log.G(ctx).WithField("sandbox", h.sandbox).Warnf("sandbox has %d connections open to its branch sockets, its maximum: closing new ones until some close", selfConnMax)
		}
		// Hung up at once, and handed to ttrpc as a connection that
		// ended: a handshake error, or a read of a closed connection,
		// would have ttrpc log an error for each one of a flood.
		_ = approved.Close()
		return refusedConn{approved}, info, nil
	}
	h.conns.add(1)
	return &countedConn{Conn: &cappedConn{Conn: approved}, conns: h.conns, budget: h.budget}, info, nil
}

type countedConn struct {
	net.Conn
	conns  *sockConns
	budget *connBudget
	once   sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.conns.add(-1)
		c.budget.give()
	})
	return c.Conn.Close()
}

// refusedConn is a connection closed past the budget: ttrpc reads its end.
type refusedConn struct{ net.Conn }

func (refusedConn) Read([]byte) (int, error) { return 0, io.EOF }
