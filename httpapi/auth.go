//go:build linux

package httpapi

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// Tokens is the bearer token file: one token a line, followed by the
// namespaces it may reach (separated by spaces or commas; * for every
// one). Blank lines and lines starting with # are skipped:
//
//	# token                           namespaces
//	3f9c0d...e1                       agents
//	b41a77...0c                       *
//
// The file is read again whenever it changes (its inode, size or
// modification time), checked on each request: rotating a token is
// writing the file anew, with no restart and no signal.
type Tokens struct {
	path string

	mu    sync.Mutex
	stamp fileStamp
	// byHash maps the SHA-256 of a token to its namespaces: a lookup by
	// hash does not compare the secret itself byte by byte.
	byHash map[[32]byte][]string
	err    error
}

type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

// NewTokens reads the token file at path.
func NewTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if _, err := t.current(); err != nil {
		return nil, err
	}
	return t, nil
}

// current returns the table, read again if the file changed. A file that
// becomes unreadable or malformed keeps no token valid (and the error
// says why) rather than the old tokens: a rotation that went wrong must
// not leave a revoked token working.
func (t *Tokens) current() (map[[32]byte][]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		t.byHash, t.err, t.stamp = nil, fmt.Errorf("token file: %w", err), fileStamp{}
		return nil, t.err
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(s.Ino)
	}
	if st == t.stamp && (t.byHash != nil || t.err != nil) {
		return t.byHash, t.err
	}
	t.stamp = st
	t.byHash, t.err = readTokens(t.path)
	return t.byHash, t.err
}

func readTokens(path string) (map[[32]byte][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	out := map[[32]byte][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' || r == ',' })
		if len(fields) < 2 {
			return nil, fmt.Errorf("token file %s line %d: want TOKEN NAMESPACE..., got %d fields: %w", path, n, len(fields), errdefs.ErrInvalidArgument)
		}
		if len(fields[0]) < 16 {
			return nil, fmt.Errorf("token file %s line %d: a token of %d characters is too short to be a secret (16 at least; openssl rand -hex 32 makes one): %w", path, n, len(fields[0]), errdefs.ErrInvalidArgument)
		}
		out[sha256.Sum256([]byte(fields[0]))] = fields[1:]
	}
	return out, nil
}

// Namespaces returns what token may reach (* for any), or an
// Unauthenticated error.
func (t *Tokens) Namespaces(token string) ([]string, error) {
	table, err := t.current()
	if err != nil {
		return nil, fmt.Errorf("no token is valid now (%v): %w", err, errdefs.ErrUnauthenticated)
	}
	ns, ok := table[sha256.Sum256([]byte(token))]
	if !ok {
		return nil, fmt.Errorf("the bearer token is not in the server's token file (revoked or mistyped): %w", errdefs.ErrUnauthenticated)
	}
	return ns, nil
}

// Allowed reports whether a list of namespaces (nil: no restriction)
// holds ns.
func Allowed(list []string, ns string) bool {
	return list == nil || slices.Contains(list, "*") || slices.Contains(list, ns)
}
