//go:build linux

package ops

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// WriteFile replaces a file's content with what r gives, creating it with
// mode if it does not exist. Its directory must exist.
//
// A regular file is replaced whole: the content goes to a new file in its
// directory, renamed over it once all of it is there, with the old file's
// owner and mode (not its extended attributes). A reader sees the old content or the new, never part of
// it, and an upload cut short (a client gone, a body over the bound, a
// full disk) leaves the file as it was; a process that holds the old file
// open goes on reading the old content. A file with other hard links, a
// symlink at the path, and the kernel's pseudo files are written in place,
// as an open of the path would.
func WriteFile(root *Root, p string, r io.Reader, mode uint32) (int64, error) {
	whole, old, err := replaceable(root, p)
	if err != nil {
		return 0, err
	}
	if !whole {
		return writeInPlace(root, p, r, mode)
	}
	return replace(root, p, old, r, mode)
}

// replaceable says whether the file at p is written by replace: there is
// none (old is nil), or it is a regular file with one link on a
// filesystem that stores what is written.
func replaceable(root *Root, p string) (bool, *unix.Stat_t, error) {
	f, err := openIn(root.dir, p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false, nil, fileErr(p, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 && !pseudoFS(int(f.Fd())), &st, nil
}

// replace writes r into a new file in p's directory and renames it over
// p; old, if not nil, is the file there, whose owner and mode it takes;
// else the new file has mode.
func replace(root *Root, p string, old *unix.Stat_t, r io.Reader, mode uint32) (int64, error) {
	dir, err := openIn(root.dir, path.Dir(p), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	defer dir.Close()
	t, err := newTemp(dir, p, mode)
	if err != nil {
		return 0, err
	}
	defer t.discard()
	n, err := io.Copy(t.f, r)
	switch {
	case err != nil:
	case old != nil:
		// Owner first: a chown clears the set-id bits a chmod then sets.
		if err = t.f.Chown(int(old.Uid), int(old.Gid)); err == nil {
			err = t.f.Chmod(os.FileMode(old.Mode&0o777) | setIDBits(old.Mode))
		}
	default:
		err = root.own(t.f)
	}
	if err != nil {
		return n, osFileErr(p, err)
	}
	if err := t.publish(path.Base(p)); err != nil {
		return n, fileErr(p, err)
	}
	return n, nil
}

// setIDBits are mode's set-user-ID, set-group-ID and sticky bits as Go
// names them.
func setIDBits(mode uint32) os.FileMode {
	var m os.FileMode
	if mode&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

// temp is the file a replace writes: unnamed (O_TMPFILE) until it is
// complete where the filesystem can, else under a name of its own.
type temp struct {
	dir  *os.File
	f    *os.File
	name string // its name in dir, once it has one
	done bool   // renamed over the file
}

// newTemp makes the temp file in dir for p (its name in errors).
func newTemp(dir *os.File, p string, mode uint32) (*temp, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, mode)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) {
		// No O_TMPFILE here (EISDIR: a kernel that does not know it).
		return namedTemp(dir, p, mode)
	}
	if err != nil {
		return nil, fileErr(p, err)
	}
	return &temp{dir: dir, f: os.NewFile(uintptr(fd), p)}, nil
}

// namedTemp is newTemp's file under a name of its own.
func namedTemp(dir *os.File, p string, mode uint32) (*temp, error) {
	name := tempName()
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, fileErr(p, err)
	}
	return &temp{dir: dir, f: os.NewFile(uintptr(fd), p), name: name}, nil
}

// tempName is a name for a temp file no branch would pick.
func tempName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return ".bbx-put-" + hex.EncodeToString(b[:])
}

// publish renames the temp file over base, giving it a name first if it
// has none.
func (t *temp) publish(base string) error {
	if t.name == "" {
		name := tempName()
		err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", t.f.Fd()), int(t.dir.Fd()), name, unix.AT_SYMLINK_FOLLOW)
		if err != nil {
			return err
		}
		t.name = name
	}
	if err := unix.Renameat(int(t.dir.Fd()), t.name, int(t.dir.Fd()), base); err != nil {
		return err
	}
	t.done = true
	return nil
}

// discard closes the temp file and, unless it was renamed over the file,
// removes its name.
func (t *temp) discard() {
	t.f.Close()
	if t.name != "" && !t.done {
		_ = unix.Unlinkat(int(t.dir.Fd()), t.name, 0)
	}
}

// writeInPlace writes r into the file at p, emptied first, or creates it
// with mode.
func writeInPlace(root *Root, p string, r io.Reader, mode uint32) (int64, error) {
	f, err := openRegular(root, p, unix.O_WRONLY, "")
	if errors.Is(err, errdefs.ErrNotFound) {
		f, err = createIn(root, p, mode)
	}
	if err != nil {
		return 0, err
	}
	if !f.Pseudo {
		// Emptied only now, a regular file (not a fifo or a device a
		// branch made); a pseudo file takes the write as it is.
		if err := f.Truncate(0); err != nil {
			f.Close()
			return 0, osFileErr(p, err)
		}
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var errno unix.Errno
	if errors.As(err, &errno) && f.Pseudo {
		return n, pseudoErr(p, errno, "refuses this content")
	}
	return n, osFileErr(p, err)
}

// createIn makes the file at p, which was not there, with mode; or opens
// what a branch made there meanwhile, if it is a regular file.
func createIn(root *Root, p string, mode uint32) (*File, error) {
	// Without O_TRUNC and without blocking: what is there by now may be
	// a fifo or a device.
	f, err := openIn(root.dir, p, unix.O_WRONLY|unix.O_CREAT|unix.O_NONBLOCK, mode)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		err = osFileErr(p, err)
	} else if !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file (%s): %w", p, fi.Mode().Type(), errdefs.ErrInvalidArgument)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &File{File: f, Info: fi, Pseudo: pseudoFS(int(f.Fd())), path: p}, nil
}
