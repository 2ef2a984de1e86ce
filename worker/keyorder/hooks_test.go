package keyorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// The tests in this file join a Runner's runs through RunnerConfig's hooks
// (Admit, Observe, Phase, HeadDue, HoldLocate), as the order domain's
// worker does.

// observed is what the hooks saw of one run.
type observed struct {
	rep    keyorder.Report
	err    error
	phases []keyorder.Phase
	admits int
	ctxOK  bool // the run's context carried Observe's value everywhere
}

// hookLog records the hooks' calls, per run.
type hookLog struct {
	mu   sync.Mutex
	runs []*observed
}

type obsKey struct{}

func (h *hookLog) all() []observed {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]observed, len(h.runs))
	for i, o := range h.runs {
		out[i] = *o
	}
	return out
}

// config returns hooks that record into h, with admit's own rule.
func (h *hookLog) config(admit func(ctx context.Context, t *asynq.Task) (keyorder.Admission, error)) keyorder.RunnerConfig {
	return keyorder.RunnerConfig{
		Observe: func(ctx context.Context, t *asynq.Task, rep *keyorder.Report, run func(context.Context) error) error {
			o := &observed{ctxOK: true}
			err := run(context.WithValue(ctx, obsKey{}, o))
			o.rep, o.err = *rep, err
			h.mu.Lock()
			h.runs = append(h.runs, o)
			h.mu.Unlock()
			return err
		},
		Admit: func(ctx context.Context, t *asynq.Task) (keyorder.Admission, error) {
			o := seen(ctx)
			o.admits++
			if admit == nil {
				return keyorder.Admission{}, nil
			}
			return admit(ctx, t)
		},
		Phase: func(ctx context.Context, p keyorder.Phase, rep *keyorder.Report) (context.Context, func(error)) {
			o := seen(ctx)
			o.phases = append(o.phases, p)
			return ctx, func(error) {}
		},
	}
}

// seen returns the run's record from ctx, marking it when ctx lacks it.
func seen(ctx context.Context) *observed {
	if o, ok := ctx.Value(obsKey{}).(*observed); ok {
		return o
	}
	return &observed{}
}

// TestRunnerHooksSeeEveryRun: Observe wraps every run, a hold's too, once;
// Admit and both phases run inside it, with its context, as the handler
// does; the Report says what the run did.
func TestRunnerHooksSeeEveryRun(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
	const n = 20
	var want []int64
	for i := range n { // parked behind the first: the holds take them
		want = append(want, enqueue(t, c, "H", i).Pos)
	}
	var hooks hookLog
	r := newRunner(t, db.Client, db.Prefix, hooks.config(nil))
	rc := newRecorder()
	var handlerCtx atomic.Int32
	startServer(t, db.Client, r, 2, rc.wrap(func(ctx context.Context, _ body, _ keyorder.Run) error {
		if _, ok := ctx.Value(obsKey{}).(*observed); ok {
			handlerCtx.Add(1)
		}
		return nil
	}))
	eventually(t, func() bool { return len(hooks.all()) == n }, "not every task ran")
	runs := hooks.all()
	require.Len(t, runs, n, "one observed run per task")
	require.EqualValues(t, n, handlerCtx.Load(), "the handler runs with Observe's context")
	held := 0
	for i, o := range runs {
		require.NoError(t, o.err)
		require.Equal(t, 1, o.admits, "run %d: Admit once", i)
		require.Equal(t, []keyorder.Phase{keyorder.PhaseLock, keyorder.PhaseEnd}, o.phases, "run %d", i)
		rep := o.rep
		require.Equal(t, "H", rep.Key)
		require.Equal(t, want[i], rep.Pos, "run %d in its turn", i)
		require.True(t, rep.Locked)
		require.True(t, rep.Final)
		require.Equal(t, keyorder.ModeTurn, rep.Mode)
		require.NotEmpty(t, rep.TaskID)
		require.Equal(t, "default", rep.Queue)
		if rep.Held > 0 {
			held++
			require.Equal(t, want[i-1], rep.Prev.Pos, "a held run names the position before it")
			require.Equal(t, runs[i-1].rep.Fence, rep.Fence, "a held run has its hold's fence")
		}
	}
	require.Positive(t, held, "the parked tasks ran in holds")
}

