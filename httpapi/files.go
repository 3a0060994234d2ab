//go:build linux

package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

// Files of a branch are read and written through its init's root,
// /proc/PID/root, as the branch's own processes see them: its rootfs
// (sealed read-only while it has branches: writes then fail) and whatever
// is mounted in its mount namespace. Paths are resolved with openat2's
// RESOLVE_IN_ROOT, so that no symlink a branch made leads out of it.
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// branchRoot opens the root directory of a context: "0" is the sandbox's
// own (its task's init), any other id a branch's init. The pidfd taken
// first, and checked after, makes sure the root opened is that process's
// and not one of a process that reused its pid.
func (s *Server) branchRoot(r request) (*os.File, error) {
	id := r.PathValue("branch")
	pid, err := s.initPid(r, id)
	if err != nil {
		return nil, err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("context %s: its init %d is gone: %w", id, pid, errdefs.ErrFailedPrecondition)
	}
	defer unix.Close(pidfd)
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return nil, fmt.Errorf("context %s: open its root: %w", id, err)
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		root.Close()
		return nil, fmt.Errorf("context %s: its init %d ended: %w", id, pid, errdefs.ErrFailedPrecondition)
	}
	return root, nil
}

func (s *Server) initPid(r request, id string) (int, error) {
	sc, err := s.dial(r)
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	if id == branch.RootID || id == "" {
		c, err := s.cc.LoadContainer(r.ctx(), sc.ID)
		if err != nil {
			return 0, err
		}
		t, err := c.Task(r.ctx(), nil)
		if err != nil {
			return 0, fmt.Errorf("sandbox %s has no task: %w", sc.ID, err)
		}
		return int(t.Pid()), nil
	}
	nodes, err := sc.Tree(r.Context())
	if err != nil {
		return 0, err
	}
	for _, n := range nodes {
		if n.ID != id {
			continue
		}
		if n.State != branch.Live {
			if n.State == branch.Stale {
				return 0, &branch.StaleError{Branch: id, Winner: n.Winner}
			}
			return 0, fmt.Errorf("branch %s is %s: %w", id, n.State, errdefs.ErrFailedPrecondition)
		}
		if n.InitPid == 0 {
			return 0, fmt.Errorf("branch %s has no running init (status %q): %w", id, n.Status, errdefs.ErrFailedPrecondition)
		}
		return n.InitPid, nil
	}
	return 0, fmt.Errorf("no branch %s in sandbox %s: %w", id, sc.ID, errdefs.ErrNotFound)
}

// filePath reads the path query parameter: absolute, in the branch.
func filePath(r request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" || !path.IsAbs(p) {
		return "", fmt.Errorf("path=%q: give an absolute path in the branch: %w", p, errdefs.ErrInvalidArgument)
	}
	return path.Clean(p), nil
}

func openIn(root *os.File, p string, flags int, mode uint32) (*os.File, error) {
	for {
		fd, err := unix.Openat2(int(root.Fd()), p, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: inRoot})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return nil, fileErr(p, err)
		}
		return os.NewFile(uintptr(fd), p), nil
	}
}

// fileErr says what an errno on a branch's file means in errdefs' terms.
func fileErr(p string, err error) error {
	var kind error
	hint := ""
	switch {
	case errors.Is(err, unix.ENOENT):
		kind = errdefs.ErrNotFound
	case errors.Is(err, unix.EROFS):
		kind, hint = errdefs.ErrFailedPrecondition, " (a context is read-only while it has live branches: write in a branch, or commit or abort them)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		kind = errdefs.ErrPermissionDenied
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENAMETOOLONG):
		kind = errdefs.ErrInvalidArgument
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		kind = errdefs.ErrResourceExhausted
	default:
		return fmt.Errorf("%s: %w", p, err)
	}
	return fmt.Errorf("%s: %v%s: %w", p, err, hint, kind)
}

func (s *Server) readFile(w http.ResponseWriter, r request) error {
	p, err := filePath(r)
	if err != nil {
		return err
	}
	root, err := s.branchRoot(r)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := openIn(root, p, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s); list a directory with GET .../dir: %w", p, fi.Mode().Type(), errdefs.ErrInvalidArgument)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.Header().Set("X-File-Mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, f, fi.Size())
	return nil
}

type writtenDoc struct {
	Written struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	} `json:"written"`
}

// writeFile replaces a file's content with the request's body (at most
// MaxBody bytes), creating it with mode (default 0644) if it does not
// exist. Its directory must exist.
func (s *Server) writeFile(w http.ResponseWriter, r request) error {
	p, err := filePath(r)
	if err != nil {
		return err
	}
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			return fmt.Errorf("mode=%q: want octal permission bits such as 0755: %w", m, errdefs.ErrInvalidArgument)
		}
	}
	if r.ContentLength > s.cfg.MaxBody {
		return fmt.Errorf("a file of %d bytes is over this server's limit of %d (branchctl serve --max-body): %w", r.ContentLength, s.cfg.MaxBody, errdefs.ErrResourceExhausted)
	}
	root, err := s.branchRoot(r)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := openIn(root, p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, uint32(mode))
	if err != nil {
		return err
	}
	n, err := io.Copy(f, http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return fileErr(p, err)
	}
	var doc writtenDoc
	doc.Written.Path, doc.Written.Size = p, n
	writeJSON(w, http.StatusOK, doc)
	return nil
}

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name string `json:"name"`
	// Type: file, dir, symlink, or other.
	Type     string    `json:"type"`
	Size     int64     `json:"size"`
	Mode     string    `json:"mode"`
	Modified time.Time `json:"modified"`
	Target   string    `json:"target,omitempty"`
}

type dirDoc struct {
	Path    string     `json:"path"`
	Entries []DirEntry `json:"entries"`
}

// maxDirEntries bounds a listing's response.
const maxDirEntries = 10000

func (s *Server) listDir(w http.ResponseWriter, r request) error {
	p, err := filePath(r)
	if err != nil {
		return err
	}
	root, err := s.branchRoot(r)
	if err != nil {
		return err
	}
	defer root.Close()
	d, err := openIn(root, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(maxDirEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fileErr(p, err)
	}
	if len(names) > maxDirEntries {
		return fmt.Errorf("%s has more than %d entries; list it with exec (ls) instead: %w", p, maxDirEntries, errdefs.ErrResourceExhausted)
	}
	sort.Strings(names)
	doc := dirDoc{Path: p, Entries: []DirEntry{}}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(int(d.Fd()), n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone since it was listed
		}
		e := DirEntry{Name: n, Size: st.Size, Mode: fmt.Sprintf("%04o", st.Mode&0o7777), Modified: time.Unix(st.Mtim.Unix()).UTC()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			e.Type = "file"
		case unix.S_IFDIR:
			e.Type = "dir"
		case unix.S_IFLNK:
			e.Type = "symlink"
			buf := make([]byte, unix.PathMax)
			if k, err := unix.Readlinkat(int(d.Fd()), n, buf); err == nil {
				e.Target = string(buf[:k])
			}
		default:
			e.Type = "other"
		}
		doc.Entries = append(doc.Entries, e)
	}
	writeJSON(w, http.StatusOK, doc)
	return nil
}
