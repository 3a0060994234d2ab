//go:build linux

package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/branch"
)

// Image is an image Build made, in containerd's content store.
type Image struct {
	// Root is what to push or tag: Manifest, or an index of Manifest and
	// the memory images of the checkpoints on its path taken with memory
	// (memory.go).
	Root ocispec.Descriptor
	// Manifest is the image's manifest.
	Manifest ocispec.Descriptor
	Config   ocispec.Descriptor
	// Layers are the manifest's layers: the base image's, then Change.
	Layers  []ocispec.Descriptor
	Change  ocispec.Descriptor
	Lineage Lineage
}

// Build makes an image of src in containerd's content store: the layers of
// the sandbox's image unchanged, then one layer of the branch's change
// (made by containerd's diff service, comparing a read-only view of the
// image with a read-only mount of the branch), a config from the image's
// with that layer added, and a manifest annotated with the lineage. The
// caller holds a lease on ctx (Push does), or the blobs may be collected
// before they are referenced.
func Build(ctx context.Context, client *containerd.Client, src Source) (Image, error) {
	ctr, err := client.LoadContainer(ctx, src.Sandbox)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return Image{}, fmt.Errorf("no sandbox %q in this namespace: %w", src.Sandbox, err)
		}
		return Image{}, fmt.Errorf("look up sandbox %s: %w", src.Sandbox, err)
	}
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return Image{}, fmt.Errorf("look up sandbox %s: %w", src.Sandbox, err)
	}
	if info.Image == "" || info.SnapshotKey == "" {
		return Image{}, fmt.Errorf("sandbox %s has no image or no rootfs snapshot to build on: %w", src.Sandbox, errdefs.ErrFailedPrecondition)
	}
	sn := client.SnapshotService(info.Snapshotter)
	rootMounts, err := sn.Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return Image{}, fmt.Errorf("sandbox %s: mounts of its rootfs: %w", src.Sandbox, err)
	}
	upper := upperOf(rootMounts)
	if _, err := branch.RootOfUpper(upper); err != nil {
		return Image{}, fmt.Errorf("sandbox %s: its rootfs is not from the branch snapshotter (snapshotter %q); run it with --snapshotter branch: %w", src.Sandbox, info.Snapshotter, errdefs.ErrFailedPrecondition)
	}
	path, branchID, err := statePath(ctx, upper, rootMounts, src)
	if err != nil {
		return Image{}, err
	}

	img, err := client.GetImage(ctx, info.Image)
	if err != nil {
		return Image{}, fmt.Errorf("sandbox %s: its image %s: %w", src.Sandbox, info.Image, err)
	}
	cs := client.ContentStore()
	platform := platforms.Default()
	manifest, err := images.Manifest(ctx, cs, img.Target(), platform)
	if err != nil {
		return Image{}, fmt.Errorf("sandbox %s: manifest of its image %s: %w", src.Sandbox, info.Image, err)
	}
	baseManifest, err := manifestDescriptor(ctx, cs, img.Target(), platform)
	if err != nil {
		return Image{}, fmt.Errorf("sandbox %s: manifest of its image %s: %w", src.Sandbox, info.Image, err)
	}
	var config ocispec.Image
	if err := readJSON(ctx, cs, manifest.Config, &config); err != nil {
		return Image{}, fmt.Errorf("sandbox %s: config of its image %s: %w", src.Sandbox, info.Image, err)
	}

	// The image's own snapshot, read-only: the lower side of the diff.
	chainID := identity.ChainID(config.RootFS.DiffIDs).String()
	viewKey := "branchbox-push-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lower, err := sn.View(ctx, viewKey, chainID)
	if err != nil {
		return Image{}, fmt.Errorf("sandbox %s: view of its image %s: %w", src.Sandbox, info.Image, err)
	}
	defer func() {
		if err := sn.Remove(context.WithoutCancel(ctx), viewKey); err != nil {
			log.G(ctx).WithError(err).WithField("key", viewKey).Warn("remove the image view of a push")
		}
	}()
	// One layer per state: its difference from the state before it.
	now := time.Now().UTC()
	var layers []ocispec.Descriptor
	var cks []CheckpointLayer
	memories := map[string]ocispec.Descriptor{}
	var memOrder []string
	prev := lower
	for _, st := range path {
		what := "the change of branch " + branchID + " of sandbox " + src.Sandbox
		if st.Checkpoint != "" {
			what = "checkpoint " + st.Checkpoint + " of branch " + branchID + " of sandbox " + src.Sandbox
		}
		l, diffID, err := layerOf(ctx, client, prev, st.Mounts)
		if err != nil {
			return Image{}, fmt.Errorf("%s: make the layer of %s: %w", src, what, err)
		}
		layers = append(layers, l)
		config.RootFS.DiffIDs = append(config.RootFS.DiffIDs, diffID)
		config.History = append(config.History, ocispec.History{Created: &now, CreatedBy: "branchbox push " + src.String(), Comment: what})
		if st.Checkpoint != "" {
			ck := CheckpointLayer{Name: st.Checkpoint, Layer: l.Digest}
			if st.MemoryDir != "" {
				m, err := memoryArtifact(ctx, client.ContentStore(), st.Checkpoint, st.MemoryDir)
				if err != nil {
					return Image{}, fmt.Errorf("%s: %w", src, err)
				}
				ck.Memory = m.Digest
				memories[st.Checkpoint] = m
				memOrder = append(memOrder, st.Checkpoint)
			}
			cks = append(cks, ck)
		}
		prev = st.Mounts
	}
	change := layers[len(layers)-1]
	config.Created = &now
	configBlob, err := json.Marshal(config)
	if err != nil {
		return Image{}, err
	}
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(configBlob), Size: int64(len(configBlob))}

	lineage := Lineage{
		Sandbox: src.Sandbox, Branch: branchID, BaseName: info.Image, BaseDigest: baseManifest.Digest,
		ChangeLayer: change.Digest, Checkpoints: cks, Version: Version,
	}
	for _, l := range manifest.Layers {
		lineage.ParentLayers = append(lineage.ParentLayers, l.Digest)
	}
	out := ocispec.Manifest{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		MediaType:   ocispec.MediaTypeImageManifest,
		Config:      configDesc,
		Layers:      append(append([]ocispec.Descriptor{}, manifest.Layers...), layers...),
		Annotations: lineage.Annotations(),
	}
	manifestBlob, err := json.Marshal(out)
	if err != nil {
		return Image{}, err
	}
	manifestDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manifestBlob), Size: int64(len(manifestBlob))}
	p := platforms.DefaultSpec()
	if config.OS != "" {
		p = ocispec.Platform{OS: config.OS, Architecture: config.Architecture, Variant: config.Variant}
	}
	manifestDesc.Platform = &p

	if err := writeBlob(ctx, cs, configDesc, configBlob, nil); err != nil {
		return Image{}, fmt.Errorf("%s: store the image config: %w", src, err)
	}
	// The manifest refers to its config and layers for containerd's
	// garbage collector, as a pulled one does.
	gc := map[string]string{"containerd.io/gc.ref.content.config": configDesc.Digest.String()}
	for i, l := range out.Layers {
		gc["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
	}
	if err := writeBlob(ctx, cs, manifestDesc, manifestBlob, gc); err != nil {
		return Image{}, fmt.Errorf("%s: store the image manifest: %w", src, err)
	}
	root := manifestDesc
	if len(memories) > 0 {
		if root, err = memoryIndex(ctx, cs, manifestDesc, memories, memOrder); err != nil {
			return Image{}, fmt.Errorf("%s: %w", src, err)
		}
	}
	return Image{Root: root, Manifest: manifestDesc, Config: configDesc, Layers: out.Layers, Change: change, Lineage: lineage}, nil
}

