//go:build linux

package oci

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client/branchapi"
)

// A pulled image and a loaded one become a sandbox the same way, here:
// the image is in the content store and unpacked into the branch
// snapshotter; its lineage says which layers are checkpoints, and which
// of those carry a memory image beside it.

// imagePath is what an image's manifest says of the sandbox it was made
// of.
type imagePath struct {
	image    containerd.Image
	manifest ocispec.Manifest
	diffIDs  []digest.Digest
	lineage  Lineage
	ours     bool // made by branchbox
	// base is the number of layers the sandbox's rootfs starts from (the
	// base image's snapshot); the layers above are applied one by one.
	base int
	// ckAt maps a layer's index to the checkpoint taken after it.
	ckAt map[int]string
}

// pathOf reads img's manifest for the default platform.
func pathOf(ctx context.Context, cc *containerd.Client, img images.Image) (imagePath, error) {
	platform := platforms.Default()
	p := imagePath{image: containerd.NewImageWithPlatform(cc, img, platform), ckAt: map[int]string{}}
	cs := cc.ContentStore()
	md, err := manifestDescriptor(ctx, cs, img.Target, platform)
	if err != nil {
		return p, err
	}
	if err := readJSON(ctx, cs, md, &p.manifest); err != nil {
		return p, fmt.Errorf("read its manifest: %w", err)
	}
	if p.diffIDs, err = p.image.RootFS(ctx); err != nil {
		return p, err
	}
	p.lineage, p.ours = LineageOf(p.manifest.Annotations)
	p.base = len(p.diffIDs)
	if !p.ours || len(p.lineage.ParentLayers) > len(p.manifest.Layers) {
		return p, nil
	}
	p.base = len(p.lineage.ParentLayers)
	next := 0
	for i := p.base; i < len(p.manifest.Layers) && next < len(p.lineage.Checkpoints); i++ {
		if p.manifest.Layers[i].Digest == p.lineage.Checkpoints[next].Layer {
			p.ckAt[i] = p.lineage.Checkpoints[next].Name
			next++
		}
	}
	if next != len(p.lineage.Checkpoints) {
		return p, fmt.Errorf("its lineage names checkpoint layers the manifest does not hold in order: %w", errdefs.ErrDataLoss)
	}
	return p, nil
}

// sandboxNameFree says whether no container is named sandbox: checked
// before anything is downloaded or imported (and again, for one taken
// meanwhile, when the sandbox is made).
func sandboxNameFree(ctx context.Context, cc *containerd.Client, sandbox string) error {
	if sandbox == "" {
		return fmt.Errorf("name the sandbox to make: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := cc.LoadContainer(ctx, sandbox); err == nil {
		return fmt.Errorf("sandbox %s: a container of that name exists already: %w", sandbox, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("look up sandbox %s: %w", sandbox, err)
	}
	return nil
}

// newSandbox makes sandbox, a container not started, of img (running
// args, or the image's command). For an image branchbox made, the
// sandbox's rootfs is built up from the base image's snapshot one layer
// at a time, with each checkpoint on the path restored after its layer
// (with its memory image, got with get: see fetchMemory), so that
// rollback and fork --from work here as where it was made. Any other image
// becomes a sandbox as `ctr run` would make it.
//
// The caller holds a lease. On an error nothing newSandbox made is left
// (the memory images unpacked, the rootfs with the checkpoints restored so
// far); on success undo removes the sandbox and its rootfs, for a step of
// the caller's that fails after.
func newSandbox(ctx context.Context, cc *containerd.Client, img images.Image, sandbox string, get images.Handler, args []string) (_ PullResult, undo func(), retErr error) {
	p, err := pathOf(ctx, cc, img)
	if err != nil {
		return PullResult{}, nil, err
	}
	// The memory images first: nothing is made if one is bad.
	memories := map[string]string{}
	if p.ours {
		mems, cleanup, err := fetchMemory(ctx, cc.ContentStore(), get, img.Target, p.lineage)
		if err != nil {
			return PullResult{}, nil, err
		}
		// The snapshotter keeps a copy of each once it is restored.
		defer cleanup()
		memories = mems
	}
	sn := cc.SnapshotService(snapshotterName)
	key := sandbox + "-" + img.Target.Digest.Encoded()[:12]
	mounts, err := sn.Prepare(ctx, key, identity.ChainID(p.diffIDs[:p.base]).String())
	if err != nil {
		return PullResult{}, nil, fmt.Errorf("prepare the rootfs of sandbox %s: %w", sandbox, err)
	}
	removeRootfs := func() {
		// The checkpoints restored in it go with it.
		if err := sn.Remove(context.WithoutCancel(ctx), key); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("key", key).Warn("remove the rootfs of a sandbox not made")
		}
	}
	defer func() {
		if retErr != nil {
			removeRootfs()
		}
	}()
	cks, err := restoreCheckpoints(ctx, cc.ContentStore(), p, mounts, memories, sandbox)
	if err != nil {
		return PullResult{}, nil, err
	}
	spec := []oci.SpecOpts{oci.WithImageConfig(p.image)}
	if len(args) > 0 {
		spec = append(spec, oci.WithProcessArgs(args...))
	}
	ctr, err := cc.NewContainer(ctx, sandbox,
		containerd.WithImage(p.image), containerd.WithSnapshotter(snapshotterName), containerd.WithSnapshot(key),
		containerd.WithRuntime(branch.RuntimeName, nil), containerd.WithNewSpec(spec...))
	if err != nil {
		return PullResult{}, nil, fmt.Errorf("make sandbox %s: %w", sandbox, err)
	}
	undo = func() {
		if err := ctr.Delete(context.WithoutCancel(ctx)); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", sandbox).Warn("remove a sandbox not made")
		}
		removeRootfs()
	}
	return PullResult{Sandbox: sandbox, Lineage: p.lineage, Checkpoints: cks}, undo, nil
}

// restoreCheckpoints applies the layers of p above its base into the
// rootfs (mounts, not mounted anywhere else yet), and after each
// checkpoint layer checkpoints the rootfs under the checkpoint's name,
// with its memory image (a directory of memories) if it has one. It
// returns the names of the checkpoints restored.
func restoreCheckpoints(ctx context.Context, cs content.Provider, p imagePath, mounts []mount.Mount, memories map[string]string, sandbox string) ([]string, error) {
	var bc *branchapi.Client
	if len(p.ckAt) > 0 {
		var err error
		if bc, err = dialSnapshotterOf(upperOf(mounts)); err != nil {
			return nil, err
		}
		defer bc.Close()
	}
	var restored []string
	for i := p.base; i < len(p.manifest.Layers); i++ {
		if err := applyThroughMount(ctx, cs, p.manifest.Layers[i], mounts); err != nil {
			return nil, fmt.Errorf("apply layer %d into sandbox %s: %w", i, sandbox, err)
		}
		name, ok := p.ckAt[i]
		if !ok {
			continue
		}
		var opts []branch.CheckpointOpt
		if dir, ok := memories[name]; ok {
			opts = append(opts, branch.WithMemoryImage(dir))
		}
		if _, err := bc.Checkpoint(ctx, branch.Ref{Root: branch.Root{Upperdir: upperOf(mounts)}}, name, opts...); err != nil {
			return nil, fmt.Errorf("restore checkpoint %s of sandbox %s: %w", name, sandbox, err)
		}
		restored = append(restored, name)
	}
	return restored, nil
}
