//go:build linux

package daemons

import (
	"context"
	"errors"
	"net"
	"sync"

	"golang.org/x/time/rate"
)

// slowLink is a TCP proxy on a free 127.0.0.1 port that carries each
// direction of each connection at a bounded rate: a transfer through it
// takes long enough, on a fast host as under emulation, for a test to
// interrupt it in the middle. When the far end goes (a killed registry)
// the connections it carried are closed, as a broken link would.
type slowLink struct {
	l        net.Listener
	upstream string
	rate     int // bytes per second, each direction of each connection

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// linkChunk is the most one read moves, and the limiter's burst.
const linkChunk = 32 << 10

func newSlowLink(upstream string, bytesPerSecond int) (*slowLink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &slowLink{l: l, upstream: upstream, rate: bytesPerSecond, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Addr is the address clients dial.
func (s *slowLink) Addr() string { return s.l.Addr().String() }

func (s *slowLink) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", s.upstream)
		if err != nil {
			c.Close()
			continue
		}
		if !s.track(c, up) {
			return
		}
		s.wg.Add(2)
		go s.pipe(up, c)
		go s.pipe(c, up)
	}
}

// track records a connection pair, or closes it if the link is closed.
func (s *slowLink) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		if s.closed {
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
	}
	return !s.closed
}

// pipe copies src to dst at the link's rate; when either fails both are
// closed, which ends the other direction too.
func (s *slowLink) pipe(dst, src net.Conn) {
	defer s.wg.Done()
	defer s.forget(dst, src)
	lim := rate.NewLimiter(rate.Limit(s.rate), linkChunk)
	buf := make([]byte, linkChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if werr := lim.WaitN(context.Background(), n); werr != nil {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *slowLink) forget(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(s.conns, c)
	}
}

// Cut closes every connection it carries (what was in flight is lost, as
// when the far end's host goes down); new ones are still accepted.
func (s *slowLink) Cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the
// copies to end.
func (s *slowLink) Close() error {
	err := s.l.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
