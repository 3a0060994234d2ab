//go:build linux

package overlay

import (
	"testing"

	"github.com/moby/sys/mountinfo"
)

func TestUpperIs(t *testing.T) {
	for _, tc := range []struct {
		opts, upper string
		want        bool
	}{
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/2/fs,workdir=/r/s/2/work", "/r/s/2/fs", true},
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/2/fs,workdir=/r/s/2/work", "/r/s/1/fs", false},
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/22/fs", "/r/s/2/fs", false},
		{"rw,lowerdir=/r/s/1/fs,upperdir=/r/s/2/fs/", "/r/s/2/fs", true},
		// containerd's compacted form: only the lowers are relative.
		{"rw,upperdir=/r/s/2/fs,workdir=/r/s/2/work,lowerdir=1/fs:3/fs", "/r/s/2/fs", true},
		// A relative upper is no one's: it would match other roots' too.
		{"rw,upperdir=2/fs,workdir=2/work", "/r/s/2/fs", false},
		// A space, a comma and a backslash in the path, as mountinfo
		// escapes them; an escape that is not one stays.
		{`rw,upperdir=/tmp/a\040b\054c\134d/2/fs`, `/tmp/a b,c\d/2/fs`, true},
		{`rw,upperdir=/tmp/a\040b/2/fs`, `/tmp/a\040b/2/fs`, false},
		{`rw,upperdir=/tmp/a\9b/fs`, `/tmp/a\9b/fs`, true},
		{"ro,lowerdir=/r/s/1/fs", "/r/s/1/fs", false},
	} {
		if got := UpperIs(&mountinfo.Info{VFSOptions: tc.opts}, tc.upper); got != tc.want {
			t.Errorf("UpperIs(%q, %q) = %v, want %v", tc.opts, tc.upper, got, tc.want)
		}
	}
}
