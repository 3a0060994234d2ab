//go:build linux

package httpapi

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/internal/ops"
)

// The files of a branch are its processes' view, through its init's root
// (internal/ops): a sealed branch refuses writes, and no symlink a branch
// made leads out of it.

// root opens the root of the branch the path names.
func (s *Server) root(r request) (*ops.Root, string, error) {
	p, err := ops.CheckPath(r.URL.Query().Get("path"))
	if err != nil {
		return nil, "", err
	}
	sc, done, err := s.dial(r)
	if err != nil {
		return nil, "", err
	}
	defer done()
	root, err := ops.OpenRoot(r.Context(), s.cc, sc, r.PathValue("branch"))
	return root, p, err
}

func (s *Server) readFile(w http.ResponseWriter, r request) error {
	root, p, err := s.root(r)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := ops.OpenFile(root, p)
	if err != nil {
		return err
	}
	defer f.Close()
	var body io.Reader = io.LimitReader(f, f.Info.Size())
	size := f.Info.Size()
	if f.Pseudo || size == 0 {
		// A file of /proc or /sys says 0 or 4096 whatever it has: it
		// is read (to a bound) to know its length.
		data, err := f.ReadAll(maxPseudoFile)
		if err != nil {
			return err
		}
		body, size = bytes.NewReader(data), int64(len(data))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("X-File-Mode", fmt.Sprintf("%04o", f.Info.Mode().Perm()))
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, body, size)
	return nil
}

// maxPseudoFile bounds the read of a file whose size says 0.
const maxPseudoFile = 1 << 20

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
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			return fmt.Errorf("mode=%q: want octal permission bits such as 0755: %w", m, errdefs.ErrInvalidArgument)
		}
	}
	if r.ContentLength > s.cfg.MaxBody {
		return fmt.Errorf("a file of %d bytes is over this server's limit of %d (branchctl serve --max-body): %w", r.ContentLength, s.cfg.MaxBody, errdefs.ErrResourceExhausted)
	}
	root, p, err := s.root(r)
	if err != nil {
		return err
	}
	defer root.Close()
	n, err := ops.WriteFile(root, p, http.MaxBytesReader(w, r.Body, s.cfg.MaxBody), uint32(mode))
	if err != nil {
		return err
	}
	var doc writtenDoc
	doc.Written.Path, doc.Written.Size = p, n
	writeJSON(w, http.StatusOK, doc)
	return nil
}

type dirDoc struct {
	Path    string         `json:"path"`
	Entries []ops.DirEntry `json:"entries"`
}

// maxDirEntries bounds a listing's response.
const maxDirEntries = 10000

func (s *Server) listDir(w http.ResponseWriter, r request) error {
	root, p, err := s.root(r)
	if err != nil {
		return err
	}
	defer root.Close()
	entries, err := ops.ListDir(root, p, maxDirEntries)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, dirDoc{Path: p, Entries: entries})
	return nil
}
