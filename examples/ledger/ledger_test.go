package ledger_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"example.com/ledger"
	"github.com/orderworker/orderworker/worker/keyorder"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Several producers post many entries to a few accounts while two asynq
// servers (four workers each) run them: each account's entries are
// decided exactly once, in the order of the positions Post returned, and
// the balances, the refusals and the fences are what that order gives.
func TestEntriesApplyOnceInAcceptanceOrder(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	env.worker(t, 4)
	env.worker(t, 4)
	poster := env.poster(t)

	const producers, perProducer = 8, 40
	accounts := []string{"acct-a", "acct-b", "acct-c", "acct-d"}
	type accepted struct {
		pos   int64
		entry ledger.Entry
	}
	var (
		mu       sync.Mutex
		byAcct   = map[string][]accepted{}
		failures []error
		wg       sync.WaitGroup
	)
	for g := range producers {
		wg.Go(func() {
			for i := range perProducer {
				amount := rand.Int64N(1050) - 500 // withdrawals of up to 5.00, deposits of up to 5.49: many refusals
				if amount == 0 {
					amount = 1
				}
				e := ledger.Entry{
					Account: accounts[rand.IntN(len(accounts))],
					EntryID: fmt.Sprintf("g%d-%d", g, i),
					Amount:  amount,
					Memo:    "producer " + strconv.Itoa(g),
				}
				enq, err := poster.Post(t.Context(), e)
				mu.Lock()
				if err != nil {
					failures = append(failures, err)
				} else {
					byAcct[e.Account] = append(byAcct[e.Account], accepted{enq.Pos, e})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(failures...))

	env.waitDecided(t, accounts, producers*perProducer)
	insp := asynq.NewInspectorFromRedisClient(env.rdb)
	refusedTotal := 0
	for _, name := range accounts {
		acc := byAcct[name]
		slices.SortFunc(acc, func(a, b accepted) int { return cmp.Compare(a.pos, b.pos) })
		// The order the ledger must follow: the positions Post returned.
		var wantApplied, wantRefused []string
		var balance int64
		for i, a := range acc {
			if i > 0 {
				require.Greater(t, a.pos, acc[i-1].pos, "%s: positions are unique", name)
			}
			if balance+a.entry.Amount < 0 {
				wantRefused = append(wantRefused, a.entry.EntryID)
				continue
			}
			balance += a.entry.Amount
			wantApplied = append(wantApplied, a.entry.EntryID)
		}
		got, err := env.store.Account(t.Context(), name)
		require.NoError(t, err)
		assert.Equal(t, wantApplied, ids(got.Entries), "%s: applied once each, in acceptance order", name)
		assert.Equal(t, wantRefused, ids(got.Refused), "%s: the refusals of that order", name)
		assert.Equal(t, balance, got.Balance, "%s: balance", name)
		if len(got.Entries) > 0 {
			assert.Equal(t, balance, got.Entries[len(got.Entries)-1].Balance, "%s: the last entry's running balance", name)
		}

		// Every decision at its accepted position, under a fence no older
		// than the one before (the same one for the entries that ran in
		// one hold of the account's lock).
		pos := map[string]int64{}
		for _, a := range acc {
			pos[a.entry.EntryID] = a.pos
		}
		all := append(slices.Clone(got.Entries), got.Refused...)
		slices.SortFunc(all, func(a, b ledger.Posted) int { return cmp.Compare(a.Seq, b.Seq) })
		for i, p := range all {
			assert.Equal(t, pos[p.EntryID], p.Seq, "%s: %s ran at its position", name, p.EntryID)
			if i > 0 {
				assert.GreaterOrEqual(t, p.Fence, all[i-1].Fence, "%s: %s ran under an older fence than %s", name, p.EntryID, all[i-1].EntryID)
			}
		}
		for _, id := range wantRefused {
			info, err := insp.GetTaskInfo(env.queue, id)
			require.NoError(t, err)
			assert.Equal(t, asynq.TaskStateArchived, info.State, "%s: refused %s is archived", name, id)
			assert.Contains(t, info.LastErr, "overdraft")
		}
		refusedTotal += len(wantRefused)
	}
	t.Logf("%d entries, %d refused by the overdraft rule", producers*perProducer, refusedTotal)
	// Nothing else is left in the queue: the applied tasks are done.
	env.waitQueue(t, refusedTotal)
}

// The overdraft rule, which is why order matters: deposit 100, withdraw
// 80, withdraw 50 (refused and archived), deposit 10: the balance is 30
// and the entries are in order. The same with asynq.MaxRetry(0), where a
// refusal must not be retried either.
func TestOverdraftIsRefusedInOrder(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	poster := env.poster(t)
	cases := map[string][]asynq.Option{"default": nil, "maxretry0": {asynq.MaxRetry(0)}}
	for name, opts := range cases {
		for _, e := range []ledger.Entry{
			{EntryID: name + "-d100", Amount: 100_00, Memo: "deposit"},
			{EntryID: name + "-w80", Amount: -80_00, Memo: "withdraw"},
			{EntryID: name + "-w50", Amount: -50_00, Memo: "withdraw, overdraws"},
			{EntryID: name + "-d10", Amount: 10_00, Memo: "deposit"},
		} {
			e.Account = "acct-" + name
			_, err := poster.Post(t.Context(), e, opts...)
			require.NoError(t, err)
		}
	}
	// The workers start once every entry waits, and two of them race.
	env.worker(t, 4)
	env.worker(t, 4)
	env.waitDecided(t, []string{"acct-default", "acct-maxretry0"}, 8)
	env.waitQueue(t, 2)

	insp := asynq.NewInspectorFromRedisClient(env.rdb)
	for name := range cases {
		a, err := env.store.Account(t.Context(), "acct-"+name)
		require.NoError(t, err)
		assert.Equal(t, int64(30_00), a.Balance, name)
		assert.Equal(t, []string{name + "-d100", name + "-w80", name + "-d10"}, ids(a.Entries), name)
		assert.Equal(t, []int64{100_00, 20_00, 30_00}, balances(a.Entries), name)
		assert.Equal(t, []string{name + "-w50"}, ids(a.Refused), name)
		assert.Equal(t, []int64{20_00}, balances(a.Refused), "%s: refused on a balance of 20", name)

		info, err := insp.GetTaskInfo(env.queue, name+"-w50")
		require.NoError(t, err)
		assert.Equal(t, asynq.TaskStateArchived, info.State, name)
		assert.Equal(t, 0, info.Retried, "%s: refused at once, never retried", name)
		assert.Contains(t, info.LastErr, "overdraft", name)

		// The refusal is final: its ID is taken while the archived task
		// stays, and the store refuses it again.
		_, err = poster.Post(t.Context(), ledger.Entry{Account: "acct-" + name, EntryID: name + "-w50", Amount: -50_00})
		require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
		res, err := env.store.Apply(t.Context(), ledger.Entry{Account: "acct-" + name, EntryID: name + "-w50", Amount: -50_00}, 99, time.Now().UnixMicro()*10)
		require.ErrorIs(t, err, ledger.ErrOverdraft)
		assert.Equal(t, ledger.Refused, res.Outcome)
	}
}

// The store refuses a fence older than the newest it has seen for the
// account, and changes nothing then; an equal fence passes; an entry ID
// is applied at most once.
func TestStoreFenceAndAtMostOnce(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := t.Context()
	e1 := ledger.Entry{Account: "acct", EntryID: "e1", Amount: 500, Memo: "first"}
	e2 := ledger.Entry{Account: "acct", EntryID: "e2", Amount: -200, Memo: "second"}

	res, err := env.store.Apply(ctx, e1, 1, 200)
	require.NoError(t, err)
	assert.Equal(t, ledger.Result{Outcome: ledger.Applied, Balance: 500}, res)

	_, err = env.store.Apply(ctx, e2, 2, 199)
	require.ErrorIs(t, err, keyorder.ErrStaleFence, "a fence older than 200")
	assert.True(t, !keyorder.IsFailure(err), "the Runner does not count it as a failure")
	a, err := env.store.Account(ctx, "acct")
	require.NoError(t, err)
	assert.Equal(t, int64(500), a.Balance, "the stale write changed nothing")
	assert.Equal(t, []string{"e1"}, ids(a.Entries))

	// Another account's fences are its own.
	_, err = env.store.Apply(ctx, ledger.Entry{Account: "other", EntryID: "e2", Amount: 1}, 1, 1)
	require.NoError(t, err)

	res, err = env.store.Apply(ctx, e2, 2, 200)
	require.NoError(t, err, "the same fence: the same holder")
	assert.Equal(t, ledger.Result{Outcome: ledger.Applied, Balance: 300}, res)

	res, err = env.store.Apply(ctx, e1, 3, 300)
	require.NoError(t, err)
	assert.Equal(t, ledger.Result{Outcome: ledger.Duplicate, Balance: 300}, res, "e1 again: nothing changes")

	// Past 2^53, fences and balances stay exact (no Lua doubles).
	big := int64(1)<<60 + 1
	_, err = env.store.Apply(ctx, ledger.Entry{Account: "acct", EntryID: "e3", Amount: ledger.MaxAmount}, 4, big)
	require.NoError(t, err)
	_, err = env.store.Apply(ctx, ledger.Entry{Account: "acct", EntryID: "e4", Amount: 1}, 5, big-1)
	require.ErrorIs(t, err, keyorder.ErrStaleFence, "one below a fence past 2^53")
	for i := range 10 {
		_, err = env.store.Apply(ctx, ledger.Entry{Account: "acct", EntryID: "big" + strconv.Itoa(i), Amount: ledger.MaxAmount}, int64(6+i), big)
		require.NoError(t, err)
	}
	res, err = env.store.Apply(ctx, ledger.Entry{Account: "acct", EntryID: "e5", Amount: -1}, 16, big)
	require.NoError(t, err)
	assert.Equal(t, 11*int64(ledger.MaxAmount)+300-1, res.Balance)
	a, err = env.store.Account(ctx, "acct")
	require.NoError(t, err)
	assert.Equal(t, big, a.Entries[len(a.Entries)-1].Fence)
	assert.Equal(t, res.Balance, a.Balance)

	_, err = env.store.Apply(ctx, ledger.Entry{Account: "acct", EntryID: "e6", Amount: 0}, 17, big)
	require.ErrorIs(t, err, ledger.ErrInvalid)
}

// An entry posted again after it was applied takes a new position, runs,
// and changes nothing; the handler refuses to run outside a Runner.
func TestRepostIsADuplicate(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	env.worker(t, 2)
	poster := env.poster(t)
	e := ledger.Entry{Account: "acct", EntryID: "once", Amount: 250}
	first, err := poster.Post(t.Context(), e)
	require.NoError(t, err)
	env.waitQueue(t, 0)
	second, err := poster.Post(t.Context(), e)
	require.NoError(t, err)
	assert.Greater(t, second.Pos, first.Pos)
	env.waitQueue(t, 0)
	a, err := env.store.Account(t.Context(), "acct")
	require.NoError(t, err)
	assert.Equal(t, int64(250), a.Balance)
	assert.Equal(t, []string{"once"}, ids(a.Entries))

	_, err = poster.Post(t.Context(), ledger.Entry{Account: "a{b}", EntryID: "x", Amount: 1})
	require.ErrorIs(t, err, ledger.ErrInvalid)

	err = env.store.Handler().ProcessTask(t.Context(), asynq.NewTask(ledger.TypePost, []byte(`{"account":"acct","entry_id":"y","amount":1}`)))
	require.ErrorIs(t, err, asynq.SkipRetry, "outside a Runner there is no fence")
}

// A post that fails (not a refusal: say the store is unreachable) holds
// its account: the entries behind it wait while it backs off, and run in
// order after it. With asynq.MaxRetry(0), one failure archives it and the
// next entry runs.
func TestAFailureHoldsItsAccount(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	var once sync.Map // entry IDs run once, by either worker
	failSecond := func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			if _, ran := once.LoadOrStore(id, true); !ran && strings.HasSuffix(id, "-2") {
				return errors.New("injected: the store is unreachable")
			}
			return next.ProcessTask(ctx, task)
		})
	}
	runner := env.workerWith(t, 4, failSecond)
	env.workerWith(t, 4, failSecond)
	poster := env.poster(t)
	for _, acct := range []string{"held", "budget0"} {
		var opts []asynq.Option
		if acct == "budget0" {
			opts = append(opts, asynq.MaxRetry(0))
		}
		for i := 1; i <= 4; i++ {
			_, err := poster.Post(t.Context(), ledger.Entry{Account: acct, EntryID: acct + "-" + strconv.Itoa(i), Amount: int64(i)}, opts...)
			require.NoError(t, err)
		}
	}

	// budget0-2 failed once, out of its budget: archived, and the rest ran.
	env.waitDecided(t, []string{"budget0"}, 3)
	a, err := env.store.Account(t.Context(), "budget0")
	require.NoError(t, err)
	assert.Equal(t, []string{"budget0-1", "budget0-3", "budget0-4"}, ids(a.Entries))
	info, err := asynq.NewInspectorFromRedisClient(env.rdb).GetTaskInfo(env.queue, "budget0-2")
	require.NoError(t, err)
	assert.Equal(t, asynq.TaskStateArchived, info.State)
	assert.Contains(t, info.LastErr, "injected")

	// held-2 backs off (asynq's default backoff, 15 s or more), and
	// held-3 and held-4 wait behind it.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		h, err := runner.Head(t.Context(), "held")
		if assert.NoError(ct, err) {
			assert.Equal(ct, "held-2", h.TaskID)
			assert.Equal(ct, asynq.TaskStateRetry.String(), h.State)
			assert.Equal(ct, 1, h.Retried)
		}
	}, 30*time.Second, 20*time.Millisecond)
	// The engine's blocked-keys read names the account, and why.
	found, err := runner.Blocked(t.Context(), keyorder.BlockedQuery{Queues: []string{env.queue}, After: time.Nanosecond})
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, b := range found.Keys {
		reasons[b.Head.Key] = b.Reason
		if b.Head.Key == "held" {
			assert.Equal(t, "held-2", b.Head.TaskID)
			assert.Contains(t, b.Head.LastErr, "injected")
		}
	}
	assert.Equal(t, map[string]string{"held": keyorder.BlockedFailing}, reasons)
	a, err = env.store.Account(t.Context(), "held")
	require.NoError(t, err)
	assert.Equal(t, []string{"held-1"}, ids(a.Entries), "nothing behind the failed entry ran")

	// The operator runs it now: it and the entries behind it run, in order.
	require.NoError(t, runner.Retry(t.Context(), "held"))
	env.waitDecided(t, []string{"held"}, 4)
	a, err = env.store.Account(t.Context(), "held")
	require.NoError(t, err)
	assert.Equal(t, []string{"held-1", "held-2", "held-3", "held-4"}, ids(a.Entries))
	assert.Equal(t, int64(10), a.Balance)
	env.waitQueue(t, 1)
}

