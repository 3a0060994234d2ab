//go:build linux

package oci

import (
	"context"
	"fmt"
	"io"

	"github.com/branchbox/branchbox/client/branchapi"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/branch"
)

// PullResult is the sandbox a pull made and the checkpoints it restored.
type PullResult struct {
	Ref         string
	Sandbox     string
	Lineage     Lineage
	Checkpoints []string
}

// Pull pulls ref with containerd (unpacked into the branch snapshotter)
// and makes a sandbox container named sandbox of it (running args, or the
// image's command), not started. For an
// image branchbox pushed, the sandbox's rootfs is built up from the base
// image's snapshot one layer at a time, with a checkpoint of the given
// name taken after each checkpoint layer, so that rollback and fork --from
// work on the new node as on the old. Any other image becomes a sandbox
// as `ctr run` would make it.
//
// A pull that fails, at any point, leaves the node as it was: everything
// is made under a lease, and the image record is written last (an image
// of that name keeps its target until then); a failure removes the
// sandbox and rootfs it made, and the lease's end takes the blobs and
// snapshots nothing else holds.
func Pull(ctx context.Context, cc *containerd.Client, ref, sandbox string, remote Remote, args ...string) (_ PullResult, retErr error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return PullResult{}, fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	ref = reference.TagNameOnly(named).String()
	if sandbox == "" {
		return PullResult{}, fmt.Errorf("pull %s: name the sandbox to make: %w", ref, errdefs.ErrInvalidArgument)
	}
	// A name taken is found before anything is downloaded (and again,
	// for one taken meanwhile, when the sandbox is made).
	if _, err := cc.LoadContainer(ctx, sandbox); err == nil {
		return PullResult{}, fmt.Errorf("pull %s: sandbox %s: a container of that name exists already: %w", ref, sandbox, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return PullResult{}, fmt.Errorf("pull %s: look up sandbox %s: %w", ref, sandbox, err)
	}
	ctx, end, err := holdLease(ctx, cc)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	defer func() { end(retErr) }()
	platform := platforms.Default()
	fetched, err := fetchUnpacked(ctx, cc, ref, remote.resolver(ctx), platform)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, remoteError(ref, err))
	}
	img := containerd.NewImageWithPlatform(cc, fetched, platform)
	cs := cc.ContentStore()
	md, err := manifestDescriptor(ctx, cs, img.Target(), platform)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	var manifest ocispec.Manifest
	if err := readJSON(ctx, cs, md, &manifest); err != nil {
		return PullResult{}, fmt.Errorf("pull %s: read its manifest: %w", ref, err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	lineage, ours := LineageOf(manifest.Annotations)
	base := len(diffIDs)
	ckAt := map[int]string{} // layer index -> checkpoint taken after it
	if ours && len(lineage.ParentLayers) <= len(manifest.Layers) {
		base = len(lineage.ParentLayers)
		next := 0
		for i := base; i < len(manifest.Layers) && next < len(lineage.Checkpoints); i++ {
			if manifest.Layers[i].Digest == lineage.Checkpoints[next].Layer {
				ckAt[i] = lineage.Checkpoints[next].Name
				next++
			}
		}
		if next != len(lineage.Checkpoints) {
			return PullResult{}, fmt.Errorf("pull %s: its lineage names checkpoint layers the manifest does not hold in order: %w", ref, errdefs.ErrDataLoss)
		}
	}

	sn := cc.SnapshotService(snapshotterName)
	key := sandbox + "-" + img.Target().Digest.Encoded()[:12]
	mounts, err := sn.Prepare(ctx, key, identity.ChainID(diffIDs[:base]).String())
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: prepare the rootfs of sandbox %s: %w", ref, sandbox, err)
	}
	defer func() {
		if retErr != nil {
			if err := sn.Remove(context.WithoutCancel(ctx), key); err != nil && !errdefs.IsNotFound(err) {
				log.G(ctx).WithError(err).WithField("key", key).Warn("remove the rootfs of a failed pull")
			}
		}
	}()
	res := PullResult{Ref: ref, Sandbox: sandbox, Lineage: lineage}
	// The memory images of checkpoints taken with memory, beside the
	// image in its index: fetched and unpacked before anything is made.
	var memories map[string]string
	if ours {
		fetcher, err := remote.resolver(ctx).Fetcher(ctx, ref)
		if err != nil {
			return PullResult{}, fmt.Errorf("pull %s: %w", ref, remoteError(ref, err))
		}
		mems, cleanup, err := fetchMemory(ctx, cs, fetcher, img.Target(), lineage)
		if err != nil {
			return PullResult{}, fmt.Errorf("pull %s: %w", ref, remoteError(ref, err))
		}
		defer cleanup()
		memories = mems
	}
	var bc *branchapi.Client
	if len(ckAt) > 0 {
		if bc, err = dialSnapshotterOf(upperOf(mounts)); err != nil {
			return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
		}
		defer bc.Close()
	}
	// The layers above the base, applied one by one into the rootfs (not
	// mounted anywhere else yet); a checkpoint after each checkpoint layer.
	for i := base; i < len(manifest.Layers); i++ {
		if err := applyThroughMount(ctx, cs, manifest.Layers[i], mounts); err != nil {
			return PullResult{}, fmt.Errorf("pull %s: apply layer %d into sandbox %s: %w", ref, i, sandbox, err)
		}
		if name, ok := ckAt[i]; ok {
			var opts []branch.CheckpointOpt
			if dir, ok := memories[name]; ok {
				opts = append(opts, branch.WithMemoryImage(dir))
			}
			if _, err := bc.Checkpoint(ctx, branch.Ref{Root: branch.Root{Upperdir: upperOf(mounts)}}, name, opts...); err != nil {
				return PullResult{}, fmt.Errorf("pull %s: restore checkpoint %s of sandbox %s: %w", ref, name, sandbox, err)
			}
			res.Checkpoints = append(res.Checkpoints, name)
		}
	}
	spec := []oci.SpecOpts{oci.WithImageConfig(img)}
	if len(args) > 0 {
		spec = append(spec, oci.WithProcessArgs(args...))
	}
	ctr, err := cc.NewContainer(ctx, sandbox,
		containerd.WithImage(img), containerd.WithSnapshotter(snapshotterName), containerd.WithSnapshot(key),
		containerd.WithRuntime(branch.RuntimeName, nil), containerd.WithNewSpec(spec...))
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: make sandbox %s: %w", ref, sandbox, err)
	}
	defer func() {
		if retErr != nil {
			// Its rootfs goes with the deferred removal above.
			if err := ctr.Delete(context.WithoutCancel(ctx)); err != nil {
				log.G(ctx).WithError(err).WithField("sandbox", sandbox).Warn("remove the sandbox of a failed pull")
			}
		}
	}()
	// The image record last: a pull that failed before it leaves an image
	// of that name as it was.
	if err := recordImages(ctx, cc.ImageService(), []images.Image{fetched}, "target"); err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	labelSource(ctx, cc, fetched, platform)
	return res, nil
}

// snapshotterName is the containerd snapshotter branchbox runs on.
const snapshotterName = "branch"

// applyThroughMount applies an OCI layer to the rootfs through a temporary
// mount of it, with containerd's archive code: a whiteout deletes through
// the overlay. containerd's applier writes an overlay's upper directly,
// which only a fresh upper allows (it cannot whiteout a file the upper
// already holds), and here one upper takes layer after layer.
func applyThroughMount(ctx context.Context, cs content.Provider, desc ocispec.Descriptor, mounts []mount.Mount) error {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return err
	}
	defer ra.Close()
	r, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		return err
	}
	defer r.Close()
	return mount.WithTempMount(ctx, mounts, func(root string) error {
		if _, err := archive.Apply(ctx, root, r); err != nil {
			return err
		}
		// Drain what the tar reader left (padding), so the digest
		// verification of the stream sees it all.
		_, err := io.Copy(io.Discard, r)
		return err
	})
}
