//go:build linux

package oci

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
)

// fetchUnpacked fetches ref's image for platform, as containerd's
// Client.Pull does, and unpacks it into the branch snapshotter while its
// layers arrive, but writes no image record (Client.Pull writes one before
// it returns, which a pull that fails later could only delete, or put
// back, after the fact) and labels no blob with where it came from (which
// would change blobs the node had before). The caller holds a lease on ctx
// until it records the image, then calls labelSource.
func fetchUnpacked(ctx context.Context, cc *containerd.Client, ref string, resolver remotes.Resolver, platform platforms.MatchComparer) (_ images.Image, retErr error) {
	name, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return images.Image{}, fmt.Errorf("resolve reference %q: %w", ref, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return images.Image{}, fmt.Errorf("fetcher for %q: %w", name, err)
	}
	caps, err := cc.GetSnapshotterCapabilities(ctx, snapshotterName)
	if err != nil {
		return images.Image{}, fmt.Errorf("capabilities of snapshotter %s: %w", snapshotterName, err)
	}
	cs := cc.ContentStore()
	unpacker, err := unpack.NewUnpacker(ctx, cs, unpack.WithUnpackPlatform(unpack.Platform{
		Platform:                platforms.All,
		SnapshotterKey:          snapshotterName,
		Snapshotter:             cc.SnapshotService(snapshotterName),
		Applier:                 cc.DiffService(),
		SnapshotterCapabilities: caps,
	}))
	if err != nil {
		return images.Image{}, fmt.Errorf("unpacker: %w", err)
	}
	defer func() {
		// Every unpack ends before the caller goes on (or cleans up).
		if _, err := unpacker.Wait(); err != nil && retErr == nil {
			retErr = fmt.Errorf("unpack: %w", err)
		}
	}()
	h := unpacker.Unpack(images.Handlers(remotes.FetchHandler(cs, fetcher), imageChildren(cs, platform)))
	if err := images.Dispatch(ctx, h, nil, desc); err != nil {
		return images.Image{}, err
	}
	ur, err := unpacker.Wait()
	if err != nil {
		return images.Image{}, fmt.Errorf("unpack: %w", err)
	}
	img := images.Image{Name: name, Target: desc}
	if ur.Unpacks == 0 {
		// Nothing was unpacked on the way (as containerd's pull, which
		// then unpacks what it fetched).
		if err := containerd.NewImageWithPlatform(cc, img, platform).Unpack(ctx, snapshotterName); err != nil {
			return images.Image{}, fmt.Errorf("unpack into snapshotter %s: %w", snapshotterName, err)
		}
	}
	return img, nil
}

// imageChildren is the children of an image's blobs for platform, with
// the garbage collector's labels from each blob to its children set, as
// containerd's pull finds them.
func imageChildren(cs content.Store, platform platforms.MatchComparer) images.Handler {
	h := images.SetChildrenMappedLabels(cs, images.ChildrenHandler(cs), nil)
	return images.LimitManifests(images.FilterPlatforms(h, platform), platform, 1)
}

// labelSource records on each blob of img (for platform) the registry
// repository it came from, as containerd's pull does, so that a later push
// to that registry mounts the blob rather than sending it. It is the last
// step of a pull that worked, and a hint: a failure is logged.
func labelSource(ctx context.Context, cc *containerd.Client, img images.Image, platform platforms.MatchComparer) {
	cs := cc.ContentStore()
	appendSource, err := docker.AppendDistributionSourceLabel(cs, img.Name)
	if err == nil {
		children := images.LimitManifests(images.FilterPlatforms(images.ChildrenHandler(cs), platform), platform, 1)
		err = images.Walk(ctx, images.Handlers(appendSource, children), img.Target)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("image", img.Name).Warn("label the blobs of a pulled image with their source")
	}
}
