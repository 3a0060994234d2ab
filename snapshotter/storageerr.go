//go:build linux

package snapshotter

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// storageErr words a failure of the snapshotter's own storage in the
// user's terms: a filesystem remounted read-only (as ext4 does after an
// error with errors=remount-ro) failed a fork, a commit or a checkpoint
// with "mkdir <root>/branches/2/3: read-only file system", a directory
// the user never named. The path is replaced by what it means, the
// snapshotter's root named, and the error is a failed precondition:
// nothing changes there until the filesystem is writable again (a repair
// and a remount, or a reboot). Other errors are returned as they are.
func (s *Branches) storageErr(err error) error {
	if err == nil || !errors.Is(err, unix.EROFS) {
		return err
	}
	what := fmt.Sprintf("the snapshotter's storage under %s is read-only (%v: its filesystem remounted read-only after an error?); nothing can change there until it is writable again", s.root, unix.EROFS)
	msg := err.Error()
	replaced := false
	for _, e := range pathErrors(err) {
		if strings.HasPrefix(e.path, s.root+"/") || e.path == s.root {
			msg = strings.Replace(msg, e.text, what, 1)
			replaced = true
		}
	}
	if !replaced {
		msg += ": " + what
	}
	// Said again in other words; the kind is all a client can use.
	return fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
}

// pathError is a part of an error's message that names a path.
type pathError struct {
	text, path string
}

// pathErrors lists the errors in err's tree that name a path, as they
// appear in its message.
func pathErrors(err error) []pathError {
	var out []pathError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
			return
		case *fs.PathError:
			out = append(out, pathError{e.Error(), e.Path})
		case *os.LinkError:
			out = append(out, pathError{e.Error(), e.Old})
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}
