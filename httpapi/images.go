//go:build linux

package httpapi

import (
	"fmt"
	"net/http"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/client/oci"
)

// Registry is how push and pull reach a registry. The host configuration
// directory is the server's (Config.HostsDir): a client names no path on
// the node.
type Registry struct {
	PlainHTTP bool   `json:"plainHttp,omitempty"`
	User      string `json:"user,omitempty"`
	Secret    string `json:"secret,omitempty"`
}

func (s *Server) remote(r Registry) oci.Remote {
	return oci.Remote{HostsDir: s.cfg.HostsDir, PlainHTTP: r.PlainHTTP, User: r.User, Secret: r.Secret}
}

// Push is the body of POST .../push: the sandbox, one of its branches or
// one of its checkpoints, pushed as an OCI image to ref.
type Push struct {
	Ref        string `json:"ref"`
	Branch     string `json:"branch,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Registry
}

type pushDoc struct {
	Push struct {
		Ref          string   `json:"ref"`
		Manifest     string   `json:"manifest"`
		Checkpoints  []string `json:"checkpoints"`
		SentBlobs    int      `json:"sentBlobs"`
		SentBytes    int64    `json:"sentBytes"`
		SkippedBlobs int      `json:"skippedBlobs"`
	} `json:"push"`
}

func (s *Server) push(w http.ResponseWriter, r request) error {
	var req Push
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.Ref == "" {
		return fmt.Errorf("push: ref is required: %w", errdefs.ErrInvalidArgument)
	}
	if req.Branch != "" && req.Checkpoint != "" {
		return fmt.Errorf("push: a branch or a checkpoint, not both: %w", errdefs.ErrInvalidArgument)
	}
	id, err := client.ResolveSandbox(r.Context(), s.cfg.Address, r.ns, r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	res, err := oci.Push(r.ctx(), s.cc, oci.Source{Sandbox: id, Branch: rootOr(req.Branch), Checkpoint: req.Checkpoint}, req.Ref, s.remote(req.Registry))
	if err != nil {
		return err
	}
	var doc pushDoc
	p := &doc.Push
	p.Ref, p.Manifest, p.Checkpoints = res.Ref, res.Image.Manifest.Digest.String(), []string{}
	for _, ck := range res.Image.Lineage.Checkpoints {
		p.Checkpoints = append(p.Checkpoints, ck.Name)
	}
	if res.Sent != nil {
		p.SentBlobs, p.SentBytes, p.SkippedBlobs = len(res.Sent.Blobs), res.Sent.Bytes, res.Sent.Skipped
	}
	writeJSON(w, http.StatusOK, doc)
	return nil
}

// Pull is the body of POST /v1/namespaces/{ns}/pull: make sandbox of an
// image push made, with its checkpoints restored, and start it unless
// told not to.
type Pull struct {
	Ref     string   `json:"ref"`
	Sandbox string   `json:"sandbox"`
	Args    []string `json:"args,omitempty"`
	NoStart bool     `json:"noStart,omitempty"`
	Registry
}

type pullDoc struct {
	Pull struct {
		Ref         string   `json:"ref"`
		Sandbox     string   `json:"sandbox"`
		Checkpoints []string `json:"checkpoints"`
		Started     bool     `json:"started"`
	} `json:"pull"`
}

func (s *Server) pull(w http.ResponseWriter, r request) error {
	var req Pull
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.Ref == "" || req.Sandbox == "" {
		return fmt.Errorf("pull: ref and sandbox are required: %w", errdefs.ErrInvalidArgument)
	}
	ctx := r.ctx()
	res, err := oci.Pull(ctx, s.cc, req.Ref, req.Sandbox, s.remote(req.Registry), req.Args...)
	if err != nil {
		return err
	}
	var doc pullDoc
	doc.Pull.Ref, doc.Pull.Sandbox, doc.Pull.Checkpoints = res.Ref, res.Sandbox, res.Checkpoints
	if doc.Pull.Checkpoints == nil {
		doc.Pull.Checkpoints = []string{}
	}
	if !req.NoStart {
		c, err := s.cc.LoadContainer(ctx, res.Sandbox)
		if err != nil {
			return err
		}
		t, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			return fmt.Errorf("pulled sandbox %s: start it: %w", res.Sandbox, err)
		}
		if err := t.Start(ctx); err != nil {
			return fmt.Errorf("pulled sandbox %s: start it: %w", res.Sandbox, err)
		}
		doc.Pull.Started = true
	}
	writeJSON(w, http.StatusOK, doc)
	return nil
}
