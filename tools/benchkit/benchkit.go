// Package benchkit holds what the measuring tools tools/bench and tools/stress
// share: reading Redis's command counters, counting a client's round trips,
// waiting for asynq queues to drain, building and watching worker processes,
// and checking order histories for the lock's invariants.
//
// It is tooling, not product code: nothing under worker, producer or
// internal/* (other than these tools) may import it. It reads asynq's key
// names directly where asynq's Inspector would be too heavy to poll (see
// [Finished]).
package benchkit

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker/keyorder/asynqredis"
	"github.com/redis/go-redis/v9"
)

// CmdStat is one command's counters from INFO commandstats.
type CmdStat struct {
	Calls int64 `json:"calls"`
	Usec  int64 `json:"usec"` // time spent in the command, µs
}

// CommandStats returns the counters per command ("evalsha",
// "config|resetstat", ...) from INFO commandstats. Redis counts the commands
// a script runs as well as the EVALSHA that ran it, whose time includes
// theirs.
func CommandStats(ctx context.Context, rdb redis.UniversalClient) (map[string]CmdStat, error) {
	s, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("info commandstats: %w", err)
	}
	return ParseCommandStats(s), nil
}

// ParseCommandStats parses the text of INFO commandstats.
func ParseCommandStats(info string) map[string]CmdStat {
	out := map[string]CmdStat{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st CmdStat
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

// Delta returns after − before per command, leaving out commands with no
// calls in between.
func Delta(before, after map[string]CmdStat) map[string]CmdStat {
	out := map[string]CmdStat{}
	for k, v := range after {
		if d := v.Calls - before[k].Calls; d > 0 {
			out[k] = CmdStat{Calls: d, Usec: v.Usec - before[k].Usec}
		}
	}
	return out
}

// Sum adds up the calls of all commands.
func Sum(stats map[string]CmdStat) int64 {
	var n int64
	for _, v := range stats {
		n += v.Calls
	}
	return n
}

// Top returns the names of the n commands with the largest key(stat),
// largest first.
func Top[T any](stats map[string]T, n int, key func(T) int64) []string {
	names := slices.Collect(maps.Keys(stats))
	slices.SortFunc(names, func(a, b string) int {
		if ka, kb := key(stats[a]), key(stats[b]); ka != kb {
			return cmp.Compare(kb, ka)
		}
		return strings.Compare(a, b)
	})
	return names[:min(n, len(names))]
}

// CountHook counts the round trips a go-redis client makes: a command is
// one, a pipeline or transaction is one. Add it with Client.AddHook. It is
// safe for concurrent use.
//
// It counts them by name too (see [CountHook.ByName]): a command by its
// name, a pipeline as "pipeline", and a script call (EVAL, EVALSHA) by its
// command and the shapes of its first two keys (see [KeyShape]), so that
// the scripts of asynq, the lock and the store, which all run as EVALSHA,
// are told apart: "evalsha asynq:{}:pending asynq:{}:paused" is asynq's
// dequeue. A new connection's set-up, which go-redis sends through the
// client's hooks when it dials (HELLO, then SELECT, CLIENT SETINFO and the
// like), is no round trip of the work: it is counted apart, as "handshake",
// and left out of RoundTrips.
type CountHook struct {
	n      atomic.Int64
	mu     sync.Mutex
	byName map[string]int64
}

// NewCountHook returns a hook with zero counts.
func NewCountHook() *CountHook { return &CountHook{byName: map[string]int64{}} }

// DialHook implements redis.Hook.
func (h *CountHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *CountHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if handshake(cmd) {
			h.addHandshake()
		} else {
			h.add(CallName(cmd), 1)
		}
		return next(ctx, cmd)
	}
}

// handshake reports whether cmds are (part of) a connection's set-up.
func handshake(cmds ...redis.Cmder) bool {
	for _, c := range cmds {
		switch strings.ToLower(c.Name()) {
		case "hello", "auth", "select", "client", "readonly":
		default:
			return false
		}
	}
	return len(cmds) > 0
}

// CallName names a command for [CountHook]: its name in lower case, and for
// a script call (eval, evalsha and their _ro forms) also the shapes of its
// first two keys, e.g. "evalsha ow:lock:{} ow:lock:{}:fence".
func CallName(cmd redis.Cmder) string {
	name := strings.ToLower(cmd.Name())
	if !strings.HasPrefix(name, "eval") {
		return name
	}
	args := cmd.Args()
	if len(args) < 3 {
		return name
	}
	n, ok := args[2].(int) // as go-redis builds it
	if !ok {
		return name
	}
	for i := 3; i < 3+min(n, 2) && i < len(args); i++ {
		if k, ok := args[i].(string); ok {
			name += " " + KeyShape(k)
		}
	}
	return name
}

// KeyShape returns a Redis key with what names one instance left out: the
// hash tag's content, and what follows the component after the tag.
// "asynq:{order_modify}:t:ev-1" is "asynq:{}:t:*", "ow:lock:{SO1}:seq" is
// "ow:lock:{}:seq". A key without a hash tag is returned as it is.
func KeyShape(key string) string {
	open := strings.IndexByte(key, '{')
	end := strings.IndexByte(key, '}')
	if open < 0 || end < open {
		return key
	}
	head, rest := key[:open]+"{}", strings.TrimPrefix(key[end+1:], ":")
	if rest == "" {
		return head
	}
	if first, _, more := strings.Cut(rest, ":"); more {
		return head + ":" + first + ":*"
	}
	return head + ":" + rest
}

// ProcessPipelineHook implements redis.Hook.
func (h *CountHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if handshake(cmds...) {
			h.addHandshake()
		} else {
			h.add("pipeline", 1)
		}
		return next(ctx, cmds)
	}
}

