package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/labels"
	coci "github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// BenchmarkRegistry1GB: push and pull of a sandbox whose image has a 1 GB
// layer (64 files of random data) and whose change is 1 MB, against the
// same rootfs flattened into one layer (what a commit that does not share
// the base moves), in the same run, with the bytes each moves (moved-bytes:
// on push, the blobs sent, which the registry lacked in that repository;
// on pull, the blobs the registry served).
//
// push/impl=branch: branchbox's push of the sandbox to a registry that has
// the base (a fresh 1 MB change each time); push/impl=flattened: one layer
// of the whole rootfs made by containerd's diff service and pushed.
// pull/impl=branch: the pushed sandbox pulled to running, on a node that
// has the base (the same node, its copy of the change removed);
// pull/impl=flattened: the flattened image, pulled to running;
// pull/impl=change-alone: the change layer alone (over busybox's, to have
// a shell to run, which the node has), pulled to running.
// Targets: push moves at most 1.1x the compressed change; pull/branch
// within 2x of pull/change-alone.
func BenchmarkRegistry1GB(b *testing.B) {
	ctx, env, client, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	reg, err := daemons.StartRegistry(ctx, daemons.RegistryConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Stop()
	remote := oci.Remote{PlainHTTP: true}
	ctr := func(args ...string) string {
		b.Helper()
		out, err := env.Ctr(ctx, args...)
		if err != nil {
			b.Fatalf("ctr %v: %v", args, err)
		}
		return out
	}
	run := func(id, ref string) {
		b.Helper()
		ctr("run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", ref, id, "sh", "-c", "exec sleep 100000")
	}

	// The base: a sandbox given 1 GB, pushed as an image and run again
	// from it (its layers now on this node and in the registry). Its
	// files' mtimes are whole seconds, as a tar layer often leaves them.
	run("rg-src", ociimage.ImageRef)
	ctr("tasks", "exec", "--exec-id", "fill", "rg-src", "sh", "-c",
		"mkdir /base && for i in $(seq 64); do head -c 16777216 /dev/urandom > /base/f$i || exit 1; done && touch -d @1700000000 /base/*")
	base := reg.Ref("bench/base:1g")
	if _, err := oci.Push(ctx, client, oci.Source{Sandbox: "rg-src"}, base, remote); err != nil {
		b.Fatal(err)
	}
	benchRemoveCtr(env, "rg-src")
	// Pulled, as a user's base image is: its blobs then carry their
	// source, so a push to another repository of that registry mounts
	// them there rather than sending them again.
	ctr("images", "pull", "--plain-http", "--snapshotter", "branch", base)
	run("rg", base)
	defer benchRemoveCtr(env, "rg")
	newChange := func() {
		b.Helper()
		ctr("tasks", "exec", "--exec-id", "change", "rg", "sh", "-c", "head -c 1048576 /dev/urandom > /change")
	}
	baseCfg := imageConfig(b, ctx, client, base)

	moved := func(before map[string]int64) int64 {
		b.Helper()
		after, err := reg.BlobSizes()
		if err != nil {
			b.Fatal(err)
		}
		var n int64
		for d, size := range after {
			if _, ok := before[d]; !ok {
				n += size
			}
		}
		return n
	}
	blobs := func() map[string]int64 {
		b.Helper()
		m, err := reg.BlobSizes()
		if err != nil {
			b.Fatal(err)
		}
		return m
	}

	// A first push to the sandbox's repository sends busybox's layer: it
	// was imported, not pulled, so it carries no source to mount from
	// (the 1 GB layer does, and is mounted). The rows measure the pushes
	// after it, as a user pushes again after more work.
	if _, err := oci.Push(ctx, client, oci.Source{Sandbox: "rg"}, reg.Ref("bench/rg:first"), remote); err != nil {
		b.Fatal(err)
	}
	var last oci.PushResult
	i := 0
	b.Run("push/impl=branch", func(b *testing.B) {
		var total, change int64
		for b.Loop() {
			b.StopTimer()
			newChange()
			quiesce(b)
			b.StartTimer()
			res, err := oci.Push(ctx, client, oci.Source{Sandbox: "rg"}, reg.Ref("bench/rg:"+strconv.Itoa(i)), remote)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			i++
			last = res
			// What went on the wire: the registry keeps one copy of a blob
			// for all its repositories, so its storage would not show a
			// base sent again to another repository.
			total += res.Sent.Bytes
			change += res.Image.Change.Size
			b.StartTimer()
		}
		b.ReportMetric(float64(total)/float64(b.N), "moved-bytes")
		b.ReportMetric(float64(change)/float64(b.N), "change-bytes")
	})
	var flat string
	b.Run("push/impl=flattened", func(b *testing.B) {
		var total int64
		for b.Loop() {
			b.StopTimer()
			newChange()
			before := blobs()
			quiesce(b)
			b.StartTimer()
			flat = reg.Ref("bench/flat:" + strconv.Itoa(i))
			pushFlattened(b, ctx, client, "rg", baseCfg, flat)
			b.StopTimer()
			i++
			total += moved(before)
			b.StartTimer()
		}
		b.ReportMetric(float64(total)/float64(b.N), "moved-bytes")
	})
	if last.Ref == "" || flat == "" {
		b.Skip("the push rows did not run: nothing to pull")
	}
	// The change alone, over the shell it is run with: an image of the
	// change layer on busybox's (this node has busybox, as it has the
	// base): the same pull and start as the branch's with a 2 MB base.
	alone := reg.Ref("bench/alone:1")
	changeDiffID := layerDiffID(b, ctx, client, last.Image.Change.Digest)
	pushImage(b, ctx, client, baseCfg, []ocispec.Descriptor{last.Image.Layers[0], last.Image.Change},
		[]digest.Digest{baseCfg.RootFS.DiffIDs[0], changeDiffID}, alone)

	// Each pull starts from a node without that image: its record, what
	// only it references (the change, or the flattened layer) and its
	// container removed, synchronously collected. The base stays.
	forget := func(ref string) {
		b.Helper()
		ctr("images", "rm", "--sync", ref)
	}
	forget(last.Ref)
	forget(flat)
	forget(alone)
	downloaded := func(from int) int64 {
		var n int64
		for _, d := range reg.BlobDownloads()[from:] {
			n += d.Bytes
		}
		return n
	}
	for _, row := range []struct{ impl, ref string }{{"branch", last.Ref}, {"change-alone", alone}, {"flattened", flat}} {
		b.Run("pull/impl="+row.impl, func(b *testing.B) {
			var total int64
			for b.Loop() {
				b.StopTimer()
				quiesce(b)
				from := len(reg.BlobDownloads())
				b.StartTimer()
				img, err := client.Pull(ctx, row.ref, containerd.WithPullUnpack, containerd.WithPullSnapshotter("branch"), containerd.WithResolver(plainHTTP(ctx)))
				if err != nil {
					b.Fatal(err)
				}
				id := "rgpull-" + strconv.Itoa(i)
				startFrom(b, ctx, client, img, id)
				b.StopTimer()
				i++
				total += downloaded(from)
				benchRemoveCtr(env, id)
				forget(row.ref)
				b.StartTimer()
			}
			b.ReportMetric(float64(total)/float64(b.N), "moved-bytes")
		})
	}
}

// imageConfig reads the config of the image named ref.
func imageConfig(b *testing.B, ctx context.Context, client *containerd.Client, ref string) ocispec.Image {
	b.Helper()
	img, err := client.GetImage(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}
	desc, err := img.Config(ctx)
	if err != nil {
		b.Fatal(err)
	}
	blob, err := content.ReadBlob(ctx, client.ContentStore(), desc)
	if err != nil {
		b.Fatal(err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(blob, &cfg); err != nil {
		b.Fatal(err)
	}
	return cfg
}

// layerDiffID is the uncompressed digest containerd recorded for a layer.
func layerDiffID(b *testing.B, ctx context.Context, client *containerd.Client, layer digest.Digest) digest.Digest {
	b.Helper()
	info, err := client.ContentStore().Info(ctx, layer)
	if err != nil {
		b.Fatal(err)
	}
	d, err := digest.Parse(info.Labels[labels.LabelUncompressed])
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// pushFlattened makes one layer of container id's whole rootfs with
// containerd's diff service (against an empty tree) and pushes an image of
// it alone.
func pushFlattened(b *testing.B, ctx context.Context, client *containerd.Client, id string, cfg ocispec.Image, ref string) {
	b.Helper()
	ctx, done, err := client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	defer done(context.WithoutCancel(ctx))
	c, err := client.LoadContainer(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	ms, err := client.SnapshotService(info.Snapshotter).Mounts(ctx, info.SnapshotKey)
	if err != nil {
		b.Fatal(err)
	}
	layer, err := client.DiffService().Compare(ctx, nil, ms, diff.WithMediaType(ocispec.MediaTypeImageLayerGzip))
	if err != nil {
		b.Fatal(err)
	}
	pushImage(b, ctx, client, cfg, []ocispec.Descriptor{layer}, []digest.Digest{layerDiffID(b, ctx, client, layer.Digest)}, ref)
}

// pushImage writes a config (cfg with the given layers) and a manifest to
// the content store and pushes them with the layers to ref, over plain
// HTTP.
func pushImage(b *testing.B, ctx context.Context, client *containerd.Client, cfg ocispec.Image, layers []ocispec.Descriptor, diffIDs []digest.Digest, ref string) {
	b.Helper()
	ctx, done, err := client.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	defer done(context.WithoutCancel(ctx))
	cfg.RootFS.DiffIDs, cfg.History = diffIDs, nil
	cfgBlob, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfgDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfgBlob), Size: int64(len(cfgBlob))}
	m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfgDesc, Layers: layers}
	mBlob, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	mDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(mBlob), Size: int64(len(mBlob))}
	cs := client.ContentStore()
	for _, blob := range []struct {
		desc ocispec.Descriptor
		data []byte
	}{{cfgDesc, cfgBlob}, {mDesc, mBlob}} {
		if err := content.WriteBlob(ctx, cs, "bench-"+blob.desc.Digest.String(), bytes.NewReader(blob.data), blob.desc); err != nil {
			b.Fatal(err)
		}
	}
	if err := client.Push(ctx, ref, mDesc, containerd.WithResolver(plainHTTP(ctx))); err != nil {
		b.Fatal(err)
	}
	if _, err := client.ImageService().Create(ctx, images.Image{Name: ref, Target: mDesc}); err != nil {
		b.Fatal(fmt.Errorf("record %s: %w", ref, err))
	}
}

// plainHTTP resolves references over plain HTTP (the bench's registry).
func plainHTTP(ctx context.Context) remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: config.ConfigureHosts(ctx, config.HostOptions{DefaultScheme: "http"})})
}

// startFrom runs a sandbox of img on the branch snapshotter and runtime,
// as ctr run does, and returns once its task has started.
func startFrom(b *testing.B, ctx context.Context, client *containerd.Client, img containerd.Image, id string) {
	b.Helper()
	c, err := client.NewContainer(ctx, id, containerd.WithSnapshotter("branch"), containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime(branchRuntime, nil),
		containerd.WithNewSpec(coci.WithImageConfig(img), coci.WithProcessArgs("sleep", "100000")))
	if err != nil {
		b.Fatal(err)
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		b.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		b.Fatal(err)
	}
}