func upperOf(ms []mount.Mount) string {
	for _, m := range ms {
		for _, o := range m.Options {
			if u, ok := strings.CutPrefix(o, "upperdir="); ok {
				return u
			}
		}
	}
	return ""
}

// manifestDescriptor resolves target (an index or a manifest) to the
// descriptor of the manifest for platform.
func manifestDescriptor(ctx context.Context, cs content.Store, target ocispec.Descriptor, platform platforms.MatchComparer) (ocispec.Descriptor, error) {
	if images.IsManifestType(target.MediaType) {
		return target, nil
	}
	if !images.IsIndexType(target.MediaType) {
		return ocispec.Descriptor{}, fmt.Errorf("unknown image media type %s: %w", target.MediaType, errdefs.ErrNotImplemented)
	}
	var idx ocispec.Index
	if err := readJSON(ctx, cs, target, &idx); err != nil {
		return ocispec.Descriptor{}, err
	}
	for _, m := range idx.Manifests {
		if m.Platform == nil || platform.Match(*m.Platform) {
			if images.IsIndexType(m.MediaType) {
				return manifestDescriptor(ctx, cs, m, platform)
			}
			return m, nil
		}
	}
	return ocispec.Descriptor{}, fmt.Errorf("no manifest for %s in the image: %w", platforms.Format(platforms.DefaultSpec()), errdefs.ErrNotFound)
}

func readJSON(ctx context.Context, cs content.Provider, desc ocispec.Descriptor, v any) error {
	b, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// layerOf makes the layer of the difference between two states, and
// returns it with its diff id: from the directories the two stack over
// their common layers (layer.go) where both are such stacks, else with
// containerd's diff service.
func layerOf(ctx context.Context, client *containerd.Client, lower, upper []mount.Mount) (ocispec.Descriptor, digest.Digest, error) {
	if dirs, ok := diffDirs(lower, upper); ok {
		return writeLayer(ctx, client.ContentStore(), lower, upper, dirs)
	}
	log.G(ctx).Debug("states are not layer stacks: the diff service compares them whole")
	return compare(ctx, client, lower, upper)
}

// compare makes the layer of the difference between two states with
// containerd's diff service, and returns it with its diff id.
func compare(ctx context.Context, client *containerd.Client, lower, upper []mount.Mount) (ocispec.Descriptor, digest.Digest, error) {
	l, err := client.DiffService().Compare(ctx, lower, upper, diff.WithMediaType(ocispec.MediaTypeImageLayerGzip))
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	info, err := client.ContentStore().Info(ctx, l.Digest)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	diffID, err := digest.Parse(info.Labels[labels.LabelUncompressed])
	if err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("the layer has no uncompressed digest: %w", err)
	}
	return l, diffID, nil
}
