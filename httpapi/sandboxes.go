//go:build linux

package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// snapshotter is the branch snapshotter's name in containerd's
// configuration (docs/containerd-config.toml).
const snapshotter = "branch"

// socketAnnotation gives a sandbox its in-sandbox branch socket
// (docs/in-sandbox.md).
const socketAnnotation = "io.branchbox.socket"

type sandboxList struct {
	Sandboxes []client.SandboxSummary `json:"sandboxes"`
}

func (s *Server) listSandboxes(w http.ResponseWriter, r request) error {
	list, err := client.ListSandboxes(r.Context(), s.cfg.Address, r.ns)
	if err != nil {
		return err
	}
	if list == nil {
		list = []client.SandboxSummary{}
	}
	writeJSON(w, http.StatusOK, sandboxList{Sandboxes: list})
	return nil
}

// CreateSandbox is the body of POST .../sandboxes.
type CreateSandbox struct {
	ID    string `json:"id"`
	Image string `json:"image"`
	// Args replace the image's command (default: its entrypoint and cmd).
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	// Socket gives the sandbox its branch socket, for branchctl self.
	Socket bool `json:"socket,omitempty"`
	// Pull fetches the image when containerd does not have it.
	Pull bool `json:"pull,omitempty"`
	Registry
}

type sandboxDoc struct {
	Sandbox createdSandbox `json:"sandbox"`
}

type createdSandbox struct {
	ID     string `json:"id"`
	Image  string `json:"image"`
	Pid    uint32 `json:"pid"`
	Status string `json:"status"`
}

// createSandbox makes a container on the branch runtime and snapshotter
// from an image, and starts it: what `ctr run -d --runtime
// io.containerd.branch.v1 --snapshotter branch` does.
func (s *Server) createSandbox(w http.ResponseWriter, r request) error {
	var req CreateSandbox
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.ID == "" || req.Image == "" {
		return fmt.Errorf("create a sandbox: id and image are required: %w", errdefs.ErrInvalidArgument)
	}
	ctx := r.ctx()
	img, err := s.image(ctx, req)
	if err != nil {
		return err
	}
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img)}
	if len(req.Args) > 0 {
		specOpts = append(specOpts, oci.WithProcessArgs(req.Args...))
	}
	if len(req.Env) > 0 {
		specOpts = append(specOpts, oci.WithEnv(req.Env))
	}
	if req.Socket {
		specOpts = append(specOpts, oci.WithAnnotations(map[string]string{socketAnnotation: "true"}))
	}
	c, err := s.cc.NewContainer(ctx, req.ID,
		containerd.WithSnapshotter(snapshotter), containerd.WithNewSnapshot(req.ID, img),
		containerd.WithRuntime(branch.RuntimeName, nil), containerd.WithNewSpec(specOpts...))
	if err != nil {
		return fmt.Errorf("create sandbox %q: %w", req.ID, err)
	}
	// A request cancelled halfway leaves no half-made sandbox.
	cleanup := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = s.deleteContainer(dctx, c)
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		cleanup()
		return fmt.Errorf("create sandbox %q: start its task: %w", req.ID, err)
	}
	if err := task.Start(ctx); err != nil {
		cleanup()
		return fmt.Errorf("create sandbox %q: start its task: %w", req.ID, err)
	}
	writeJSON(w, http.StatusCreated, sandboxDoc{Sandbox: createdSandbox{ID: req.ID, Image: img.Name(), Pid: task.Pid(), Status: "running"}})
	return nil
}

// image finds the image, pulling and unpacking it into the branch
// snapshotter as asked.
func (s *Server) image(ctx context.Context, req CreateSandbox) (containerd.Image, error) {
	img, err := s.cc.GetImage(ctx, req.Image)
	switch {
	case errdefs.IsNotFound(err) && req.Pull:
		opts := []containerd.RemoteOpt{containerd.WithPullUnpack, containerd.WithPullSnapshotter(snapshotter)}
		opts = append(opts, containerd.WithResolver(s.remote(req.Registry).Resolver(ctx)))
		if img, err = s.cc.Pull(ctx, req.Image, opts...); err != nil {
			return nil, fmt.Errorf("pull image %q: %w", req.Image, err)
		}
		return img, nil
	case errdefs.IsNotFound(err):
		return nil, fmt.Errorf("image %q is not in this namespace (import it, or ask for \"pull\": true): %w", req.Image, err)
	case err != nil:
		return nil, fmt.Errorf("image %q: %w", req.Image, err)
	}
	unpacked, err := img.IsUnpacked(ctx, snapshotter)
	if err != nil {
		return nil, err
	}
	if !unpacked {
		if err := img.Unpack(ctx, snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %q into the branch snapshotter: %w", req.Image, err)
		}
	}
	return img, nil
}

type deletedDoc struct {
	Deleted string `json:"deleted"`
}

// removeSandbox kills the sandbox's task (its branches with it) and
// deletes the container and its snapshot.
func (s *Server) removeSandbox(w http.ResponseWriter, r request) error {
	ctx := r.ctx()
	id, err := client.ResolveSandbox(r.Context(), s.cfg.Address, r.ns, r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	c, err := s.cc.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	s.sandboxes.forget(r.ns, id)
	if err := s.deleteContainer(ctx, c); err != nil {
		return fmt.Errorf("remove sandbox %q: %w", id, err)
	}
	writeJSON(w, http.StatusOK, deletedDoc{Deleted: id})
	return nil
}

func (s *Server) deleteContainer(ctx context.Context, c containerd.Container) error {
	task, err := c.Task(ctx, nil)
	switch {
	case err == nil:
		ch, werr := task.Wait(ctx)
		if werr != nil {
			return werr
		}
		if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	case !errdefs.IsNotFound(err):
		return err
	}
	err = c.Delete(ctx, containerd.WithSnapshotCleanup)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}
