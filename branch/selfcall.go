package branch

import "encoding/json"

// SelfCallOutcome is how a call that copies its own caller ends: a memory
// fork or a checkpoint with memory a process asks for of its own branch
// through the branch socket. Such a call is made after the caller has let
// go of its connection, which a copy could not be given: the file
// SelfCallOutcomeFile(token) in the socket's directory holds the call's
// response (a shim ForkResponse or CheckpointResponse) or its error (a
// google.rpc.Status), both in protobuf's JSON; each copy of the caller
// restored from the image, in whichever branch and however much later,
// finds in its own socket directory the branch it runs in (Self).
type SelfCallOutcome struct {
	Self     string          `json:"self,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
	Error    json.RawMessage `json:"error,omitempty"`
}

// SelfCallOutcomeFile is the outcome's file name for a call's token.
func SelfCallOutcomeFile(token string) string { return "call-" + token + ".json" }