func (h *CountHook) add(name string, n int64) {
	h.n.Add(n)
	h.mu.Lock()
	h.byName[name] += n
	h.mu.Unlock()
}

func (h *CountHook) addHandshake() {
	h.mu.Lock()
	h.byName["handshake"]++
	h.mu.Unlock()
}

// RoundTrips returns the round trips counted so far, handshakes left out.
func (h *CountHook) RoundTrips() int64 { return h.n.Load() }

// ByName returns the round trips counted so far by name (see [CallName];
// a pipeline is "pipeline").
func (h *CountHook) ByName() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.byName)
}

// Queues returns the asynq queues orderworker uses with the shard setting
// s: every shard queue of every task type (tasks.Shards.AllQueues).
func Queues(s tasks.Shards) []string { return s.AllQueues(tasks.Kinds()) }

// Progress is one sample of [WaitFinished].
type Progress struct {
	At       time.Time
	Finished int64
}

// WaitFinished polls [asynqredis.Finished] of the queues names every poll until n tasks are
// completed or archived, and returns the samples taken (the last one at or
// past n). It returns ctx's cause when ctx ends first, with the samples so
// far.
func WaitFinished(ctx context.Context, rdb redis.UniversalClient, names []string, n int64, poll time.Duration) ([]Progress, error) {
	t := time.NewTicker(poll)
	defer t.Stop()
	var samples []Progress
	for {
		c, a, err := asynqredis.Finished(ctx, rdb, names)
		if err == nil {
			samples = append(samples, Progress{At: time.Now(), Finished: c + a})
			if c+a >= n {
				return samples, nil
			}
		}
		select {
		case <-ctx.Done():
			return samples, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// Window returns the rate of tasks per second between the samples where
// lo·n and hi·n tasks were first seen finished (0 ≤ lo < hi ≤ 1), which
// leaves out start-up and the tail.
func Window(samples []Progress, n int64, lo, hi float64) float64 {
	var a, b *Progress
	for i := range samples {
		s := &samples[i]
		if a == nil && float64(s.Finished) >= lo*float64(n) {
			a = s
		}
		if b == nil && float64(s.Finished) >= hi*float64(n) {
			b = s
		}
	}
	if a == nil || b == nil || !b.At.After(a.At) {
		return 0
	}
	return float64(b.Finished-a.Finished) / b.At.Sub(a.At).Seconds()
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1, nearest rank) of sorted
// durations, or 0 for none.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q * float64(len(sorted))))
	return sorted[max(0, min(len(sorted)-1, i-1))]
}

// Ms formats d in milliseconds with two decimals.
func Ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// RedisCPU returns the CPU time (user + system, all threads) the Redis
// server has used, from INFO cpu.
func RedisCPU(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("info cpu: %w", err)
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(m[k], 64)
		if err != nil {
			return 0, fmt.Errorf("info cpu: %s: %w", k, err)
		}
		total += v
	}
	return time.Duration(total * float64(time.Second)), nil
}
