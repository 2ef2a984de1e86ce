package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The bench itself is run by `make bench`; these tests only check its
// bookkeeping and stay well under a second.

func TestScenarios(t *testing.T) {
	c := settings{Tasks: 100, Hot: 10, HotTasks: 50, SeedHotTasks: 20}
	var names []string
	for _, sc := range scenarios(c) {
		names = append(names, sc.Name)
		if sc.Name == "c-contended" {
			require.Equal(t, 20, sc.Tasks)
			require.NotEmpty(t, sc.Note)
		}
	}
	require.Equal(t, []string{"a-uncontended", "b-uncontended", "c-uncontended", "a-contended", "b-contended", "c-contended"}, names)
	require.Equal(t, "H3", orderNo(scenario{Contended: true, Orders: 10}, 13))
	require.Equal(t, "U000013", orderNo(scenario{Orders: 100}, 13))
}

func TestRatiosAndTargets(t *testing.T) {
	rep := report{Results: []result{
		{Scenario: "a-uncontended", TasksPerS: 1000},
		{Scenario: "b-uncontended", TasksPerS: 900},
		{Scenario: "a-contended", TasksPerS: 1000},
		{Scenario: "b-contended", TasksPerS: 500, Handoffs: 10, HandoffP99: 2},
		{Scenario: "c-contended", TasksPerS: 50, Handoffs: 10, HandoffP99: 800},
	}}
	rep.ratios()
	require.InDelta(t, 0.9, rep.find("b-uncontended").RatioToA, 1e-9)
	met := map[string]bool{}
	for _, tg := range rep.Targets {
		met[tg.Name] = tg.Met
	}
	require.Equal(t, map[string]bool{
		"(b)/(a) uncontended": true, "(b)/(a) contended": false,
		"(b) hand-off p99 ms": true, "(c)/(b) hand-off p99": true,
	}, met)
}

func TestParseReplicas(t *testing.T) {
	got, err := parseReplicas([]string{"1", " 2", "4"})
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 4}, got)
	_, err = parseReplicas([]string{"0"})
	require.Error(t, err)
}

func TestSleepHonoursContext(t *testing.T) {
	require.NoError(t, sleep(t.Context(), time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, sleep(ctx, time.Hour), context.Canceled)
}
