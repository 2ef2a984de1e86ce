package main

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/orderworker/orderworker/internal/testkit/orderapitest"
	"github.com/orderworker/orderworker/tools/stress/history"
	"github.com/orderworker/orderworker/worker/orders"
)

// storeHistory is the history of what the order store accepted, from its
// histories hist (the Redis store's, or, with -store http, the upstream's
// store's), with each write's body from what the suite seeded and
// enqueued: the history checker's input. An entry of an event the suite
// never enqueued gets no body (the replay then differs, and check
// reports the event as unknown too).
func storeHistory(hist map[string][]orders.Entry, l *load) history.History {
	byEvent := map[string]enqueued{}
	for _, t := range l.tasks {
		byEvent[t.EventID] = t
	}
	h := history.History{}
	for no, entries := range hist {
		for _, e := range entries {
			w, ok := history.FromEntry(no, e)
			if !ok {
				continue
			}
			t := byEvent[e.EventID]
			switch w.Kind {
			case history.KindPut:
				w.Put = orders.Order{Address: seedAddress, Items: seedItems}
			case history.KindModify:
				w.Changes = orders.Changes(t.Changes)
			case history.KindExchange:
				w.Exchange = orders.Exchange{Items: t.Items, NewOrderNo: t.NewNo}
			case history.KindCreated:
				w.Exchange, w.From = orders.Exchange{Items: t.Items, NewOrderNo: no}, t.OrderNo
			}
			h[no] = append(h[no], w)
		}
	}
	return h
}

// finalOrders reads every order of nos from store, as the history checker
// compares them.
func finalOrders(ctx context.Context, store orders.Store, nos []string) (map[string]orders.Order, error) {
	out := make(map[string]orders.Order, len(nos))
	for _, no := range nos {
		o, err := store.Get(ctx, no)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", no, err)
		}
		out[no] = o
	}
	return out, nil
}

// findingLines is each finding as a line.
func findingLines(found []history.Finding) []string {
	out := make([]string, len(found))
	for i, f := range found {
		out[i] = f.String()
	}
	return out
}

// apiLog is what the order API's log shows with -store http.
type apiLog struct {
	accepted, replayed int
	refused            map[string]int // "status code" → writes
	findings           []string       // the history checker's, over the log
}

// checkLog runs the history checker over the upstream's log, against its
// store's orders now.
func checkLog(ctx context.Context, log orderapitest.Log, u *upstream, nos []string) (*apiLog, error) {
	a := &apiLog{refused: map[string]int{}}
	for _, r := range log.Records {
		switch {
		case r.Accepted() && r.Replayed:
			a.replayed++
		case r.Accepted():
			a.accepted++
		default:
			a.refused[fmt.Sprintf("%d %s", r.Status, r.Code)]++
		}
	}
	h, err := history.FromLog(log)
	if err != nil {
		return nil, fmt.Errorf("the order API's log: %w", err)
	}
	// Every order the log names, and every order the store has.
	all := slices.Sorted(maps.Keys(h))
	for _, no := range nos {
		if _, ok := h[no]; !ok {
			all = append(all, no)
		}
	}
	final, err := finalOrders(ctx, u.store, all)
	if err != nil {
		return nil, err
	}
	a.findings = findingLines(history.Check(h, final))
	return a, nil
}
