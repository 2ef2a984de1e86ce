package keyorder

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/orderworker/orderworker/worker/keyorder/internal/asynqwire"
)

// A failover loses the writes its old master acknowledged and its replica
// had not received: on the promoted master, a turn that a holder ended in
// that window is still the key's head, its task still active in asynq
// (the task's end was lost too), and the key's lock still held by the
// holder that released it. Nothing then moves the key until the task's
// asynq lease ends (30 s) and the recoverer brings the task back, though
// its change was applied and its holder is alive: every hot key of the
// failed master stalls for that long.
//
// So the locker keeps the turn ends it made in the last reassertWindow
// (their key, the holder's owner token and the position), and, while it
// keeps any, probes Redis every reassertProbe (PING; on a Cluster, each
// master). When a probe fails and a later one succeeds (the master was
// unreachable and is back, or another serves in its place), it ends those
// turns again: for each holder and key, in the order of the positions,
// each position that is still the key's head is finished, and the lock is
// released when that holder still holds it; the holders of the positions
// then in turn are called back. Each of these turns was ended once, after
// its work was done (applied, or given up for good): ending it again
// where it already ended does nothing, and where its end was lost it
// passes the turn on as its holder did. A turn ended before a failure is
// ended again only once, and only its own positions: it never finishes a
// position whose work was not done, so no change runs ahead of its turn.
//
// The probes cost one PING per master every reassertProbe, only while the
// Locker ended a turn in the last reassertWindow; the ends cost one script
// per holder and key after a failure.

// reassertWindow is how long the locker keeps a turn's end to end it again
// after Redis was unreachable: longer than the replication lag that a
// failover can lose (docs/scaling.md), and than the time between the lag's
// start and the first failed probe.
const reassertWindow = 10 * time.Second

// reassertProbe is how often the locker probes Redis while it keeps turn
// ends: the part of a failover's stall that it adds, at most.
const reassertProbe = 200 * time.Millisecond

// maxEnded bounds the turn ends the locker keeps; past it the oldest are
// dropped (a key whose end is dropped and lost waits for its task's lease).
const maxEnded = 1 << 17

// stuckTask is a task taken for a hold whose end (or return unrun) the
// hold could not record in asynq, Redis unreachable: it stays active with
// its lease, run by no one, until the lease ends.
type stuckTask struct{ queue, id string }

// stuck keeps task id of queue, whose end a hold could not record because
// Redis did not answer (err), to bring it back at once when Redis answers
// again (probeLoop), rather than when its lease ends. An error that Redis
// answered leaves the task alone: it is not known to be stuck.
func (l *locker) stuck(queue, id string, err error) {
	if !unavailable(err) && !unknownOutcome(err) {
		return
	}
	l.redoMu.Lock()
	defer l.redoMu.Unlock()
	if l.redoStopped || len(l.stuckTasks) >= maxEnded {
		return
	}
	l.stuckTasks = append(l.stuckTasks, stuckTask{queue: queue, id: id})
	l.startProbe()
}

// endedTurn is a turn a holder ended.
type endedTurn struct {
	key, owner string
	pos        int64
	at         time.Time
}

// ended keeps the end of key's turn at pos by owner, so that it can be
// ended again after Redis was unreachable, and starts the probing
// goroutine (owned by the locker: Close stops it and waits) if it does
// not run.
func (l *locker) ended(key, owner string, pos int64) {
	l.redoMu.Lock()
	defer l.redoMu.Unlock()
	if l.redoStopped {
		return
	}
	now := time.Now() // under the mutex: the turns stay in time order
	if len(l.endedTurns) >= maxEnded {
		// Drop the oldest quarter at once: an append stays O(1) amortized
		// on the run's path, however long the cap holds.
		l.endedTurns = slices.Delete(l.endedTurns, 0, maxEnded/4)
	}
	l.endedTurns = append(l.endedTurns, endedTurn{key: key, owner: owner, pos: pos, at: now})
	l.startProbe()
}

