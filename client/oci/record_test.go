//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// memImages is an image store in memory whose writes of one name fail.
type memImages struct {
	imgs   map[string]images.Image
	failOn string
}

func (m *memImages) Get(_ context.Context, name string) (images.Image, error) {
	if i, ok := m.imgs[name]; ok {
		return i, nil
	}
	return images.Image{}, fmt.Errorf("image %s: %w", name, errdefs.ErrNotFound)
}

func (m *memImages) List(context.Context, ...string) ([]images.Image, error) {
	return nil, errdefs.ErrNotImplemented
}

func (m *memImages) Create(_ context.Context, i images.Image) (images.Image, error) {
	if i.Name == m.failOn {
		return images.Image{}, errors.New("store refused")
	}
	if _, ok := m.imgs[i.Name]; ok {
		return images.Image{}, errdefs.ErrAlreadyExists
	}
	m.imgs[i.Name] = i
	return i, nil
}

func (m *memImages) Update(_ context.Context, i images.Image, fields ...string) (images.Image, error) {
	if i.Name == m.failOn {
		return images.Image{}, errors.New("store refused")
	}
	cur, ok := m.imgs[i.Name]
	if !ok {
		return images.Image{}, errdefs.ErrNotFound
	}
	for _, f := range fields {
		switch f {
		case "target":
			cur.Target = i.Target
		case "labels":
			cur.Labels = i.Labels
		default:
			return images.Image{}, fmt.Errorf("field %s: %w", f, errdefs.ErrNotImplemented)
		}
	}
	m.imgs[i.Name] = cur
	return cur, nil
}

func (m *memImages) Delete(_ context.Context, name string, _ ...images.DeleteOpt) error {
	if _, ok := m.imgs[name]; !ok {
		return errdefs.ErrNotFound
	}
	delete(m.imgs, name)
	return nil
}

// TestRecordImagesAllOrNone: records are written in order; when one
// fails, those written before it are put back (a new one deleted, an
// existing one's fields as they were) and the store is as before.
func TestRecordImagesAllOrNone(t *testing.T) {
	img := func(name, content string, labels map[string]string) images.Image {
		return images.Image{Name: name, Labels: labels, Target: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString(content), Size: 1}}
	}
	old := img("app:v1", "old", map[string]string{"k": "old"})
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		fields []string
		failOn string
		want   map[string]images.Image
	}{
		{"all written", []string{"target"}, "", map[string]images.Image{
			"app:v1": img("app:v1", "new", map[string]string{"k": "old"}), "other:v1": img("other:v1", "other", nil), "new:v1": img("new:v1", "n", nil)}},
		{"labels too", []string{"target", "labels"}, "", map[string]images.Image{
			"app:v1": img("app:v1", "new", nil), "other:v1": img("other:v1", "other", nil), "new:v1": img("new:v1", "n", nil)}},
		{"the last fails", []string{"target", "labels"}, "new:v1", map[string]images.Image{"app:v1": old}},
		{"the first fails", []string{"target"}, "other:v1", map[string]images.Image{"app:v1": old}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &memImages{imgs: map[string]images.Image{"app:v1": old}, failOn: c.failOn}
			err := recordImages(ctx, st, []images.Image{img("other:v1", "other", nil), img("app:v1", "new", nil), img("new:v1", "n", nil)}, c.fields...)
			if (err != nil) != (c.failOn != "") {
				t.Fatalf("recordImages: %v", err)
			}
			if !maps.EqualFunc(st.imgs, c.want, func(a, b images.Image) bool {
				return a.Name == b.Name && a.Target.Digest == b.Target.Digest && maps.Equal(a.Labels, b.Labels)
			}) {
				t.Fatalf("store holds %+v, want %+v", st.imgs, c.want)
			}
		})
	}
}