func ids(ps []ledger.Posted) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.EntryID)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func balances(ps []ledger.Posted) []int64 {
	var out []int64
	for _, p := range ps {
		out = append(out, p.Balance)
	}
	return out
}

// env is one test's Redis, key prefix, queue and store.
type env struct {
	url, prefix, queue string
	rdb                *redis.Client
	store              *ledger.Store
}

// newEnv gives the test a Redis: TEST_REDIS_URL when set (shared: the
// test's keys and queue carry a prefix of its own and are deleted when it
// ends), else a redis-server of its own on a free port. Without either it
// skips, and fails when CI is set.
func newEnv(t *testing.T) *env {
	t.Helper()
	url := os.Getenv("TEST_REDIS_URL")
	if url == "" {
		url = startRedis(t)
	}
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	tag := strings.ToLower(strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())) + "-" + strconv.FormatUint(rand.Uint64(), 36)
	e := &env{url: url, prefix: "ledgertest:" + tag + ":", queue: "ledgertest-" + tag, rdb: rdb}
	e.store = ledger.NewStore(rdb, ledger.StoreConfig{Prefix: e.prefix})
	t.Cleanup(func() {
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = asynq.NewInspectorFromRedisClient(rdb).DeleteQueue(e.queue, true)
		for _, pattern := range []string{e.prefix + "*", "asynq:{" + e.queue + "}:*"} {
			iter := rdb.Scan(ctx, 0, pattern, 100).Iterator()
			for iter.Next(ctx) {
				rdb.Del(ctx, iter.Val())
			}
		}
	})
	return e
}

