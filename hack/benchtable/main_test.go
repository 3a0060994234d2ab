package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
BenchmarkPrepareMounts/impl=branch-2     200  4000000 ns/op
BenchmarkPrepareMounts/impl=overlayfs-2  200  2000000 ns/op
BenchmarkPrepareMounts/impl=branch-2     200  5000000 ns/op
BenchmarkPrepareMounts/impl=overlayfs-2  200  3000000 ns/op
BenchmarkPrepareMounts/impl=branch-2     200  4500000 ns/op
BenchmarkPrepareMounts/impl=overlayfs-2  200  2500000 ns/op
BenchmarkOther-2  10 5 ns/op
BenchmarkFork/impl=branch-2  10 1000000 ns/op  125000 ns/child
BenchmarkFork/impl=cp-a-2  1 9000000000 ns/op
PASS
`
	var out bytes.Buffer
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"BenchmarkPrepareMounts", "4.5ms", "overlayfs", "2.5ms", "1.8x", "3/3", "0.000111x", "125µs"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "BenchmarkOther") {
		t.Errorf("benchmark without impl= listed:\n%s", got)
	}
}

func TestNoResults(t *testing.T) {
	if err := run(strings.NewReader("PASS\n"), &bytes.Buffer{}); err == nil {
		t.Fatal("want an error when nothing was measured")
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {nil, 0}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
