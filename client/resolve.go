//go:build linux

package client

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/branchbox/branchbox/branch"
)

// Users name a container as their tool shows it: ctr and nerdctl by id
// or a unique id prefix, nerdctl by its name (a label), crictl by the
// container's name in its pod. These are the labels and extensions those
// tools and containerd's CRI plugin record.
const (
	nerdctlNameLabel      = "nerdctl/name"
	kubeContainerLabel    = "io.kubernetes.container.name"
	kubePodLabel          = "io.kubernetes.pod.name"
	criKindLabel          = "io.cri-containerd.kind"
	criContainerExtension = "io.cri-containerd.container.metadata"
)

// ErrNoSandbox is the kind of error for a sandbox name that matches no
// container; it is an errdefs NotFound.
var ErrNoSandbox = fmt.Errorf("%w", errdefs.ErrNotFound)

// maxCandidates bounds the candidates an ambiguous name lists.
const maxCandidates = 10

// Sandbox is a container as a user may name it.
type Sandbox struct {
	ID string `json:"id"`
	// Name is the name a tool gave it: nerdctl's, or the CRI's
	// POD/CONTAINER; "" for a container made with ctr.
	Name    string    `json:"name,omitempty"`
	Runtime string    `json:"runtime"`
	Image   string    `json:"image,omitempty"`
	Created time.Time `json:"created"`
	// names are every name that resolves to it, Name first.
	names []string
	// container is containerd's record as listed, which NewSandboxClient
	// reads the runtime and spec from without asking containerd again.
	container *containersapi.Container
}

// branchRuntime reports whether the container runs on branchbox's shim
// (the CRI handler records runc-v2's type; its shim is asked, in
// NewSandboxClient).
func (s Sandbox) branchRuntime() bool {
	return s.Runtime == branch.RuntimeName || s.Runtime == criRuntimeType
}

func sandboxFromProto(c *containersapi.Container) Sandbox {
	s := Sandbox{ID: c.ID, Image: c.Image, container: c}
	if c.Runtime != nil {
		s.Runtime = c.Runtime.Name
	}
	if c.CreatedAt != nil {
		s.Created = c.CreatedAt.AsTime()
	}
	if n := c.Labels[nerdctlNameLabel]; n != "" {
		s.names = append(s.names, n)
	}
	// A CRI container: its name in its pod, and POD/NAME.
	ctr, pod := c.Labels[kubeContainerLabel], c.Labels[kubePodLabel]
	if ext, ok := c.Extensions[criContainerExtension]; ok && ctr == "" {
		ctr, pod = criNames(ext.Value)
	}
	if ctr != "" && c.Labels[criKindLabel] != "sandbox" {
		if pod != "" {
			s.names = append(s.names, pod+"/"+ctr)
		}
		s.names = append(s.names, ctr)
	}
	if len(s.names) > 0 {
		s.Name = s.names[0]
	}
	return s
}

// criNames reads a container's name and its pod's from the metadata the
// CRI plugin keeps with it: the name crictl shows, and the CRI's full name
// CONTAINER_POD_NAMESPACE_UID_ATTEMPT (Kubernetes names hold no '_').
func criNames(raw []byte) (container, pod string) {
	var md struct {
		Metadata struct {
			Name   string
			Config struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
		}
	}
	if json.Unmarshal(raw, &md) != nil {
		return "", ""
	}
	container = md.Metadata.Config.Metadata.Name
	if parts := strings.Split(md.Metadata.Name, "_"); len(parts) == 5 && parts[0] == container {
		pod = parts[1]
	}
	return container, pod
}

// resolve picks the container name names: an exact id, then an exact
// name, then a unique id prefix. More than one match is an error that
// lists them.
func resolve(list []Sandbox, name string) (Sandbox, error) {
	for _, s := range list {
		if s.ID == name {
			return s, nil
		}
	}
	var byName, byPrefix []Sandbox
	for _, s := range list {
		for _, n := range s.names {
			if n == name {
				byName = append(byName, s)
				break
			}
		}
		if strings.HasPrefix(s.ID, name) {
			byPrefix = append(byPrefix, s)
		}
	}
	for _, m := range [][]Sandbox{byName, byPrefix} {
		switch {
		case len(m) == 1:
			return m[0], nil
		case len(m) > 1:
			return Sandbox{}, ambiguous(name, m)
		}
	}
	return Sandbox{}, fmt.Errorf("no sandbox %s: no container has that id, id prefix or name: %w", strconv.Quote(name), ErrNoSandbox)
}

