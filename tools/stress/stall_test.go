package main

import (
	"testing"
	"time"
)

// TestPromotionWaits checks the bound on a hot order's wait after a
// promotion on synthetic runs: a wait past it with no nemesis on the
// order's workers is a stall; one with a nemesis is listed only; a change
// accepted after the promotion is measured from its acceptance; an order
// with nothing run after the promotion, or only a change run again, is not
// measured.
func TestPromotionWaits(t *testing.T) {
	p := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return p.Add(d) }
	switches := []switched{
		{name: "never served", began: time.Second}, // no promotion seen: skipped
		{name: "failover", began: 10 * time.Second, served: p},
	}
	runs := map[string][]hotRun{
		"FAST":   {{at: at(-time.Second), event: "f1", slot: 0}, {at: at(300 * time.Millisecond), event: "f2", slot: 0}},
		"SLOW":   {{at: at(-time.Second), event: "s1", slot: 1}, {at: at(2500 * time.Millisecond), event: "s2", slot: 1}},
		"KILLED": {{at: at(-time.Second), event: "k1", slot: 2}, {at: at(8 * time.Second), event: "k2", slot: 3}},
		"LATE":   {{at: at(-time.Second), event: "l1", slot: 1}, {at: at(5200 * time.Millisecond), event: "l2", slot: 1}},
		"RESET":  {{at: at(-time.Second), event: "r1", slot: 4}, {at: at(9 * time.Second), event: "r2", slot: 4}},
		// Its change run again (a task brought back) waited for nothing.
		"DRAINED": {{at: at(-3 * time.Second), event: "d1", slot: 0}, {at: at(30 * time.Second), event: "d1", slot: 1}},
	}
	accepted := map[string]time.Time{"l2": at(5 * time.Second), "s2": at(-2 * time.Second)}
	var tl troubleLog
	tl.all = []trouble{
		{slot: 2, kind: "SIGKILL", from: at(-2 * time.Second), to: at(40 * time.Second)},
		{slot: 1, kind: "link cut", from: at(-20 * time.Second), to: at(-10 * time.Second)}, // over before the window
		// A reset in the window, over long before the first run: no excuse.
		{slot: 4, kind: "link reset", from: at(100 * time.Millisecond), to: at(1100 * time.Millisecond)},
	}
	nos := []string{"FAST", "SLOW", "KILLED", "LATE", "DRAINED", "RESET"}
	all, stalls := promotionWaits(switches, nos, runs, accepted, &tl, 5*time.Second)

	want := map[string]time.Duration{"FAST": 300 * time.Millisecond, "SLOW": 2500 * time.Millisecond, "KILLED": 8 * time.Second,
		"LATE": 200 * time.Millisecond, "RESET": 9 * time.Second}
	if len(all) != len(want) {
		t.Fatalf("measured %d waits, want %d: %v", len(all), len(want), all)
	}
	for _, w := range all {
		if w.wait != want[w.orderNo] {
			t.Errorf("%s waited %v, want %v", w.orderNo, w.wait, want[w.orderNo])
		}
		if got := len(w.explained) > 0; got != (w.orderNo == "KILLED" || w.orderNo == "RESET") {
			t.Errorf("%s explained by %v", w.orderNo, w.explained)
		}
	}
	if len(stalls) != 2 || stalls[0].orderNo != "SLOW" || stalls[1].orderNo != "RESET" {
		t.Fatalf("stalls %v, want SLOW's and RESET's", stalls)
	}
}
