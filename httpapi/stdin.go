//go:build linux

package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/containerd/errdefs"
)

// An exec whose request is application/x-ndjson takes its standard input
// as it comes: the body's first line is the Exec, and each line after it an
// ExecInput, read while the output streams back (HTTP/1.1 full duplex). The
// body's end, or {"eof": true}, closes the process's stdin. The whole input
// is bounded by MaxBody.

// ExecInput is a line of an interactive exec's request after the first.
type ExecInput struct {
	Stdin *string `json:"stdin,omitempty"`
	EOF   bool    `json:"eof,omitempty"`
}

// interactive reads the Exec line of an interactive exec's body and
// returns the reader its later lines feed.
func (s *Server) interactive(w http.ResponseWriter, r request, req *Exec) (*bufio.Reader, error) {
	body := bufio.NewReader(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	line, err := body.ReadBytes('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(line) > int(s.cfg.MaxJSON) {
		return nil, fmt.Errorf("the exec line is over %d bytes: %w", s.cfg.MaxJSON, errdefs.ErrResourceExhausted)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return nil, fmt.Errorf("the body's first line, the exec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if req.Stdin != nil {
		return nil, fmt.Errorf("an interactive exec's stdin comes in the lines after the first, not in it: %w", errdefs.ErrInvalidArgument)
	}
	return body, nil
}

// feed copies the input lines into w until the input ends or says eof,
// then closes w (the process reads EOF). A malformed line ends the input
// with an error the process's stdin sees as EOF; the exec goes on.
func feed(body *bufio.Reader, w *io.PipeWriter) {
	for {
		line, err := body.ReadBytes('\n')
		if len(line) > 0 {
			var in ExecInput
			if jerr := json.Unmarshal(line, &in); jerr != nil {
				w.CloseWithError(fmt.Errorf("stdin line: %w", jerr))
				return
			}
			if in.Stdin != nil {
				if _, werr := io.WriteString(w, *in.Stdin); werr != nil {
					return // the process's stdin is closed
				}
			}
			if in.EOF {
				w.Close()
				return
			}
		}
		if err != nil {
			w.Close()
			return
		}
	}
}
