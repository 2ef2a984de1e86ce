package keyorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Reservation is a position of a key, and the linked position of another
// key, that [Client.Reserve] took for a task not yet enqueued: the first
// of the two steps of an enqueue that cannot be one script (a Cluster, a
// task scheduled for later). Enqueue its task with [Reservation.Enqueue],
// or give its positions up with [Reservation.Void]; a reservation left
// alone holds its key's later tasks until the Runners skip it, after their
// GapWait, once they are sure no task holds it. A Reservation is safe for
// concurrent use.
type Reservation struct {
	// Key, Label and Pos are the key's position.
	Key, Label string
	Pos        int64
	// Link, LinkLabel and LinkPos are [AtOnce].Link's position (LinkPos 0
	// for none).
	Link, LinkLabel string
	LinkPos         int64
	// Claimed is what [AtOnce].Claim held before Reserve (its value); ""
	// when Reserve set it. Reserve takes the positions either way: the
	// caller decides what a claim that existed means, and voids them.
	Claimed string

	c *Client
}

// Reserve takes the next position of key under x.Label (required: the
// label of the task to come, a taskLabel of its queue and task ID for a
// Runner with the default RunnerConfig.Locate), and with x.Link the
// linked position of another key (never parked, not capped), sets x.Claim
// when it does not exist, and runs x.Pipe's commands, in one round trip:
// a pipeline, so that the keys may live on different Cluster nodes (and
// the claim is set before the positions are taken, but not atomically
// with them). When a master lost the engine's script, it loads it and
// takes again, in a second round trip, only what that master refused
// (x.Pipe's commands run once, in the first).
//
// Past SeqConfig.MaxWaiting it returns a [*FullError], having given
// back the linked position and the claim it set. It returns Redis errors,
// wrapped, having given back what it took.
func (c *Client) Reserve(ctx context.Context, key string, x AtOnce) (*Reservation, error) {
	if x.Label == "" {
		return nil, errors.New("keyorder: Reserve: AtOnce.Label is required")
	}
	if err := checkLabel(key, x.Label, ""); err != nil {
		return nil, err
	}
	if x.Link != "" {
		if err := checkLabel(x.Link, x.LinkLabel, x.LinkRef); err != nil {
			return nil, err
		}
	}
	if err := x.checkClaim(); err != nil {
		return nil, err
	}
	var claim *redis.StatusCmd
	var own, link *reserveCmd
	_, _ = c.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		if x.Claim != "" {
			claim = pipe.SetArgs(ctx, x.Claim, x.ClaimValue, redis.SetArgs{Mode: "NX", Get: true, TTL: x.ClaimTTL})
		}
		own = c.seq.reserveIn(ctx, pipe, key, x.Label, "")
		if x.Link != "" {
			link = c.seq.reserveIn(ctx, pipe, x.Link, x.LinkLabel, x.LinkRef)
		}
		if x.Pipe != nil {
			x.Pipe(pipe)
		}
		return nil
	}) // each command keeps its own error, read below
	var loadErr error
	if againOwn, againLink := noScript(own), noScript(link); againOwn || againLink {
		// A master lost its script cache (a restart, a replica promoted
		// in a failover): load the script and take again only what that
		// master refused. On a Cluster the other key may live on a master
		// that ran it: taking that again would leave a position behind.
		if loadErr = c.seq.loadScripts(ctx); loadErr == nil {
			_, _ = c.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				if againOwn {
					own = c.seq.reserveIn(ctx, pipe, key, x.Label, "")
				}
				if againLink {
					link = c.seq.reserveIn(ctx, pipe, x.Link, x.LinkLabel, x.LinkRef)
				}
				return nil
			})
		}
	}
	r := &Reservation{Key: key, Label: x.Label, Link: x.Link, LinkLabel: x.LinkLabel, c: c}
	ownClaim := false
	var claimErr error
	if claim != nil {
		prev, err := claim.Result()
		switch {
		case errors.Is(err, redis.Nil):
			ownClaim = true
		case err != nil:
			claimErr = fmt.Errorf("keyorder: claim %s: %w", x.Claim, err)
		default:
			r.Claimed = prev
		}
	}
	var err, linkErr error
	if r.Pos, err = own.Pos(); err != nil {
		err = fmt.Errorf("keyorder: %w", err)
	}
	if link != nil {
		// Read even when the key's own failed: a linked position taken
		// is given back below.
		if r.LinkPos, linkErr = link.Pos(); linkErr != nil {
			linkErr = fmt.Errorf("keyorder: linked %w", linkErr)
		}
	}
	err = cmp.Or(loadErr, err, linkErr, claimErr)
	if err != nil {
		// Nothing will hold what was taken: give it back.
		why := "reservation failed"
		if errors.Is(err, ErrFull) {
			why = "the key's backlog is full"
		}
		_ = r.Void(ctx, why)
		if ownClaim {
			vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), defaultSettleTimeout)
			_ = releaseClaim.Run(vctx, c.rdb, []string{x.Claim}, x.ClaimValue).Err()
			cancel()
		}
		return nil, err
	}
	return r, nil
}

