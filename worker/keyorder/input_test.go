package keyorder_test

import (
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The engine refuses the task IDs, keys and queues it cannot carry: a
// label is "<queue> <id>", a wake list joins labels with newlines, and a
// release notice names the key before a space. Before, "t2\nkq victim"
// woke another program's task, and a key with a space was never woken.
func TestEngineRefusesWhatItCannotCarry(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	tests := []struct {
		name, key string
		opts      []asynq.Option
	}{
		{"newline in the task ID", "K", []asynq.Option{asynq.TaskID("t2\nkq victim")}},
		{"space in the task ID", "K", []asynq.Option{asynq.TaskID("t 2")}},
		{"control character in the task ID", "K", []asynq.Option{asynq.TaskID("t\x1b[31m")}},
		{"task ID too long", "K", []asynq.Option{asynq.TaskID(strings.Repeat("x", keyorder.MaxTaskIDLen+1))}},
		{"space in the key", "a b", nil},
		{"newline in the key", "line\nbreak", nil},
		{"escape in the key", "\x1b[31mred", nil},
		{"NUL in the key", "nul\x00", nil},
		{"bidirectional override in the key", "a\u202eb", nil},
		{"space in the queue", "K", []asynq.Option{asynq.Queue("k q")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Enqueue(t.Context(), tt.key, asynq.NewTask("t", []byte(`{}`)), tt.opts...)
			require.Error(t, err)
		})
	}
	_, err := c.Enqueue(t.Context(), "acct-42", asynq.NewTask("t", []byte(`{}`)), asynq.TaskID("ev-1.ok:x"), asynq.Queue("kq"))
	require.NoError(t, err, "an ordinary key and ID")
}

// A hold's reason and principal, and a skip's reason, are bounded and
// printable: they are stored in the key's sequence, which never expires
// while held. Before, a 1 MB reason with control characters was kept.
func TestHoldAndSkipReasonsAreBounded(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{})
	huge := strings.Repeat("r", 1<<20)
	require.Error(t, r.Hold(t.Context(), "K", "ops", huge))
	require.Error(t, r.Hold(t.Context(), "K", "ops", "bad\x07bell"))
	require.Error(t, r.Hold(t.Context(), "K", "o\u202eps", "why"))
	require.Error(t, r.Skip(t.Context(), "K", huge))
	require.Zero(t, db.Client.Exists(t.Context(), db.Prefix+"lock:{K}:seq").Val(), "nothing was stored")
	require.NoError(t, r.Hold(t.Context(), "K", "ops", strings.Repeat("r", keyorder.MaxReasonLen)))
}

// FuzzKeyCheck: a key the engine accepts never holds what its notices
// and labels split at.
func FuzzKeyCheck(f *testing.F) {
	for _, s := range []string{"SO1", "a b", "x\ny", "{K}", "é", "\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if keyorder.CheckKey(key) == nil {
			require.False(t, strings.ContainsAny(key, " \n\r\t{}\x00"), "%q", key)
			require.LessOrEqual(t, len(key), keyorder.MaxKeyLen)
		}
	})
}
