// Command ledger runs the ledger example end to end on a Redis: it posts a
// few entries to a few accounts, runs a worker until every entry is
// decided, prints the balances and exits.
//
// It reads REDIS_URL (default redis://127.0.0.1:6379/0). Everything it
// writes lives under keys and a queue named after the run, and is deleted
// before it exits.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"example.com/ledger"
	"github.com/orderworker/orderworker/worker/keyorder"
)

// defaultRedisURL is used when REDIS_URL is unset.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = defaultRedisURL
		fmt.Println("REDIS_URL is unset: using", url)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("no Redis at %s: %w", url, err)
	}

	// One run's keys and queue, so that runs never meet.
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "ledger-example:" + runID + ":"
	queue := "ledger-example-" + runID
	store := ledger.NewStore(rdb, ledger.StoreConfig{Prefix: prefix})
	defer cleanup(rdb, queue, prefix) // after the worker's shutdown

	// The key space: the Client and the Runner are built on it, so that
	// they agree on where the accounts' sequences and locks live.
	seq, err := keyorder.NewSequencer(rdb, keyorder.SeqConfig{Prefix: prefix + "lock:"})
	if err != nil {
		return err
	}
	client, err := keyorder.NewClient(seq, keyorder.ClientConfig{})
	if err != nil {
		return err
	}
	poster := ledger.NewPoster(client, ledger.PosterConfig{Queue: queue})
	entries := []ledger.Entry{
		{Account: "alice", EntryID: "a1", Amount: 100_00, Memo: "salary"},
		{Account: "bob", EntryID: "b1", Amount: 20_00, Memo: "gift"},
		{Account: "alice", EntryID: "a2", Amount: -80_00, Memo: "rent"},
		{Account: "carol", EntryID: "c1", Amount: -5_00, Memo: "coffee on an empty account"},
		{Account: "alice", EntryID: "a3", Amount: -50_00, Memo: "laptop: overdraws, refused"},
		{Account: "bob", EntryID: "b2", Amount: -15_00, Memo: "books"},
		{Account: "alice", EntryID: "a4", Amount: 10_00, Memo: "refund"},
		{Account: "carol", EntryID: "c2", Amount: 7_50, Memo: "deposit"},
	}
	accounts := []string{"alice", "bob", "carol"}
	for _, e := range entries {
		enq, err := poster.Post(ctx, e)
		if err != nil {
			return err
		}
		fmt.Printf("posted %-3s to %-5s at position %d: %8s  %s\n", e.EntryID, e.Account, enq.Pos, cents(e.Amount), e.Memo)
	}

	// The worker: the Runner's handler around the store's, on an asynq
	// server with the Runner's settings.
	runner, err := keyorder.NewRunner(seq, keyorder.RunnerConfig{Key: ledger.Key})
	if err != nil {
		return err
	}
	mux := asynq.NewServeMux()
	mux.Handle(ledger.TypePost, runner.Handler(store.Handler()))
	srv := asynq.NewServerFromRedisClient(rdb, runner.ServerConfig(asynq.Config{
		Concurrency:       4,
		Queues:            map[string]int{queue: 1},
		TaskCheckInterval: 50 * time.Millisecond,
		LogLevel:          asynq.ErrorLevel,
	}))
	if err := srv.Start(mux); err != nil {
		_ = runner.Close()
		return fmt.Errorf("start the worker: %w", err)
	}
	// The whole stop, in its one order: the holds end before their next
	// entry, the server shuts down, the Runner closes.
	defer func() { _ = runner.Shutdown(srv) }()

	if err := waitDecided(ctx, store, accounts, len(entries)); err != nil {
		return err
	}
	for _, name := range accounts {
		a, err := store.Account(ctx, name)
		if err != nil {
			return err
		}
		fmt.Printf("\n%s: balance %s\n", name, cents(a.Balance))
		refused := map[string]bool{}
		for _, p := range a.Refused {
			refused[p.EntryID] = true
		}
		// Applied and refused, in the order they ran: their positions'.
		all := append(slices.Clone(a.Entries), a.Refused...)
		slices.SortFunc(all, func(x, y ledger.Posted) int { return cmp.Compare(x.Seq, y.Seq) })
		for _, p := range all {
			if refused[p.EntryID] {
				fmt.Printf("  %-3s %8s   refused (balance %s)  %s\n", p.EntryID, cents(p.Amount), cents(p.Balance), p.Memo)
				continue
			}
			fmt.Printf("  %-3s %8s -> %8s            %s\n", p.EntryID, cents(p.Amount), cents(p.Balance), p.Memo)
		}
	}
	return nil
}

// waitDecided waits until the accounts' applied and refused entries number
// want, for up to a minute.
func waitDecided(ctx context.Context, store *ledger.Store, accounts []string, want int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n := 0
		for _, name := range accounts {
			a, err := store.Account(ctx, name)
			if err != nil {
				return err
			}
			n += len(a.Entries) + len(a.Refused)
		}
		if n == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d entries decided: %w", n, want, ctx.Err())
		case <-tick.C:
		}
	}
}

// cleanup deletes what the run wrote: the accounts and the keyorder keys
// (all under prefix) and the queue, through asynq's Inspector. asynq's
// counters of the queue stay (the daily ones expire, the two running
// totals do not): only asynq's own code spells its keys.
func cleanup(rdb *redis.Client, queue, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if err := insp.DeleteQueue(queue, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		errs = append(errs, err)
	}
	iter := rdb.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		errs = append(errs, rdb.Del(ctx, iter.Val()).Err())
	}
	errs = append(errs, iter.Err())
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "ledger: cleanup:", err)
	}
}

// cents formats an amount of cents as units.
func cents(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}
