package branch

import (
	"slices"
	"testing"
)

func TestSubtree(t *testing.T) {
	parents := map[string]string{"0": "", "1": "0", "2": "0", "10": "1", "3": "1", "4": "3", "5": "2"}
	for _, tc := range []struct {
		root string
		want []string
	}{
		{"0", []string{"0", "1", "2", "3", "10", "5", "4"}},
		{"1", []string{"1", "3", "10", "4"}},
		{"4", []string{"4"}},
		{"99", []string{"99"}},
	} {
		if got := Subtree(tc.root, parents); !slices.Equal(got, tc.want) {
			t.Errorf("Subtree(%s) = %v, want %v", tc.root, got, tc.want)
		}
	}
	// A cycle (a corrupt tree) ends the walk instead of looping.
	cyc := map[string]string{"1": "2", "2": "1"}
	if got := Subtree("1", cyc); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("Subtree of a cycle = %v", got)
	}
}
