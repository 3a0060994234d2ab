//go:build linux

package httpapi

import (
	"fmt"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// CheckpointRequest is the body of POST .../checkpoints and .../rollback:
// a checkpoint name, of a branch ("" or "0": the sandbox).
type CheckpointRequest struct {
	Branch string `json:"branch,omitempty"`
	Name   string `json:"name"`
	// WithMemory records the branch's running processes too.
	WithMemory bool `json:"with_memory,omitempty"`
}

func rootOr(id string) string {
	if id == branch.RootID {
		return ""
	}
	return id
}

type checkpointDoc struct {
	Checkpoint branch.Checkpoint `json:"checkpoint"`
}

type checkpointsDoc struct {
	Checkpoints []branch.Checkpoint `json:"checkpoints"`
}

func (s *Server) checkpoint(w http.ResponseWriter, r request) error {
	var req CheckpointRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	var opts []client.CheckpointOption
	if req.WithMemory {
		opts = append(opts, client.CheckpointWithMemory())
	}
	ck, err := sc.Checkpoint(r.Context(), rootOr(req.Branch), req.Name, opts...)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, checkpointDoc{Checkpoint: ck})
	return nil
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r request) error {
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	list, err := sc.Checkpoints(r.Context())
	if err != nil {
		return err
	}
	if list == nil {
		list = []branch.Checkpoint{}
	}
	writeJSON(w, http.StatusOK, checkpointsDoc{Checkpoints: list})
	return nil
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r request) error {
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	name := r.PathValue("name")
	if err := sc.DeleteCheckpoint(r.Context(), name); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, deletedDoc{Deleted: name})
	return nil
}

// rollbackDoc is rollback's answer; Context is Branch under the key's old
// name, as in branchesDoc.
type rollbackDoc struct {
	Rollback struct {
		Branch     string  `json:"branch"`
		Context    string  `json:"context"`
		Checkpoint string  `json:"checkpoint"`
		Seconds    float64 `json:"seconds"`
	} `json:"rollback"`
}

func (s *Server) rollback(w http.ResponseWriter, r request) error {
	var req CheckpointRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.WithMemory {
		// What a rollback restores is the checkpoint's to say.
		return fmt.Errorf("rollback: with_memory is for taking a checkpoint; a rollback to one taken with memory restores a memory branch's processes by itself: %w", errdefs.ErrInvalidArgument)
	}
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	start := time.Now()
	if err := sc.Rollback(r.Context(), rootOr(req.Branch), req.Name); err != nil {
		return err
	}
	var doc rollbackDoc
	doc.Rollback.Branch, doc.Rollback.Checkpoint, doc.Rollback.Seconds = req.Branch, req.Name, time.Since(start).Seconds()
	if doc.Rollback.Branch == "" {
		doc.Rollback.Branch = branch.RootID
	}
	doc.Rollback.Context = doc.Rollback.Branch
	writeJSON(w, http.StatusOK, doc)
	return nil
}
