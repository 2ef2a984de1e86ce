package main

import (
	"testing"
	"time"

	"github.com/orderworker/orderworker/internal/config"
	"github.com/stretchr/testify/require"
)

// The suite itself is run by `make stress`; these tests only check its
// bookkeeping and stay well under a second.

func TestShortKeepsExplicitFlags(t *testing.T) {
	var c settings
	s := config.NewSet("stress", nil)
	v := declare(s, &c)
	require.NoError(t, s.Parse([]string{"-short", "-tasks", "500"}))
	v.applyShort(&c)
	require.Equal(t, 500, c.Tasks)
	require.Equal(t, 25*time.Second, c.Duration)
	require.Equal(t, 150*time.Second, c.DrainTimeout)
}

func TestArchiveClass(t *testing.T) {
	m := enqueued{Type: taskModify}
	tests := []struct {
		name, lastErr, want string
	}{
		{"exchanged", "modify S1: orders: order S1 is exchanged; its replacement is order S1-X1: skip retry for the task", "order:modify of an exchanged order"},
		{"not created: it must wait for the creation", "modify S1-X1: orders: order not found: skip retry for the task", "other: order:modify"},
		{"out of its budget", "failed 11 times, out of its failure budget of 10 retries: boom", "other: order:modify"},
		{"anything else", "asynq: task lease expired", "other: order:modify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, archiveClass(m, tt.lastErr))
		})
	}
}
