package keyorder_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// traced returns a context under a recording span, a function that ends
// it and returns its events, and the span itself, whose events can be
// read while it runs.
func traced(t *testing.T) (context.Context, func() []sdktrace.Event, sdktrace.ReadOnlySpan) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.WithoutCancel(t.Context()))) })
	ctx, span := tp.Tracer("test").Start(t.Context(), "run")
	return ctx, func() []sdktrace.Event {
		span.End()
		ended := rec.Ended()
		require.Len(t, ended, 1)
		return ended[0].Events()
	}, rec.Started()[0]
}

// eventAttrs returns the attributes of the events named name.
func eventAttrs(events []sdktrace.Event, name string) []map[attribute.Key]attribute.Value {
	var out []map[attribute.Key]attribute.Value
	for _, e := range events {
		if e.Name != name {
			continue
		}
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range e.Attributes {
			m[kv.Key] = kv.Value
		}
		out = append(out, m)
	}
	return out
}

// A waiter's span shows each position it waited behind, in order, as the
// head moved on: the change it waited for is named, not only that it
// waited. A holder behind the head parks at once, and each of its runs
// (here under one span) names the predecessor it parked behind; the
// holder of the next position, waiting in place for a lock held without a
// turn, names that holder once, however many attempts it makes.
func TestTurnWaitsAreSpanEventsNamingThePredecessor(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	pos := reserve(t, l.Sequencer(), "SO-tr", 3)

	first, err := l.AcquireTurn(t.Context(), "SO-tr", "first", pos[0], quick)
	require.NoError(t, err)

	ctx, events, running := traced(t)
	var te *keyorder.TurnError
	_, err = l.AcquireTurn(ctx, "SO-tr", "third", pos[2], quick)
	require.ErrorAs(t, err, &te)
	require.True(t, te.Parked, "the third parks behind the first")
	first.Finish()
	require.NoError(t, first.Release(t.Context()))
	second, err := l.AcquireTurn(t.Context(), "SO-tr", "second", pos[1], quick)
	require.NoError(t, err)
	// The third, run again, sees the head moved on to the second.
	_, err = l.AcquireTurn(ctx, "SO-tr", "third", pos[2], quick)
	require.ErrorAs(t, err, &te)
	require.True(t, te.Parked, "the third parks behind the second")
	require.Len(t, eventAttrs(running.Events(), "waiting for its turn"), 2)
	second.Finish()
	require.NoError(t, second.Release(t.Context()))
	require.Equal(t, []string{pos[2].Label}, second.Wake(), "the third is called back")

	// Now next, the third waits in place for a lock held without a turn.
	other, err := l.Acquire(t.Context(), "SO-tr", "order:note ev-x", quick)
	require.NoError(t, err)
	waiting := make(chan struct{})
	l2 := newLocker(t, db, keyorder.Config{OnWait: func(string, string, string) { close(waiting) }})
	attempts := make(chan int, 1)
	got := make(chan error, 1)
	go func() {
		lease, err := l2.AcquireTurn(ctx, "SO-tr", "third", pos[2], quick)
		if err == nil {
			attempts <- lease.Stats().Attempts
			lease.Finish()
			err = lease.Release(t.Context())
		}
		got <- err
	}()
	<-waiting
	time.Sleep(30 * time.Millisecond) // a few attempts (quick waits 2 to 5ms)
	require.NoError(t, other.Release(t.Context()))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the third never took its turn")
	}
	require.Greater(t, <-attempts, 2, "it waited in place, trying again")

	ev := events()
	waits := eventAttrs(ev, "waiting for its turn")
	require.Len(t, waits, 2, "one event per predecessor")
	require.Equal(t, pos[0].Label, waits[0]["orderworker.head"].AsString(), "named the change it waited behind")
	require.Equal(t, pos[0].Pos, waits[0]["orderworker.head.seq"].AsInt64())
	require.Equal(t, pos[2].Pos, waits[0]["orderworker.seq"].AsInt64())
	require.Equal(t, pos[1].Label, waits[1]["orderworker.head"].AsString())
	require.Equal(t, pos[1].Pos, waits[1]["orderworker.head.seq"].AsInt64())
	require.Equal(t, pos[2].Pos, waits[1]["orderworker.seq"].AsInt64())
	busy := eventAttrs(ev, "order busy")
	require.Len(t, busy, 1, "one event for the holder it waited in place for, not one per attempt")
	require.Equal(t, "order:note ev-x", busy[0]["orderworker.holder"].AsString())
}

// A waiter for a held key names the holder once; one that waited past
// its deadline gets a BusyError, and its span says whom it waited for.
func TestBusyWaitIsASpanEvent(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	held, err := l.Acquire(t.Context(), "SO-busy", "order:modify ev-holder", quick)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(t.Context())) }()

	ctx, events, _ := traced(t)
	short := quick
	short.Deadline = 50 * time.Millisecond
	_, err = l.Acquire(ctx, "SO-busy", "order:modify ev-waiter", short)
	require.ErrorIs(t, err, keyorder.ErrBusy)
	busy := eventAttrs(events(), "order busy")
	require.Len(t, busy, 1, "one event for one holder, however many attempts")
	require.Equal(t, "order:modify ev-holder", busy[0]["orderworker.holder"].AsString())
}

// A head skipped because its holder will never come is an event of the
// span of the change that skipped it, with the reason.
func TestSkipAndWakeAreSpanEvents(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	l := newLocker(t, db, keyorder.Config{})
	f := &fakeTasks{fate: func(*keyorder.TurnError) (string, time.Duration, error) { return "its task is gone", 0, nil }}
	turns := newTurns(t, l, f, 50*time.Millisecond)
	pos := reserve(t, l.Sequencer(), "SO-skip", 2)

	ctx, events, _ := traced(t)
	lease, _, err := turns.Take(ctx, "SO-skip", "second", pos[1], quick)
	var park *keyorder.ParkError
	for errors.As(err, &park) {
		lease, _, err = turns.Take(ctx, "SO-skip", "second", pos[1], quick)
	}
	require.NoError(t, err)
	turns.Pass(ctx, lease, true, time.Time{}, true)
	ev := events()
	skips := eventAttrs(ev, "gap skipped")
	require.Len(t, skips, 1)
	require.Equal(t, pos[0].Label, skips[0]["orderworker.head"].AsString())
	require.Equal(t, "its task is gone", skips[0]["orderworker.reason"].AsString())
	require.True(t, skips[0]["orderworker.by_this_run"].AsBool())
}
