package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/internal/lock"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
)

// notePayload is the payload of order:note, a kind that only this test
// knows: it appends a note to an order. Seq is its last field, as in the
// contract's payloads (the producer appends the position to the JSON).
type notePayload struct {
	EventID string              `json:"event_id"`
	OrderNo string              `json:"order_no"`
	Note    string              `json:"note"`
	Trace   *tasks.TraceContext `json:"trace,omitempty"`
	Seq     int64               `json:"seq,omitempty"`
}

// noteKind is the test's kind, made as the contract's are. It is added
// to the producer and the worker through their Config.Kinds, and nowhere
// else.
var noteKind = tasks.NewKind[notePayload]("order:note", "note", "order_note", 2)

func (p notePayload) Kind() *tasks.Kind { return noteKind }

func (p notePayload) Header() tasks.Header {
	return tasks.Header{EventID: p.EventID, OrderNo: p.OrderNo, Seq: p.Seq, Trace: p.Trace}
}

func (p notePayload) WithHeader(h tasks.Header) tasks.Payload {
	p.EventID, p.OrderNo, p.Seq, p.Trace = h.EventID, h.OrderNo, h.Seq, h.Trace
	return p
}

func (p notePayload) Validate() error {
	if !tasks.ValidEventID(p.EventID) || !tasks.ValidOrderNo(p.OrderNo) || p.Note == "" {
		return fmt.Errorf("%w: bad note %+v: %w", tasks.ErrInvalid, p, asynq.SkipRetry)
	}
	return nil
}

// applied is one write the fake store took: its event, position and fence.
type applied struct {
	EventID string
	Seq     int64
}

// noteStore is a fake order store: the test's Redis store for modifies,
// plus notes. It records every write in the order it came, and checks
// that each carries a fence no older than the order's last one and that no
// two writes of one order overlap: the lock's exclusion.
type noteStore struct {
	orders.Store
	mu     sync.Mutex
	writes map[string][]applied // by order
	fences map[string]int64     // newest fence by order
	busy   map[string]bool      // a write of the order is under way
	notes  map[string][]string  // by order
}

func newNoteStore(inner orders.Store) *noteStore {
	return &noteStore{Store: inner, writes: map[string][]applied{}, fences: map[string]int64{},
		busy: map[string]bool{}, notes: map[string][]string{}}
}

// write runs f as a write of order no, after the checks.
func (s *noteStore) write(ctx context.Context, eventID, no string, f func() error) error {
	w, ok := orders.WriteFrom(ctx)
	s.mu.Lock()
	switch {
	case !ok || w.Fence <= 0:
		s.mu.Unlock()
		return orders.ErrNoFence
	case w.Fence < s.fences[no]:
		s.mu.Unlock()
		return orders.ErrStaleFence
	case s.busy[no]:
		s.mu.Unlock()
		return fmt.Errorf("two writes of %s at once", no)
	}
	s.busy[no], s.fences[no] = true, w.Fence
	s.mu.Unlock()
	err := f()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy[no] = false
	if err == nil {
		s.writes[no] = append(s.writes[no], applied{eventID, w.Seq})
	}
	return err
}

func (s *noteStore) Modify(ctx context.Context, eventID, no string, c orders.Changes) (orders.Result, error) {
	var r orders.Result
	err := s.write(ctx, eventID, no, func() (err error) {
		r, err = s.Store.Modify(ctx, eventID, no, c)
		return err
	})
	return r, err
}

func (s *noteStore) Note(ctx context.Context, eventID, no, note string) error {
	return s.write(ctx, eventID, no, func() error {
		s.notes[no] = append(s.notes[no], note) // under s.busy[no]: one writer
		return nil
	})
}

func (s *noteStore) applied(no string) []applied {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]applied(nil), s.writes[no]...)
}

// noteEntry is the worker's entry of order:note.
var noteEntry = worker.Kind{
	Kind: noteKind,
	Wait: lock.DefaultWait,
	Apply: func(ctx context.Context, store orders.Store, p tasks.Payload) error {
		n := p.(notePayload)
		return store.(*noteStore).Note(ctx, n.EventID, n.OrderNo, n.Note)
	},
}

// A kind that only a test knows goes through the producer and the worker
// like the contract's, by their Config.Kinds alone: in its order's
// sequence, under the order's lock, and found by the gap check. The first
// note is scheduled, so the modify after it waits past GapWait and the gap
// check looks at the note's position: it must find the note's task (a
// label read against the contract's kinds alone names no task, and the
// position would be skipped, the modify applied first).
func TestATestKindGoesThroughProducerAndWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const no = "SO-NOTE"
	e.seed(no)
	p := e.producer(producer.Config{Kinds: append(tasks.Kinds(), noteKind)})
	store := newNoteStore(e.store)
	r := newRuns()
	e.startWorker(worker.Config{Kinds: append(worker.Kinds(), noteEntry), GapWait: 200 * time.Millisecond, OnDone: r.add},
		func(orders.Store) orders.Store { return store })

	ctx := t.Context()
	note := func(id, text string, opts ...producer.Option) {
		t.Helper()
		res, err := p.Enqueue(ctx, notePayload{OrderNo: no, Note: text}, append(opts, producer.WithEventID(id))...)
		require.NoError(t, err)
		require.Equal(t, "order_note", res.Queue)
	}
	modify := func(id string) {
		t.Helper()
		_, err := p.EnqueueModify(ctx, no, tasks.Changes{Remark: new(id)}, producer.WithEventID(id))
		require.NoError(t, err)
	}
	note("n1", "first", producer.WithProcessIn(time.Second))
	modify("m1")
	note("n2", "second")
	modify("m2")
	note("n3", "third")

	// The runs end in any order (the worker passes the turn on before
	// it reports); the store saw the writes in the order of acceptance.
	for _, id := range []string{"n1", "m1", "n2", "m2", "n3"} {
		r.waitFor(t, id, time.Minute, worker.OutcomeOK) // a bound, not a pace: parked changes come back through asynq's forwarder
	}
	got := store.applied(no)
	var ids []string
	for i, a := range got {
		ids = append(ids, a.EventID)
		if i > 0 {
			require.Greater(t, a.Seq, got[i-1].Seq, "%s after %s", a.EventID, got[i-1].EventID)
		}
	}
	require.Equal(t, []string{"n1", "m1", "n2", "m2", "n3"}, ids, "applied in the order of acceptance")
	store.mu.Lock()
	require.Equal(t, []string{"first", "second", "third"}, store.notes[no])
	store.mu.Unlock()
	r.mu.Lock()
	for _, d := range r.all {
		require.NotEqual(t, worker.OutcomeRejected, d.Outcome, "%+v", d)
		require.Zero(t, d.Skipped, "no position skipped: %+v", d)
	}
	r.mu.Unlock()

	// The contract's producer refuses the kind: it is not in its table.
	_, err := e.producer(producer.Config{}).Enqueue(ctx, notePayload{OrderNo: no, Note: "x"})
	require.ErrorIs(t, err, tasks.ErrKinds)
}
