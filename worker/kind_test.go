package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/orderworker/orderworker/producer"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/orders"
	"github.com/stretchr/testify/require"
)

// notePayload is the payload of test:note-kind, a kind that only this
// test knows: it appends a note to an order. Its type, name and queue are
// the test's own (no real kind takes a "test" name; order:note is already
// a history entry's type). Seq is its last field, as in the contract's
// payloads (the producer appends the position to the JSON).
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
var noteKind = tasks.NewKind[notePayload]("test:note-kind", "test-note-kind", "test_note_kind", 2)

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
	*backend
	mu     sync.Mutex
	writes map[string][]applied // by order
	fences map[string]int64     // newest fence by order
	busy   map[string]bool      // a write of the order is under way
	notes  map[string][]string  // by order
}

func newNoteStore(inner orders.Store) *noteStore {
	return &noteStore{backend: inner.(*backend), writes: map[string][]applied{}, fences: map[string]int64{},
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
		r, err = s.backend.Modify(ctx, eventID, no, c)
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

// noter is the store write of test:note-kind.
type noter interface {
	Note(ctx context.Context, eventID, no, note string) error
}

// noteEntry is the worker's entry of test:note-kind.
var noteEntry = worker.NewKind(worker.Wait{}, func(ctx context.Context, store noter, n notePayload) error {
	return store.Note(ctx, n.EventID, n.OrderNo, n.Note)
})

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
		require.Equal(t, "test_note_kind", res.Queue)
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

// readOnly is a store without any write.
type readOnly struct{ orders.Store }

// modifyOnly is a store that applies modifies and nothing else.
type modifyOnly struct {
	orders.Store
	orders.Modifier
}

// onlyKind returns the worker's entry of kind k alone.
func onlyKind(t *testing.T, k *tasks.Kind) []worker.Kind {
	t.Helper()
	for _, e := range worker.Kinds() {
		if e.Kind == k {
			return []worker.Kind{e}
		}
	}
	t.Fatalf("no entry of %s", k)
	return nil
}

// New refuses, at start, a kind whose store lacks its write, naming the
// kind and the write's interface; a store serves the kinds whose writes it
// has.
func TestNewRefusesAStoreWithoutAKindsWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tests := []struct {
		name  string
		store orders.Store
		kinds []worker.Kind
		want  []string
	}{
		{"no write at all", readOnly{e.store}, nil, []string{"order:exchange", "orders.Exchanger", "worker_test.readOnly"}},
		{"no exchange", modifyOnly{e.store, e.store}, nil, []string{"order:exchange", "orders.Exchanger"}},
		{"no modify", readOnly{e.store}, onlyKind(t, tasks.Modify), []string{"order:modify", "orders.Modifier"}},
		{"a program's own write", e.store, append(worker.Kinds(), noteEntry), []string{"test:note-kind", "worker_test.noter"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := worker.New(e.db.Client, tt.store, worker.Config{Kinds: tt.kinds, KeyPrefix: e.db.Prefix})
			require.ErrorIs(t, err, worker.ErrNoWrite)
			for _, s := range tt.want {
				require.ErrorContains(t, err, s)
			}
		})
	}

	w, err := worker.New(e.db.Client, modifyOnly{e.store, e.store}, worker.Config{Kinds: onlyKind(t, tasks.Modify), KeyPrefix: e.db.Prefix})
	require.NoError(t, err, "a store with Modify alone serves the modify kind alone")
	w.Shutdown()
}

// An entry not made by NewKind, and one whose kind reads payloads of
// another type than its handler takes, are refused at start.
func TestNewRefusesABadKindEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	swapped := noteEntry
	swapped.Kind = tasks.Modify
	tests := []struct {
		name  string
		kinds []worker.Kind
		want  string
	}{
		{"made by hand", []worker.Kind{{Kind: tasks.Modify}}, "order:modify has no handler; make its entry with worker.NewKind"},
		{"another payload type", []worker.Kind{swapped}, "kind order:modify reads tasks.ModifyPayload payloads, which its handler does not take"},
		{"a pointer payload type", []worker.Kind{worker.NewKind(worker.Wait{}, func(context.Context, noter, *notePayload) error { return nil })},
			"a kind entry without a kind; make it with worker.NewKind, whose payload type (a value type) names its kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := worker.New(e.db.Client, newNoteStore(e.store), worker.Config{Kinds: tt.kinds, KeyPrefix: e.db.Prefix})
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// The entries' handlers check their payload type: a payload of another
// kind is refused for good, and a store without the write is ErrNoWrite.
func TestKindApplyChecksTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	modify := onlyKind(t, tasks.Modify)[0]
	ctx := orders.WithWrite(t.Context(), orders.Write{Fence: 1})
	err := modify.Apply(ctx, e.store, tasks.ExchangePayload{EventID: "e", OrderNo: "SO1"})
	require.ErrorIs(t, err, asynq.SkipRetry)
	err = modify.Apply(ctx, readOnly{e.store}, tasks.ModifyPayload{EventID: "e", OrderNo: "SO1"})
	require.ErrorIs(t, err, worker.ErrNoWrite)
	require.Equal(t, "orders.Modifier", modify.Write().String())
	require.Equal(t, worker.DefaultWait(), modify.Wait)
}

// KindsFor gives the contract's entries whose write a store has, in
// Kinds' order; a Worker with none of them is refused.
func TestKindsFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	names := func(ks []worker.Kind) []string {
		var out []string
		for _, k := range ks {
			out = append(out, k.Kind.Name)
		}
		return out
	}
	require.Equal(t, names(worker.Kinds()), names(worker.KindsFor(e.store)))
	require.Equal(t, []string{"modify"}, names(worker.KindsFor(modifyOnly{e.store, e.store})))
	require.Empty(t, worker.KindsFor(readOnly{e.store}))

	_, err := worker.New(e.db.Client, readOnly{e.store}, worker.Config{Kinds: worker.KindsFor(readOnly{e.store}), KeyPrefix: e.db.Prefix})
	require.ErrorContains(t, err, "no kinds to serve")
	w, err := worker.New(e.db.Client, modifyOnly{e.store, e.store}, worker.Config{Kinds: worker.KindsFor(modifyOnly{e.store, e.store}), KeyPrefix: e.db.Prefix})
	require.NoError(t, err)
	require.Equal(t, map[string]int{tasks.QueueModify: tasks.Modify.Weight}, w.Queues(), "it serves the modify queue alone")
	w.Shutdown()
}
