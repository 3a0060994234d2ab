package branch

// Subtree returns root and every descendant of it in the forest that
// parents describes (a branch's id to its parent's id), parents before
// children, siblings in numeric order. It is the one walk of a branch tree:
// the snapshotter's Tree, the shim's running branches and the in-sandbox
// API's view of the caller's part of the tree all use it. A node is listed
// once even if parents has a cycle.
func Subtree(root string, parents map[string]string) []string {
	kids := map[string][]string{}
	for id, p := range parents {
		kids[p] = append(kids[p], id)
	}
	out := []string{root}
	seen := map[string]bool{root: true}
	for i := 0; i < len(out); i++ {
		c := kids[out[i]]
		sortIDs(c)
		for _, k := range c {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}
