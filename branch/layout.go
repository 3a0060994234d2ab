package branch

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// The snapshotter's on-disk layout, as far as a peer holding an upper
// directory (the shim, branchctl push) needs it: lexical, no I/O, so that
// the shim does not link the snapshotter to find it.

// AddressFile, inside the snapshotter's root, holds the unix socket path the
// daemon serves on, so that whoever holds an upper directory (a shim) can
// find the branch API: the root is three levels above any snapshot's upper.
const AddressFile = "address"

// BranchDBFile, inside the snapshotter's root, is its database of branches:
// what tells its root from another snapshotter's of the same layout
// (containerd's overlayfs snapshotter's).
const BranchDBFile = "branches.db"

// RootOfUpper returns the snapshotter root an upper directory
// (<root>/snapshots/<id>/fs or <root>/branches/<root id>/<id>/fs) lies in.
func RootOfUpper(upper string) (string, error) {
	root, _, _, ok := SplitUpper(filepath.Clean(upper))
	if !ok {
		return "", fmt.Errorf("%s is not an upper directory of the branch snapshotter: %w", upper, errdefs.ErrInvalidArgument)
	}
	return root, nil
}

// SplitUpper takes an upper directory apart, lexically: the snapshotter
// root, the snapshot id and, for a branch's upper, the branch id.
func SplitUpper(upper string) (root, snapID, branchID string, ok bool) {
	isNum := func(p string) bool { _, err := strconv.ParseUint(p, 10, 64); return err == nil }
	p := strings.Split(upper, "/")
	n := len(p)
	switch {
	case n > 3 && p[n-3] == "snapshots" && isNum(p[n-2]) && p[n-1] == "fs":
		return strings.Join(p[:n-3], "/"), p[n-2], "", true
	case n > 4 && p[n-4] == "branches" && isNum(p[n-3]) && isNum(p[n-2]) && p[n-1] == "fs":
		return strings.Join(p[:n-4], "/"), p[n-3], p[n-2], true
	}
	return "", "", "", false
}

// DisplayKey is the snapshot key a user gave, for messages: containerd's
// metadata store hands a snapshotter NAMESPACE/N/KEY, of which the user
// knows only KEY (for a container, its id). Quoted, so that whatever the
// key holds is shown safely.
func DisplayKey(key string) string {
	if ns, rest, ok := strings.Cut(key, "/"); ok && ns != "" {
		if n, k, ok := strings.Cut(rest, "/"); ok && k != "" {
			if _, err := strconv.ParseUint(n, 10, 64); err == nil {
				return strconv.Quote(k)
			}
		}
	}
	return strconv.Quote(key)
}
