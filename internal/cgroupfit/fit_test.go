//go:build linux

package cgroupfit

import (
	"math"
	"testing"
)

func TestAbove(t *testing.T) {
	for _, c := range []struct {
		q1, p1, q2, p2 int64
		want           bool
	}{
		{100000, 100000, 50000, 100000, true},
		{50000, 100000, 100000, 100000, false},
		{50000, 100000, 25000, 50000, false}, // equal shares
		{200000, 100000, 1000000, 1000000, true},
		{math.MaxInt64, 1000000, math.MaxInt64 - 1, 1000000, true}, // no overflow
		{1000, 0, 1000, 100000, false},
	} {
		if got := above(c.q1, c.p1, c.q2, c.p2); got != c.want {
			t.Errorf("above(%d/%d, %d/%d) = %v; want %v", c.q1, c.p1, c.q2, c.p2, got, c.want)
		}
	}
}
