//go:build linux

package oci

import (
	"context"
	"fmt"
	"io"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
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
// image's command), not started, with the checkpoints on its path
// restored (newSandbox), so that rollback and fork --from work on the new
// node as on the old. Any other image than branchbox's becomes a sandbox
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
	if err := sandboxNameFree(ctx, cc, sandbox); err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	ctx, end, err := holdLease(ctx, cc)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	defer func() { end(retErr) }()
	platform := platforms.Default()
	resolver := remote.resolver(ctx)
	fetched, err := fetchUnpacked(ctx, cc, ref, resolver, platform)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, remoteError(ref, err))
	}
	// The memory images beside the image in its index are fetched from
	// the registry by newSandbox, only for the checkpoints that have one.
	fetcher, err := resolver.Fetcher(ctx, ref)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, remoteError(ref, err))
	}
	fetch := remotes.FetchHandler(cc.ContentStore(), fetcher)
	var get images.HandlerFunc = func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		children, err := fetch(ctx, desc)
		if err != nil {
			return nil, remoteError(ref, err)
		}
		return children, nil
	}
	res, undo, err := newSandbox(ctx, cc, fetched, sandbox, get, args)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	defer func() {
		if retErr != nil {
			undo()
		}
	}()
	// The image record last: a pull that failed before it leaves an image
	// of that name as it was.
	if err := recordImages(ctx, cc.ImageService(), []images.Image{fetched}, "target"); err != nil {
		return PullResult{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	labelSource(ctx, cc, fetched, platform)
	res.Ref = ref
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
