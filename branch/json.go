package branch

import "encoding/json"

// checkpointJSON is a Checkpoint as JSON has it: its branch under the key
// "branch" and under "context", the key's name before a node of the tree
// was called a branch, which clients built before the rename read
// (deprecated, removed in the release after next: docs/design.md#names).
type checkpointJSON struct {
	plainCheckpoint
	BranchKey string `json:"branch"`
}

// plainCheckpoint is Checkpoint without its methods, so that marshalling
// it does not call them again.
type plainCheckpoint Checkpoint

// MarshalJSON writes the branch under both keys.
func (c Checkpoint) MarshalJSON() ([]byte, error) {
	return json.Marshal(checkpointJSON{plainCheckpoint(c), c.Branch})
}

// UnmarshalJSON reads the branch from either key, "branch" first.
func (c *Checkpoint) UnmarshalJSON(b []byte) error {
	var v checkpointJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = Checkpoint(v.plainCheckpoint)
	if v.BranchKey != "" {
		c.Branch = v.BranchKey
	}
	return nil
}