// TestRunnerAdmitArchivesAndAbandons: a task that Admit refuses is
// archived with the reason; with Abandon its position is used up at once
// (the next task runs long before the GapWait), and without it the reason
// is noted in the key's log and the position waits for the gap check.
func TestRunnerAdmitArchivesAndAbandons(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: 200 * time.Millisecond})
	refused := enqueue(t, c, "A", 1)
	enqueue(t, c, "A", 2)
	noted := enqueue(t, c, "B", 1)
	var hooks hookLog
	cfg := hooks.config(func(_ context.Context, t *asynq.Task) (keyorder.Admission, error) {
		var b body
		if err := json.Unmarshal(t.Payload(), &b); err != nil {
			return keyorder.Admission{}, err
		}
		switch {
		case b.Key == "A" && b.N == 1:
			return keyorder.Admission{Key: "A", Abandon: true}, errors.New("refused by the program")
		case b.Key == "B":
			return keyorder.Admission{Key: "B"}, errors.New("noted by the program")
		}
		return keyorder.Admission{}, nil
	})
	cfg.GapWait = time.Minute
	r := newRunner(t, db.Client, db.Prefix, cfg)
	rc := newRecorder()
	start := time.Now()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	requireState(t, db.Client, refused, asynq.TaskStateArchived, "refused by the program")
	eventually(t, func() bool { return len(rc.succeeded("A")) == 1 }, "task 2 waited for the abandoned position")
	require.Less(t, time.Since(start), time.Minute, "the abandoned position was used up, not skipped")
	requireState(t, db.Client, noted, asynq.TaskStateArchived, "noted by the program")

	final := map[string]bool{}
	for _, o := range hooks.all() {
		if o.err != nil {
			require.ErrorIs(t, o.err, asynq.SkipRetry)
			require.False(t, o.rep.Locked, "a refused task never takes the lock")
			final[o.rep.Key] = o.rep.Final
		}
	}
	require.Equal(t, map[string]bool{"A": true, "B": false}, final, "an abandoned position is final; a noted one is not")
	st, err := space(t, db.Client, db.Prefix, keyorder.SeqConfig{}).Status(t.Context(), "B")
	require.NoError(t, err)
	var reasons []string
	for _, e := range st.Log {
		reasons = append(reasons, e.Reason)
	}
	require.Contains(t, reasons, "archived: noted by the program: "+asynq.SkipRetry.Error(), "the refusal is noted in B's log")
}

// TestRunnerHeadDueHasTheLastWord: a head whose task is due far ahead is
// given to HeadDue, which may bring it forward: it then runs first, and
// the task behind it after it, long before it was due.
func TestRunnerHeadDueHasTheLastWord(t *testing.T) {
	t.Parallel()
	db := redistest.New(t)
	c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{ParkFor: 200 * time.Millisecond})
	late := enqueue(t, c, "D", 1, asynq.ProcessIn(time.Hour))
	enqueue(t, c, "D", 2)
	insp := asynq.NewInspectorFromRedisClient(db.Client)
	var calls atomic.Int32
	r := newRunner(t, db.Client, db.Prefix, keyorder.RunnerConfig{
		GapWait: 200 * time.Millisecond,
		HeadDue: func(_ context.Context, key string, te *keyorder.TurnError, info *asynq.TaskInfo) (time.Duration, error) {
			calls.Add(1)
			if key != "D" || info.ID != late.TaskID || te.Head != late.Pos || info.State != asynq.TaskStateScheduled {
				return 0, errors.New("HeadDue was given another head")
			}
			return 0, insp.RunTask(info.Queue, info.ID)
		},
	})
	rc := newRecorder()
	startServer(t, db.Client, r, 2, rc.wrap(nil))
	eventually(t, func() bool { return len(rc.succeeded("D")) == 2 }, "the head due in an hour held its key")
	require.Equal(t, []int{1, 2}, rc.succeeded("D"))
	require.Positive(t, calls.Load())
}

// TestRunnerHoldsRunEveryTypeOfAMuxAndHoldLocateBounds: a hold runs a
// task of a type that has not run yet when the Runner wraps a ServeMux
// that has its handler; a HoldLocate that refuses every position keeps
// every task out of holds, in order all the same.
func TestRunnerHoldsRunEveryTypeOfAMuxAndHoldLocateBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		holds bool
	}{{"mux", true}, {"no holds", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := redistest.New(t)
			c := newClient(t, db.Client, db.Prefix, keyorder.ClientConfig{})
			const n = 10
			for i := range n {
				typ := "first"
				if i > 0 {
					typ = "second"
				}
				_, err := c.Enqueue(t.Context(), "M", asynq.NewTask(typ, payload(t, "M", i)))
				require.NoError(t, err)
			}
			var hooks hookLog
			cfg := hooks.config(nil)
			if !tc.holds {
				cfg.HoldLocate = func(string, string) ([]string, string, bool) { return nil, "", false }
			}
			r := newRunner(t, db.Client, db.Prefix, cfg)
			rc := newRecorder()
			mux := asynq.NewServeMux()
			mux.Handle("first", rc.wrap(nil))
			mux.Handle("second", rc.wrap(nil))
			srv := asynq.NewServerFromRedisClient(db.Client, r.ServerConfig(asynq.Config{
				Concurrency: 2, LogLevel: asynq.FatalLevel,
				TaskCheckInterval: 10 * time.Millisecond, DelayedTaskCheckInterval: 20 * time.Millisecond,
			}))
			require.NoError(t, srv.Start(r.Handler(mux)))
			t.Cleanup(srv.Shutdown)
			eventually(t, func() bool { return len(hooks.all()) == n }, "not every task ran")
			require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, rc.succeeded("M"))
			held := 0
			for _, o := range hooks.all() {
				if o.rep.Held > 0 {
					held++
				}
			}
			if tc.holds {
				require.Positive(t, held, "the second type ran in the first's hold")
			} else {
				require.Zero(t, held, "HoldLocate refused every position")
			}
		})
	}
}
