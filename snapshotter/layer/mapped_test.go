//go:build linux

package layer

import "testing"

func TestUpperIs(t *testing.T) {
	for _, tc := range []struct {
		opts, upper string
		want        bool
	}{
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/2/fs,workdir=/r/s/2/work", "/r/s/2/fs", true},
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/2/fs,workdir=/r/s/2/work", "/r/s/1/fs", false},
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/22/fs", "/r/s/2/fs", false},
		// containerd's compacted form: relative to the layers' common parent.
		{"rw,lowerdir=1/fs:3/fs,upperdir=2/fs,workdir=2/work", "/r/s/2/fs", true},
		{"rw,lowerdir=1/fs,upperdir=12/fs", "/r/s/2/fs", false},
		// A space and a comma in the path, as mountinfo escapes them.
		{`rw,upperdir=/tmp/a\040b\054c/2/fs`, "/tmp/a b,c/2/fs", true},
		{"ro,lowerdir=/r/s/1/fs", "/r/s/1/fs", false},
	} {
		if got := upperIs(tc.opts, tc.upper); got != tc.want {
			t.Errorf("upperIs(%q, %q) = %v, want %v", tc.opts, tc.upper, got, tc.want)
		}
	}
}
