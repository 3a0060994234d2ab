package branch

import "encoding/json"

// SelfForkOutcome is how a memory fork a process asked for of its own
// context through the branch socket ends (it is made after the call, once
// the caller holds no connection a copy could not be given): the file
// SelfForkOutcomeFile(token) in the socket's directory holds the fork's
// response (a shim ForkResponse) or its error (a google.rpc.Status), both
// in protobuf's JSON, and in each branch's socket directory, which is that
// copy's /run/branchbox, the branch the copy runs in.
type SelfForkOutcome struct {
	Self     string          `json:"self,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
	Error    json.RawMessage `json:"error,omitempty"`
}

// SelfForkOutcomeFile is the outcome's file name for a fork's token.
func SelfForkOutcomeFile(token string) string { return "fork-" + token + ".json" }
