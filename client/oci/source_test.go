package oci

import (
	"reflect"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

func TestParseSource(t *testing.T) {
	for in, want := range map[string]Source{
		"sb":       {Sandbox: "sb"},
		"sb/3":     {Sandbox: "sb", Branch: "3"},
		"sb/0":     {Sandbox: "sb"},
		"sb@first": {Sandbox: "sb", Checkpoint: "first"},
	} {
		got, err := ParseSource(in)
		if err != nil || got != want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/3", "sb/", "sb@", "sb/3@x", "sb/3/4", "@x"} {
		if _, err := ParseSource(in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseSource(%q): %v, want an invalid argument", in, err)
		}
	}
}

func TestLineageRoundTrip(t *testing.T) {
	l := Lineage{
		Sandbox: "sb", Branch: "2", BaseName: "docker.io/library/busybox:latest", BaseDigest: digest.FromString("m"),
		ParentLayers: []digest.Digest{digest.FromString("a"), digest.FromString("b")},
		ChangeLayer:  digest.FromString("c"),
		Checkpoints:  []CheckpointLayer{{Name: "first", Layer: digest.FromString("k1")}, {Name: "second", Layer: digest.FromString("k2")}},
		Version:      Version,
	}
	got, ok := LineageOf(l.Annotations())
	if !ok || !reflect.DeepEqual(got, l) {
		t.Fatalf("LineageOf(Annotations()) = %+v, %v; want %+v", got, ok, l)
	}
	if _, ok := LineageOf(map[string]string{"org.opencontainers.image.title": "x"}); ok {
		t.Fatal("an image branchbox did not make reads as one of its own")
	}
}
