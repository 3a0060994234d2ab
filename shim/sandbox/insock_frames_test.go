//go:build linux

package sandbox

import (
	"encoding/binary"
	"testing"

	"github.com/branchbox/branchbox/branch"
)

// TestCappedConnScan follows ttrpc frames however the reads cut them, and
// finds the one whose header announces more than a branch socket takes.
func TestCappedConnScan(t *testing.T) {
	frame := func(n uint32) []byte {
		b := make([]byte, ttrpcHeaderLength+int(min(n, 64)))
		binary.BigEndian.PutUint32(b, n)
		return b
	}
	var stream []byte
	for _, n := range []uint32{0, 1, 17, 64} {
		stream = append(stream, frame(n)...)
	}
	for _, cut := range []int{1, 3, 10, 11, 1000} {
		c := &cappedConn{}
		for b := stream; len(b) > 0; {
			k := min(cut, len(b))
			if c.scan(b[:k]) {
				t.Fatalf("cut %d: frames within the cap taken for over it", cut)
			}
			b = b[k:]
		}
		if c.have != 0 || c.left != 0 {
			t.Fatalf("cut %d: stream ends mid-frame: have %d, left %d", cut, c.have, c.left)
		}
	}
	// A frame of exactly the cap passes (its header, and the start of its
	// message); one over it does not, wherever its header is cut.
	at := &cappedConn{}
	hdr := make([]byte, ttrpcHeaderLength)
	binary.BigEndian.PutUint32(hdr, branch.SelfRequestMax)
	if at.scan(hdr) || at.left != branch.SelfRequestMax {
		t.Fatalf("a frame of the cap: over or lost (left %d)", at.left)
	}
	binary.BigEndian.PutUint32(hdr, branch.SelfRequestMax+1)
	for _, cut := range []int{1, 4, 9} {
		c := &cappedConn{}
		if c.scan(hdr[:cut]) || !c.scan(hdr[cut:]) {
			t.Fatalf("header cut at %d: a frame over the cap not found", cut)
		}
	}
}