// startRedis starts a redis-server on a free port, killed when the test
// ends, and returns its URL.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, and neither TEST_REDIS_URL nor redis-server is there: %v", err)
		}
		t.Skipf("needs a Redis: set TEST_REDIS_URL, or install redis-server (apt-get install redis-server): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + port
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, c.Ping(t.Context()).Err())
	}, 10*time.Second, 10*time.Millisecond, "redis-server on port %s answers PING", port)
	return "redis://" + addr + "/0"
}

// space returns the test's key space on rdb: the engine's keys under the
// test's prefix.
func (e *env) space(t *testing.T, rdb redis.UniversalClient) *keyorder.Sequencer {
	t.Helper()
	seq, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: e.prefix + "lock:"})
	require.NoError(t, err)
	return seq
}

// poster returns a Poster on the test's Redis, keys and queue.
func (e *env) poster(t *testing.T) *ledger.Poster {
	t.Helper()
	c, err := keyorder.NewClient(e.space(t, e.rdb), keyorder.ClientConfig{})
	require.NoError(t, err)
	return ledger.NewPoster(c, ledger.PosterConfig{Queue: e.queue})
}

// worker starts what a worker process runs: its own Redis client, a
// Runner and an asynq server of concurrency n around the store's handler,
// all stopped when the test ends.
func (e *env) worker(t *testing.T, n int) {
	t.Helper()
	e.workerWith(t, n, nil)
}

