package keyorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// A release whose reply is lost (its link cut mid-call, a timeout) may
// have run or not: a partition delivers the command when it heals, after
// its sender gave up on it, and the reply goes to a connection the client
// has closed. A release that passed the turn on then called the next
// position's parked holder back to nobody, and that holder waits out its
// whole park. So the locker runs such a release again, in the background,
// until Redis answers; and a release that finds its position finished and
// the lock free (the first one ran, or a store's commit did, without its
// reply reaching the holder) calls the next position's parked holder back
// itself ([rewakeScript]).

// rewakeScript finds the parked holder that a lost release called back to
// nobody: after position pos was finished, the next position's holder,
// waiting in its park for a call back that never reached anyone.
//
// KEYS[1] lock hash, KEYS[2] sequence
// ARGV[1] the finished position
//
// Returns the label of the next position when the sequence's cursor is at
// pos (pos is the last finished), the lock is free, the key is not
// paused, and the next position is pending and not backing off after a
// failure (no r: mark): its holder is parked, or on its way; "" otherwise.
// It writes nothing but the next position's k: mark, which it clears.
var rewakeScript = redis.NewScript(numLua + `
local st = redis.call('HMGET', KEYS[2], 'd', 'h')
local d = tonumber(st[1])
if not d or d ~= tonumber(ARGV[1]) or st[2] then return '' end
if redis.call('EXISTS', KEYS[1]) == 1 then return '' end
local nx = num(d + 1)
local m = redis.call('HMGET', KEYS[2], 'p:' .. nx, 'r:' .. nx)
local rec = m[1]
if not rec or m[2] or not string.find(string.sub(rec, 1, 1), '%d') then return '' end
local sp = string.find(rec, ' ', 1, true)
if not sp then return '' end
redis.call('HDEL', KEYS[2], 'k:' .. nx)
return string.sub(rec, sp + 1)
`)

// rewake returns the label of the parked holder that a lost release of
// key's position pos called back to nobody (see rewakeScript), or "".
func (l *locker) rewake(ctx context.Context, key string, pos int64) (string, error) {
	label, err := rewakeScript.Run(ctx, l.rdb, []string{l.lockKey(key), l.seq.SeqKey(key)}, pos).Text()
	if err != nil {
		return "", fmt.Errorf("keyorder: call back the holder after %s's position %d: %w", key, pos, err)
	}
	return label, nil
}

// redo is a finished turn's release whose outcome is unknown.
type redo struct {
	key, owner string
	pos        int64
	until      time.Time
}

// redoEvery is how often the locker tries its unknown releases again, and
// redoFor (in TTLs) how long it keeps trying: a partition of some minutes
// heals within it.
const (
	redoEvery = 250 * time.Millisecond
	redoFor   = 10
)

// redoLater queues r, starting the goroutine that retries it (owned by the
// locker: Close stops it and waits).
func (l *locker) redoLater(r redo) {
	l.redoMu.Lock()
	defer l.redoMu.Unlock()
	if l.redoStopped {
		return
	}
	l.redos = append(l.redos, r)
	if !l.redoRunning {
		l.redoRunning = true
		l.redoWG.Add(1)
		go l.redoLoop()
	}
}

// redoLoop retries the unknown releases every redoEvery until each gets an
// answer or its time is up, then ends; redoLater starts another when one
// comes.
func (l *locker) redoLoop() {
	defer l.redoWG.Done()
	t := time.NewTicker(redoEvery)
	defer t.Stop()
	for {
		select {
		case <-l.redoStop:
			return
		case <-t.C:
		}
		l.redoMu.Lock()
		todo := l.redos
		l.redos = nil
		l.redoMu.Unlock()
		var left []redo
		for _, r := range todo {
			switch {
			case l.redoOnce(r):
			case time.Now().Before(r.until):
				left = append(left, r)
			default:
				l.log.Warn("release still unknown; its turn passes with the gap check", slog.String("key", r.key), slog.Int64("seq", r.pos))
			}
		}
		l.redoMu.Lock()
		l.redos = append(left, l.redos...)
		if len(l.redos) == 0 {
			l.redoRunning = false
			l.redoMu.Unlock()
			return
		}
		l.redoMu.Unlock()
	}
}

// redoOnce runs r's release again, and calls back the next position's
// holder when the release finds its turn passed without it; it reports
// whether Redis answered.
func (l *locker) redoOnce(r redo) bool {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.ReleaseTimeout)
	defer cancel()
	res, err := releaseScript.Run(ctx, l.rdb, append([]string{l.lockKey(r.key)}, l.seq.withBacklog(l.seq.SeqKey(r.key))...),
		r.owner, l.channel, r.pos, "1", "").Slice()
	if err != nil {
		return false
	}
	wake := ""
	if len(res) > 1 {
		wake, _ = res[1].(string)
	}
	if n, _ := res[0].(int64); n == 0 && wake == "" {
		if wake, err = l.rewake(ctx, r.key, r.pos); err != nil {
			return false
		}
	}
	if wake != "" {
		l.log.Info("release answered after its link came back; calling the next holder back",
			slog.String("key", r.key), slog.Int64("seq", r.pos))
		if cb := l.onWake.Load(); cb != nil {
			(*cb)(ctx, r.key, splitWake(wake))
		}
	}
	return true
}

// stopRedo stops the retrying goroutine and waits for it (Close).
func (l *locker) stopRedo() {
	l.redoMu.Lock()
	if !l.redoStopped {
		l.redoStopped = true
		close(l.redoStop)
	}
	l.redos, l.endedTurns, l.stuckTasks = nil, nil, nil
	l.redoMu.Unlock()
	l.redoWG.Wait()
}

// unknownOutcome reports whether err, a release script's, leaves it
// unknown whether the script ran: a timeout or a broken link, not an
// answer of Redis.
func unknownOutcome(err error) bool {
	var rerr redis.Error
	return err != nil && !errors.As(err, &rerr)
}
