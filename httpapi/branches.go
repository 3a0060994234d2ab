//go:build linux

package httpapi

import (
	"net/http"
	"strconv"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// Fork is the body of POST .../fork, `branchctl fork`'s options.
type Fork struct {
	// Parent is the branch to fork: "" or "0" for the sandbox, or a
	// branch id.
	Parent string   `json:"parent,omitempty"`
	Count  int      `json:"count,omitempty"`
	From   string   `json:"from,omitempty"`
	Seal   string   `json:"seal,omitempty"`
	Net    string   `json:"net,omitempty"`
	Memory int64    `json:"memory,omitempty"`
	CPUs   float64  `json:"cpus,omitempty"`
	Pids   int64    `json:"pids,omitempty"`
	Args   []string `json:"args,omitempty"`
	// WithMemory forks the parent's running processes too (a memory
	// fork; with From, the checkpoint's). Memory is the branches' limit.
	WithMemory bool `json:"with_memory,omitempty"`
}

// branchesDoc is fork's and tree's answer. Contexts is Branches under the
// key's name before a node of the tree was called a branch, for the
// clients built before the rename (deprecated, removed in the release
// after next: docs/design.md#names).
type branchesDoc struct {
	Branches []client.BranchInfo `json:"branches"`
	Contexts []client.BranchInfo `json:"contexts"`
}

func branchesOf(list []client.BranchInfo) branchesDoc {
	return branchesDoc{Branches: list, Contexts: list}
}

func (s *Server) fork(w http.ResponseWriter, r request) error {
	req := Fork{Count: 1}
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.Parent == branch.RootID {
		req.Parent = ""
	}
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	kids, err := sc.Fork(r.Context(), client.ForkOptions{
		Parent: req.Parent, Count: req.Count, From: req.From, Seal: req.Seal, Net: req.Net,
		Memory: req.Memory, CPUs: req.CPUs, Pids: req.Pids, Args: req.Args, WithMemory: req.WithMemory,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, branchesOf(kids))
	return nil
}

func (s *Server) tree(w http.ResponseWriter, r request) error {
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	nodes, err := sc.Tree(r.Context())
	if err != nil {
		return err
	}
	// The shim records the sandbox at its first fork; its
	// age is the container's (as branchctl tree shows it).
	for i := range nodes {
		if nodes[i].ID == branch.RootID && !sc.Created.IsZero() {
			nodes[i].Created = sc.Created
		}
	}
	if nodes == nil {
		nodes = []client.BranchInfo{}
	}
	writeJSON(w, http.StatusOK, branchesOf(nodes))
	return nil
}

type commitDoc struct {
	Commit client.SandboxCommitResult `json:"commit"`
}

func (s *Server) commit(w http.ResponseWriter, r request) error {
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	res, err := sc.Commit(r.Context(), r.PathValue("branch"))
	if err != nil {
		return err
	}
	if res.Invalidated == nil {
		res.Invalidated = []string{}
	}
	writeJSON(w, http.StatusOK, commitDoc{Commit: res})
	return nil
}

type abortDoc struct {
	Abort struct {
		Aborted []string `json:"aborted"`
	} `json:"abort"`
}

// logs writes a branch's output (client Output) as it was written.
func (s *Server) logs(w http.ResponseWriter, r request) error {
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	out, err := sc.Output(r.Context(), r.PathValue("branch"))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	return nil
}

func (s *Server) abort(w http.ResponseWriter, r request) error {
	sc, done, err := s.dial(r)
	if err != nil {
		return err
	}
	defer done()
	ids, err := sc.Abort(r.Context(), r.PathValue("branch"))
	if err != nil {
		return err
	}
	var doc abortDoc
	doc.Abort.Aborted = ids
	if ids == nil {
		doc.Abort.Aborted = []string{}
	}
	writeJSON(w, http.StatusOK, doc)
	return nil
}
