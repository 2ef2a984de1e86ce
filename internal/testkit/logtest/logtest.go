// Package logtest collects what a process under test logs, for tests that
// wait for a log line: a [Sink] is an io.Writer (a process's stdout or
// stderr, or a logger's output) that keeps everything written and reads
// each line that is a JSON object, as orderworker's JSON log format
// writes them. It is test support, for _test.go files only.
package logtest

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// Line is one JSON log line, as decoded by encoding/json.
type Line = map[string]any

// Sink keeps everything written to it, and each line that is a JSON
// object. It is safe for concurrent use. The zero value is not ready: use
// [New].
type Sink struct {
	mu    sync.Mutex
	all   bytes.Buffer
	part  []byte // the start of a line not yet ended
	lines []Line
	added chan struct{} // closed, and replaced, when lines are added
}

// New returns an empty Sink.
func New() *Sink { return &Sink{added: make(chan struct{})} }

// Write keeps p; it never fails.
func (s *Sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all.Write(p)
	s.part = append(s.part, p...)
	n := len(s.lines)
	for {
		i := bytes.IndexByte(s.part, '\n')
		if i < 0 {
			break
		}
		var line Line
		if json.Unmarshal(s.part[:i], &line) == nil {
			s.lines = append(s.lines, line)
		}
		s.part = s.part[i+1:]
	}
	if len(s.lines) > n {
		close(s.added)
		s.added = make(chan struct{})
	}
	return len(p), nil
}

// String returns everything written so far.
func (s *Sink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all.String()
}

// Lines returns the JSON lines written so far, in order.
func (s *Sink) Lines() []Line {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Line(nil), s.lines...)
}

// Wait returns the first JSON line at index from or later for which match
// holds, and its index, waiting for it (woken by each write, never
// polling) up to timeout; then it fails tb with what names the line and
// everything written.
func (s *Sink) Wait(tb testing.TB, timeout time.Duration, what string, from int, match func(Line) bool) (Line, int) {
	tb.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for i := from; ; {
		s.mu.Lock()
		lines, added := s.lines, s.added
		s.mu.Unlock()
		for ; i < len(lines); i++ {
			if match(lines[i]) {
				return lines[i], i
			}
		}
		select {
		case <-added:
		case <-timer.C:
			tb.Fatalf("%s: no such log line within %v in:\n%s", what, timeout, s)
			return nil, -1
		}
	}
}