func ambiguous(name string, m []Sandbox) error {
	sort.Slice(m, func(i, j int) bool { return m[i].ID < m[j].ID })
	var c []string
	for i, s := range m {
		if i == maxCandidates {
			c = append(c, fmt.Sprintf("and %d more", len(m)-i))
			break
		}
		d := s.ID
		if s.Name != "" {
			d += " (" + strconv.Quote(s.Name) + ")"
		}
		c = append(c, d)
	}
	return fmt.Errorf("%s names %d containers: %s; give more of the id: %w", strconv.Quote(name), len(m), strings.Join(c, ", "), errdefs.ErrInvalidArgument)
}

// containersOf lists the containers of a namespace through containerd.
func containersOf(ctx context.Context, gc *grpc.ClientConn) ([]Sandbox, error) {
	resp, err := containersapi.NewContainersClient(gc).List(ctx, &containersapi.ListContainersRequest{})
	if err != nil {
		return nil, errgrpc.ToNative(err)
	}
	out := make([]Sandbox, len(resp.Containers))
	for i, c := range resp.Containers {
		out[i] = sandboxFromProto(c)
	}
	return out, nil
}

// ResolveSandbox returns the id of the container name names in a
// containerd namespace: its full id, a unique id prefix, its nerdctl name,
// or its CRI name (NAME or POD/NAME, namespace k8s.io). A name that
// matches nothing is an ErrNoSandbox; one that matches several, an
// InvalidArgument listing them.
func ResolveSandbox(ctx context.Context, address, namespace, name string) (string, error) {
	gc, err := dialContainerd(address)
	if err != nil {
		return "", err
	}
	defer gc.Close()
	s, err := resolveWith(namespaces.WithNamespace(ctx, orDefault(namespace)), gc, address, orDefault(namespace), name)
	return s.ID, err
}

func resolveWith(ctx context.Context, gc *grpc.ClientConn, address, namespace, name string) (Sandbox, error) {
	if name == "" {
		return Sandbox{}, fmt.Errorf("no sandbox named: give its id, an id prefix or its name: %w", errdefs.ErrInvalidArgument)
	}
	list, err := containersOf(ctx, gc)
	if err != nil {
		return Sandbox{}, containerdErr(address, err)
	}
	s, err := resolve(list, name)
	if err != nil {
		return Sandbox{}, fmt.Errorf("in namespace %s: %w", strconv.Quote(namespace), err)
	}
	return s, nil
}

// SandboxSummary is a container on the branch runtime, with its task's
// status and, when it runs, its live branches.
type SandboxSummary struct {
	Sandbox
	// Status is the task's: running, paused, stopped, created, or "" when
	// it has no task.
	Status string `json:"status"`
	// Branches counts its live branches (not the sandbox itself), when
	// the task runs.
	Branches int `json:"branches"`
	// Error says why Branches could not be counted.
	Error string `json:"error,omitempty"`
}

// ListSandboxes lists the containers of a namespace that run on the branch
// runtime, oldest first.
func ListSandboxes(ctx context.Context, address, namespace string) ([]SandboxSummary, error) {
	namespace = orDefault(namespace)
	ctx = namespaces.WithNamespace(ctx, namespace)
	gc, err := dialContainerd(address)
	if err != nil {
		return nil, err
	}
	defer gc.Close()
	list, err := containersOf(ctx, gc)
	if err != nil {
		return nil, containerdErr(address, err)
	}
	tasks, err := tasksapi.NewTasksClient(gc).List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, containerdErr(address, errgrpc.ToNative(err))
	}
	status := map[string]task.Status{}
	for _, p := range tasks.Tasks {
		status[p.ID] = p.Status
	}
	var out []SandboxSummary
	for _, s := range list {
		if !s.branchRuntime() {
			continue
		}
		sum := SandboxSummary{Sandbox: s}
		if st, ok := status[s.ID]; ok {
			sum.Status = strings.ToLower(strings.TrimPrefix(st.String(), "STATUS_"))
		}
		if sum.Status == "running" || sum.Status == "paused" {
			sum.Branches, err = liveBranches(ctx, address, namespace, s.ID)
			if err != nil {
				sum.Error = err.Error()
			}
		}
		out = append(out, sum)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

func liveBranches(ctx context.Context, address, namespace, id string) (int, error) {
	sc, err := NewSandboxClient(ctx, address, namespace, id)
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range nodes {
		if c.ID != branch.RootID && (c.State == branch.Live || c.State == branch.Committing) {
			n++
		}
	}
	return n, nil
}

func dialContainerd(address string) (*grpc.ClientConn, error) {
	gc, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	return gc, nil
}

func containerdErr(address string, err error) error {
	if errdefs.IsUnavailable(err) || strings.Contains(err.Error(), "connect") {
		return fmt.Errorf("containerd at %s does not answer (is it running? set --address or CONTAINERD_ADDRESS): %w", address, err)
	}
	return err
}

func orDefault(namespace string) string {
	if namespace == "" {
		return namespaces.Default
	}
	return namespace
}
