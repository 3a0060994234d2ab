// Package patterns runs exploration patterns over a sandbox's
// branches: speculate (first to succeed wins), best-of-n, tournament,
// reflexion, beam and tree search. It needs only a Brancher, which
// *client.SandboxClient satisfies.
package patterns