// noScript reports whether c ran without Redis having the script.
func noScript(c *reserveCmd) bool {
	if c == nil {
		return false
	}
	_, err := c.Pos()
	return noScriptErr(err)
}

// releaseClaim deletes a claim if it still holds the value ARGV[1].
var releaseClaim = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Enqueue enqueues t at the reservation's position with asynq's Client:
// t's payload (a JSON object without "seq", [ErrPayload]) gets the
// position as its "seq" member. opts are asynq's, as for
// [Client.Enqueue]; they must name the queue and the task ID that the
// reservation's label names (a Runner finds the task by its label).
//
// When asynq refuses the task ID as one its queue holds already
// (asynq.ErrTaskIDConflict), or Enqueue refuses t or opts, no task holds
// the positions, and Enqueue voids them. Another failure leaves them: the
// task may or may not exist, and the Runners skip them once they are sure
// no task holds them.
func (r *Reservation) Enqueue(ctx context.Context, t *asynq.Task, opts ...asynq.Option) (Enqueued, error) {
	o, body, err := checkTask(t, opts)
	if err != nil {
		// Certain: no task will hold the positions.
		_ = r.Void(ctx, "the task was refused: "+err.Error())
		return Enqueued{}, err
	}
	task := asynq.NewTask(t.Type(), withSeq(body, r.Pos))
	all := append(opts[:len(opts):len(opts)], asynq.Queue(o.queue), asynq.TaskID(o.id), asynq.MaxRetry(o.maxRetry+1))
	if _, err := r.c.asynq.EnqueueContext(ctx, task, all...); err != nil {
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			_ = r.Void(ctx, "the enqueue was refused as a duplicate")
		}
		return Enqueued{}, fmt.Errorf("keyorder: enqueue %s for %s at position %d: %w", o.id, r.Key, r.Pos, err)
	}
	return Enqueued{TaskID: o.id, Queue: o.queue, Key: r.Key, Pos: r.Pos, LinkPos: r.LinkPos}, nil
}

// checkTask reads opts and t's payload without a position, refusing a
// nil task, a blank type, options the engine refuses and [ErrPayload].
func checkTask(t *asynq.Task, opts []asynq.Option) (enqueueOptions, []byte, error) {
	if t == nil || strings.TrimSpace(t.Type()) == "" {
		return enqueueOptions{}, nil, errors.New("keyorder: enqueue: nil task or blank type")
	}
	o, err := options(opts)
	if err != nil {
		return enqueueOptions{}, nil, err
	}
	body, err := positionless(t.Payload())
	return o, body, err
}

// Void gives up the reservation's positions, whose task will never exist,
// with why in the keys' sequence logs, and wakes the parked task that a
// void of a head hands the turn to (through ClientConfig.Locate). It runs
// even when ctx is done, bounded by defaultSettleTimeout. It returns the
// first error; a failed void costs the key only the Runners' GapWait.
func (r *Reservation) Void(ctx context.Context, why string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), defaultSettleTimeout)
	defer cancel()
	var first error
	void := func(key, label string, pos int64) {
		if pos <= 0 {
			return
		}
		st, err := r.c.seq.voidPos(ctx, key, pos, label, why)
		if err == nil {
			err = Wake(ctx, r.c.rdb, r.c.cfg.Locate, key, st.Wake)
		}
		if first == nil {
			first = err
		}
	}
	void(r.Key, r.Label, r.Pos)
	void(r.Link, r.LinkLabel, r.LinkPos)
	return first
}
