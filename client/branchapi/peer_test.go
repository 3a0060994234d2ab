package branchapi

import (
	"net"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPeerGone: a connection whose other end closed reads as gone, without
// waiting; one whose other end is there (with or without data waiting for
// the client's reader, which the peek leaves) does not.
func TestPeerGone(t *testing.T) {
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(syscall.Conn)
	if peerGone(conn) {
		t.Fatal("an open connection reads as gone")
	}
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if peerGone(conn) {
		t.Fatal("a connection with data waiting reads as gone")
	}
	b := make([]byte, 1)
	if n, err := c.Read(b); n != 1 || err != nil {
		t.Fatalf("the peek took the data: %d %v", n, err)
	}
	s.Close()
	if !peerGone(conn) {
		t.Fatal("a connection its peer closed does not read as gone")
	}
	if peerGone(nil) {
		t.Fatal("no connection reads as gone")
	}
}
