// Package ociimage writes small OCI image archives from files of the host
// (a static busybox), for the demo, the tests and `make image` on machines
// that reach no registry.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// ImageRef is the name the test image is imported under.
const ImageRef = "docker.io/branchbox/busybox:test"

// epoch keeps the layer byte-identical between builds, so its digest is
// stable and imports are deduplicated.
var epoch = time.Unix(0, 0)

// WriteBusyboxImage writes an OCI image archive (an OCI layout in a tar, as
// `ctr images import` takes it) holding one layer: a static busybox with a
// link for every applet, and the directories a container needs.
func WriteBusyboxImage(w io.Writer) error {
	layer, err := busyboxLayer()
	if err != nil {
		return err
	}
	return WriteImage(w, ImageRef, ocispec.ImageConfig{
		Env:        []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"},
		Cmd:        []string{"/bin/sh"},
		WorkingDir: "/",
	}, layer)
}

// BusyboxLayer is the layer of the busybox test image (an uncompressed tar).
func BusyboxLayer() ([]byte, error) { return busyboxLayer() }

// WriteImage writes an OCI image archive named ref (its tag, after the last
// colon, is also the OCI ref name) with the given config and uncompressed
// tar layers, bottom first.
func WriteImage(w io.Writer, ref string, config ocispec.ImageConfig, layers ...[]byte) error {
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   config,
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	var layerDescs []ocispec.Descriptor
	for _, l := range layers {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digest.FromBytes(l))
		layerDescs = append(layerDescs, descriptor(ocispec.MediaTypeImageLayer, l))
	}
	cfgBlob, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    descriptor(ocispec.MediaTypeImageConfig, cfgBlob),
		Layers:    layerDescs,
	}
	manifestBlob, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	md := descriptor(ocispec.MediaTypeImageManifest, manifestBlob)
	md.Platform = &cfg.Platform
	md.Annotations = map[string]string{
		"io.containerd.image.name": ref,
		ocispec.AnnotationRefName:  ref[strings.LastIndexByte(ref, ':')+1:],
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{md},
	}
	indexBlob, err := json.Marshal(index)
	if err != nil {
		return err
	}
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})

	tw := tar.NewWriter(w)
	files := []struct {
		name string
		data []byte
	}{
		{ocispec.ImageLayoutFile, layout},
		{"index.json", indexBlob},
	}
	for _, l := range layers {
		files = append(files, struct {
			name string
			data []byte
		}{blobPath(l), l})
	}
	files = append(files, []struct {
		name string
		data []byte
	}{{blobPath(cfgBlob), cfgBlob}, {blobPath(manifestBlob), manifestBlob}}...)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.name] { // two identical layers are one blob
			continue
		}
		seen[f.name] = true
		if err := writeFile(tw, f.name, 0o644, f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// FileLayer returns a layer (an uncompressed tar) holding one executable
// file at name, with its parent directories.
func FileLayer(name string, mode int64, data []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	parts := strings.Split(strings.Trim(name, "/"), "/")
	for i := 1; i < len(parts); i++ {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts[:i], "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, strings.Join(parts, "/"), mode, data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteBusyboxImageFile writes the archive to path.
func WriteBusyboxImageFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteBusyboxImage(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func busyboxLayer() ([]byte, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read %s (install Debian's busybox-static): %w", BusyboxPath, err)
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []struct {
		name string
		mode int64
	}{
		{"bin/", 0o755}, {"dev/", 0o755}, {"etc/", 0o755}, {"proc/", 0o555}, {"root/", 0o700},
		{"sys/", 0o555}, {"tmp/", 0o1777}, {"usr/", 0o755}, {"var/", 0o755},
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, "bin/busybox", 0o755, bin); err != nil {
		return nil, err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := writeFile(tw, "etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")); err != nil {
		return nil, err
	}
	if err := writeFile(tw, "etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func descriptor(mediaType string, blob []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(blob), Size: int64(len(blob))}
}

func blobPath(blob []byte) string {
	return fmt.Sprintf("blobs/sha256/%x", sha256.Sum256(blob))
}