// workerWith is worker with wrap (when not nil) between the Runner's
// handler and the store's. It returns the Runner.
func (e *env) workerWith(t *testing.T, n int, wrap func(asynq.Handler) asynq.Handler) *keyorder.Runner {
	t.Helper()
	opt, err := redis.ParseURL(e.url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	runner, err := keyorder.NewRunner(e.space(t, rdb), keyorder.RunnerConfig{Key: ledger.Key})
	require.NoError(t, err)
	store := ledger.NewStore(rdb, ledger.StoreConfig{Prefix: e.prefix})
	mux := asynq.NewServeMux()
	h := store.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	mux.Handle(ledger.TypePost, runner.Handler(h))
	srv := asynq.NewServerFromRedisClient(rdb, runner.ServerConfig(asynq.Config{
		Concurrency:       n,
		Queues:            map[string]int{e.queue: 1},
		TaskCheckInterval: 10 * time.Millisecond,
		LogLevel:          asynq.ErrorLevel,
	}))
	require.NoError(t, srv.Start(mux))
	t.Cleanup(func() {
		assert.NoError(t, runner.Shutdown(srv))
		_ = rdb.Close()
	})
	return runner
}

// waitDecided waits until the accounts' applied and refused entries
// number want.
func (e *env) waitDecided(t *testing.T, accounts []string, want int) {
	t.Helper()
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		n := 0
		for _, name := range accounts {
			a, err := e.store.Account(t.Context(), name)
			if !assert.NoError(ct, err) {
				return
			}
			n += len(a.Entries) + len(a.Refused)
		}
		assert.Equal(ct, want, n, "entries decided")
	}, 60*time.Second, 20*time.Millisecond)
}

// waitQueue waits until the test's queue holds only its archived tasks,
// archived of them.
func (e *env) waitQueue(t *testing.T, archived int) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		q, err := insp.GetQueueInfo(e.queue)
		if !assert.NoError(ct, err) {
			return
		}
		assert.Equal(ct, archived, q.Archived, "archived")
		assert.Equal(ct, q.Archived, q.Size, "nothing but the archived left: %+v", q)
	}, 60*time.Second, 20*time.Millisecond)
}
