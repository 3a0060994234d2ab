//go:build linux

package sandbox

import (
	"encoding/binary"
	"io"
	"net"

	"github.com/branchbox/branchbox/branch"
)

// ttrpcHeaderLength is the size of a ttrpc frame's header: the length of
// its message (big endian), the stream, the type and the flags.
const ttrpcHeaderLength = 10

// cappedConn is a branch socket's connection whose peer's frames may
// carry at most branch.SelfRequestMax bytes. ttrpc reads a message of up
// to 4 MiB whole before its handler runs, and keeps it while the call
// waits: before the cap, one connection sending 400 calls of 3 MB took
// the shim from 23 to 407 MB, kept after. A frame over the cap ends the
// connection at its header, before its message is read; the clients of
// the project check the size before they send (client/self.go).
type cappedConn struct {
	net.Conn
	hdr  [ttrpcHeaderLength]byte
	have int    // bytes of the current frame's header read
	left uint32 // bytes of the current frame's message not read yet
	over bool
}

func (c *cappedConn) Read(p []byte) (int, error) {
	if c.over {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(p)
	if c.scan(p[:n]) {
		// What came with it is dropped too: the peer broke the rules.
		c.over = true
		return 0, io.EOF
	}
	return n, err
}

// scan follows the frames through b, and says whether one is over the cap.
func (c *cappedConn) scan(b []byte) bool {
	for len(b) > 0 {
		if c.left > 0 {
			k := min(uint32(len(b)), c.left)
			c.left -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.have:], b)
		c.have += k
		b = b[k:]
		if c.have == ttrpcHeaderLength {
			c.have = 0
			c.left = binary.BigEndian.Uint32(c.hdr[:4])
			if c.left > branch.SelfRequestMax {
				return true
			}
		}
	}
	return false
}