// startProbe starts the probing goroutine (owned by the locker: Close
// stops it and waits) unless it runs; redoMu is held.
func (l *locker) startProbe() {
	if !l.probing {
		l.probing = true
		l.redoWG.Add(1)
		go l.probeLoop()
	}
}

// probeLoop probes Redis every reassertProbe while the locker keeps turn
// ends, and ends them again once Redis answers after a failed probe
// (reassert). It returns when it keeps none.
func (l *locker) probeLoop() {
	defer l.redoWG.Done()
	t := time.NewTicker(reassertProbe)
	defer t.Stop()
	var down time.Time // when a probe first failed; zero while Redis answers
	for {
		select {
		case <-l.redoStop:
			return
		case <-t.C:
		}
		l.redoMu.Lock()
		stuck := len(l.stuckTasks)
		l.redoMu.Unlock()
		err := l.probe()
		switch {
		case err != nil && down.IsZero():
			down = time.Now()
			l.log.Info("Redis did not answer the probe; the turns ended lately are ended again when it does", errAttr(err))
		case err == nil && !down.IsZero():
			l.reassert(down)
			down = time.Time{}
		}
		if err == nil && stuck > 0 {
			l.unstick(stuck)
		}
		l.redoMu.Lock()
		cut := time.Now().Add(-reassertWindow)
		if !down.IsZero() {
			cut = down.Add(-reassertWindow) // keep what the failure may have lost
		}
		i, _ := slices.BinarySearchFunc(l.endedTurns, cut, func(e endedTurn, t time.Time) int { return e.at.Compare(t) })
		l.endedTurns = slices.Delete(l.endedTurns, 0, i)
		if len(l.endedTurns) == 0 && len(l.stuckTasks) == 0 && down.IsZero() {
			l.probing = false
			l.redoMu.Unlock()
			return
		}
		l.redoMu.Unlock()
	}
}

// probe pings Redis: every master of a Cluster, the one server otherwise.
func (l *locker) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), reassertProbe)
	defer cancel()
	if c, ok := l.rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() })
	}
	return l.rdb.Ping(ctx).Err()
}

// unstick brings back the first n stuck tasks, which a hold could not end
// in asynq while Redis was unreachable (stuck), now that Redis answers: it
// ends each one's lease and brings the queue's tasks whose lease ended
// back to the front of their queue (asynqwire.Recover), so that each runs
// again in its turn (or, when its turn passed, finds that out and ends)
// rather than when its lease would have ended. A task that someone took
// again meanwhile would run twice: the fence keeps its store safe, as
// after any lease that ends.
func (l *locker) unstick(n int) {
	l.redoMu.Lock()
	todo := slices.Clone(l.stuckTasks[:n])
	l.stuckTasks = slices.Delete(l.stuckTasks, 0, n)
	l.redoMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.ReleaseTimeout)
	defer cancel()
	queues := map[string]bool{}
	for _, st := range todo {
		if err := asynqwire.ExtendLease(ctx, l.rdb, st.queue, st.id, time.Unix(1, 0)); err != nil {
			l.log.Warn("could not bring back a task whose end Redis did not record; it runs once its lease ends",
				slog.String("task_id", st.id), errAttr(err))
			continue
		}
		queues[st.queue] = true
	}
	for _, q := range slices.Sorted(maps.Keys(queues)) {
		rec, err := asynqwire.Recover(ctx, l.rdb, q, unstickMargin)
		if err != nil {
			l.log.Warn("could not bring back the tasks whose end Redis did not record; they run once their leases end",
				slog.String("queue", q), errAttr(err))
			continue
		}
		l.log.Info("brought back the tasks whose end Redis did not record while it was unreachable",
			slog.String("queue", q), slog.Any("task_ids", rec.IDs))
	}
}

// unstickMargin is the margin of unstick's Recover: a task stuck here has
// its lease ended at the epoch, and another task's lease that ended longer
// ago than this belongs to a worker that is gone.
const unstickMargin = 10 * time.Second

