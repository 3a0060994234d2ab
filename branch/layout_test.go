package branch

import (
	"testing"

	"github.com/containerd/errdefs"
)

func TestRootOfUpper(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/bs/snapshots/12/fs":     "/var/lib/bs",
		"/var/lib/bs/branches/12/3/fs":    "/var/lib/bs",
		"/var/lib/bs/snapshots/12/fs/":    "/var/lib/bs",
		"/var/lib/bs/snapshots/12/work":   "",
		"/etc":                            "",
		"/var/lib/bs/branches/12/3/other": "",
	} {
		got, err := RootOfUpper(in)
		if want == "" {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s: got %q %v, want invalid argument", in, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%s: got %q %v, want %q", in, got, err, want)
		}
	}
}
