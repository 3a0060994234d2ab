// Package oci makes a branch of a sandbox an OCI image: the
// sandbox image's layers unchanged, then a layer of the branch's change,
// with a config from the sandbox's image and annotations recording the
// lineage. It builds and pushes through containerd (its diff service,
// content store, leases and registry hosts configuration), so the image is
// exactly what any containerd node pulls and runs.
package oci

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// Source names what to make an image of: a sandbox, one of
// its branches, or (not yet) one of its checkpoints.
type Source struct {
	Sandbox    string
	Branch     string // "" for the sandbox
	Checkpoint string
}

// ParseSource parses SANDBOX, SANDBOX/BRANCH or SANDBOX@CHECKPOINT.
func ParseSource(s string) (Source, error) {
	var src Source
	rest := s
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		src.Checkpoint = rest[i+1:]
		rest = rest[:i]
		if src.Checkpoint == "" {
			return Source{}, fmt.Errorf("%q: no checkpoint named after @: %w", s, errdefs.ErrInvalidArgument)
		}
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		src.Branch = rest[i+1:]
		rest = rest[:i]
		if src.Branch == "" || strings.Contains(src.Branch, "/") {
			return Source{}, fmt.Errorf("%q: give SANDBOX/BRANCH with one branch id: %w", s, errdefs.ErrInvalidArgument)
		}
		if src.Branch == branch.RootID {
			src.Branch = ""
		}
	}
	src.Sandbox = rest
	if src.Sandbox == "" {
		return Source{}, fmt.Errorf("%q: no sandbox named: %w", s, errdefs.ErrInvalidArgument)
	}
	if src.Checkpoint != "" && src.Branch != "" {
		return Source{}, fmt.Errorf("%q: give SANDBOX/BRANCH or SANDBOX@CHECKPOINT, not both: %w", s, errdefs.ErrInvalidArgument)
	}
	return src, nil
}

// String is the source as ParseSource reads it.
func (s Source) String() string {
	switch {
	case s.Checkpoint != "":
		return s.Sandbox + "@" + s.Checkpoint
	case s.Branch != "":
		return s.Sandbox + "/" + s.Branch
	}
	return s.Sandbox
}
