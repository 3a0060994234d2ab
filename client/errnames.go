//go:build linux

package client

import "strings"

// shimErr is fromTTRPC, with the sandbox's id in the shim's words
// replaced by the name the caller gave it, if another: the shim knows
// only the container id, a nerdctl user the name.
func (s *SandboxClient) shimErr(err error) error {
	err = fromTTRPC(err)
	if err == nil || s.name == "" {
		return err
	}
	msg, n := replaceWord(err.Error(), s.ID, s.name)
	if n == 0 {
		return err
	}
	return &namedError{err: err, msg: msg}
}

// replaceWord replaces each occurrence of word in text that is not part of
// a longer name (no letter, digit, '_', '.' or '-' either side, but for a
// full stop), and says how many it replaced.
func replaceWord(text, word, with string) (string, int) {
	inName := func(c byte) bool {
		return c == '_' || c == '.' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	var b strings.Builder
	n := 0
	for {
		i := strings.Index(text, word)
		if i < 0 || word == "" {
			b.WriteString(text)
			return b.String(), n
		}
		j := i + len(word)
		// A '.' that ends a sentence is not part of the name.
		after := j < len(text) && inName(text[j]) && !(text[j] == '.' && (j+1 == len(text) || !inName(text[j+1])))
		if (i > 0 && inName(text[i-1])) || after {
			b.WriteString(text[:j])
		} else {
			b.WriteString(text[:i])
			b.WriteString(with)
			n++
		}
		text = text[j:]
	}
}

// namedError is an error whose words name the sandbox as the caller did;
// it is still the shim's error (errdefs kinds, stale errors) underneath.
type namedError struct {
	err error
	msg string
}

func (e *namedError) Error() string { return e.msg }
func (e *namedError) Unwrap() error { return e.err }