// reassert ends again the turns ended before down (when a probe first
// failed), within reassertWindow of it: one script per holder and key, in
// the order of its positions (reassertScript), calling back the holders
// whose turn it then is. A turn whose script fails stays unended here: its
// key waits for its task's lease, as it would have.
func (l *locker) reassert(down time.Time) {
	l.redoMu.Lock()
	var todo []endedTurn
	for _, e := range l.endedTurns {
		if !e.at.After(down) && e.at.After(down.Add(-reassertWindow)) {
			todo = append(todo, e)
		}
	}
	l.redoMu.Unlock()
	type hold struct{ key, owner string }
	var order []hold
	positions := map[hold][]any{}
	for _, e := range todo {
		h := hold{e.key, e.owner}
		if _, ok := positions[h]; !ok {
			order = append(order, h)
		}
		positions[h] = append(positions[h], e.pos)
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.ReleaseTimeout)
	defer cancel()
	// One pipeline for every holder and key, so that the last key waits
	// for one round trip, not for the scripts of all before it (go-redis
	// splits it by slot on a Cluster).
	run := func() []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(order))
		_, _ = l.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, h := range order {
				keys := append([]string{l.lockKey(h.key)}, l.seq.withBacklog(l.seq.SeqKey(h.key))...)
				cmds[i] = reassertScript.EvalSha(ctx, pipe, keys, append([]any{h.owner, l.channel}, positions[h]...)...)
			}
			return nil
		}) // each command keeps its own error
		return cmds
	}
	cmds := run()
	if slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return noScriptErr(c.Err()) }) {
		// A promoted master without the script in its cache.
		if err := reassertScript.Load(ctx, l.rdb).Err(); err == nil {
			cmds = run()
		}
	}
	passed := 0
	for i, cmd := range cmds {
		h := order[i]
		res, err := cmd.Slice()
		if err != nil || len(res) != 2 {
			l.log.Warn("could not end a turn again after Redis came back; its key waits for its task's lease",
				slog.String("key", h.key), errAttr(err))
			continue
		}
		n, _ := res[0].(int64)
		wake, _ := res[1].(string)
		if n > 0 {
			passed++
			l.log.Info("ended turns again that Redis lost while it was unreachable (a failover)",
				slog.String("key", h.key), slog.Int64("positions", n))
		}
		if wake != "" {
			if cb := l.onWake.Load(); cb != nil {
				(*cb)(ctx, h.key, splitWake(wake))
			}
		}
	}
	if len(order) > 0 {
		l.log.Info("Redis answers again after a failed probe; ended again the turns of the window before",
			slog.Int("keys", len(order)), slog.Int("turns", len(todo)), slog.Int("passed_on", passed))
	}
}

// reassertScript ends again the turns that a holder ended, in the order of
// their positions: each position that is the key's head is finished (as
// lock_commit finishes it), and the lock is released when the holder still
// holds it.
//
// KEYS[1] lock hash, KEYS[2] sequence, KEYS[3] and KEYS[4] (optional) the
// index of backlogs and its sum
// ARGV[1] the holder's owner token, ARGV[2] notice channel, ARGV[3..] the
// positions, ascending
//
// Returns {finished, wake}: how many positions it finished, and the labels
// of the parked holders it called (see lock_commit), after the last.
var reassertScript = redis.NewScript(CommitLua + `
local n, wake = 0, ''
for i = 3, #ARGV do
  local pos = tonumber(ARGV[i])
  local d = tonumber(redis.call('HGET', KEYS[2], 'd'))
  if d and pos == d + 1 then
    local _, w = lock_commit(KEYS[1], ARGV[1], ARGV[2], KEYS[2], pos, true, nil, false, KEYS[3], KEYS[4])
    n = n + 1
    wake = w
  end
end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  local _, w = lock_commit(KEYS[1], ARGV[1], ARGV[2], KEYS[2], 0, false, nil, false, KEYS[3], KEYS[4])
  if w ~= '' then wake = w end
end
return {n, wake}
`)
