package keyorder

import (
	"github.com/redis/go-redis/v9"

	"context"
	"errors"
	"fmt"
	"time"
)

// Do and DoTurn run fn under a lease: the lock's own tests use them; the
// product takes turns with [Turns].

// Do takes the lock of key (waiting by policy w), keeps its lease renewed
// while fn runs, and releases it when fn returns, also when ctx was
// cancelled and when fn panics (the panic then goes on). fn's context is
// cancelled with cause ErrLost if the lease is lost; fn's error is then
// wrapped so that errors.Is(err, ErrLost) holds.
//
// Do returns Acquire's error when the lock was not taken, and otherwise fn's
// error. A failed release is logged, not returned: fn's work is done, and the
// lock then expires with its lease.
func (l *Locker) Do(ctx context.Context, key, meta string, w Wait, fn func(ctx context.Context, lease *Lease) error) error {
	return l.DoTurn(ctx, key, meta, Turn{}, w, fn)
}

// DoTurn is Do in the turn of a position (see AcquireTurn). fn says with
// [Lease.Finish] whether its work for the position is done; the release then
// passes the turn on. A turn that is not finished stays: the position is
// still next, and fn's caller runs it again later.
func (l *Locker) DoTurn(ctx context.Context, key, meta string, turn Turn, w Wait, fn func(ctx context.Context, lease *Lease) error) (err error) {
	lease, err := l.AcquireTurn(ctx, key, meta, turn, w)
	if err != nil {
		return err
	}
	wctx := lease.Keep(ctx)
	defer func() {
		if cause := context.Cause(wctx); errors.Is(cause, ErrLost) && err != nil && !errors.Is(err, ErrLost) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		l.release(ctx, lease, err == nil)
	}()
	return fn(wctx, lease)
}

// WithSeq and Positionless expose the payload rewriting of Client.Enqueue
// to the fuzz tests.
var (
	WithSeq      = withSeq
	Positionless = positionless
)

// CheckKey is the engine's check of a key, for its fuzz test.
func CheckKey(key string) error { return checkKey(key, "") }

// ReserveLua and ReserveArgs let the tests write a reservation script of
// their own (the Client's is the product's one).
const ReserveLua = reserveLua

func (q *Sequencer) ReserveArgs(key, label, ref string) (string, int64, int64, error) {
	return q.reserveArgs(key, label, ref)
}

// HeadFate is what the Runner's Turns learn of the head pos of key's
// sequence, reserved under label, once it has waited longer than GapWait.
func (r *Runner) HeadFate(ctx context.Context, key string, pos int64, label string) (string, time.Duration, error) {
	return r.tasks.HeadFate(ctx, key, &TurnError{Key: key, Head: pos, Pos: pos + 1, Label: label})
}

// The parts behind the package line, for the external tests.
const MaxAhead = maxAhead
const MaxReasonLen = maxReasonLen
const MaxTaskIDLen = maxTaskIDLen
const SeqField = seqField

type ClaimedError = claimedError
type CommitStep = commitStep
type PausedError = pausedError
type QueueTasksConfig = queueTasksConfig
type ReserveCmd = reserveCmd
type Stale = staleHold
type TaskRun = taskRun
type TurnsConfig = turnsConfig

var Label = taskLabel
var NewQueueTasks = newQueueTasks
var NewTurns = newTurns
var Position = payloadPos

type Turns = turns

// Stuck is stuck, for the tests of the tasks a hold could not end.
func (l *locker) Stuck(queue, id string, err error) { l.stuck(queue, id, err) }

// Halt is the halt that the gap check writes for an archived head under
// FailureHalt (Runner.haltArchived), alone: a test writes it without the
// archive, as a worker that died between its release and asynq's archive
// would leave it.
func (r *Runner) Halt(ctx context.Context, key string, pos int64, label, why string) (bool, error) {
	return r.l.Sequencer().halt(ctx, key, pos, label, why)
}

// The lock, behind the package line (the product takes it in a Runner's
// turns; keyordertest.NewLocker holds a key by hand in other packages'
// tests).
type Locker = locker
type Lease = lease
type Config = lockConfig

var New = newLocker

// The lock's errors and the Sequencer's pipelined reservation, for the
// external tests.
var (
	ErrClosed  = errClosed
	ErrNotHeld = errNotHeld
)

func (q *Sequencer) Note(ctx context.Context, key string, pos int64, label, outcome string) error {
	return q.noteAt(ctx, key, pos, label, outcome)
}

func (q *Sequencer) PausedKeys(ctx context.Context, offset, limit int64) ([]pausedSince, error) {
	return q.pausedKeys(ctx, offset, limit)
}

func (q *Sequencer) LoadScripts(ctx context.Context) error { return q.loadScripts(ctx) }

func (q *Sequencer) ReserveIn(ctx context.Context, pipe redis.Pipeliner, key, label, ref string) (*reserveCmd, error) {
	if err := checkLabel(key, label, ref); err != nil {
		return nil, err
	}
	return q.reserveIn(ctx, pipe, key, label, ref), nil
}

func (q *Sequencer) Void(ctx context.Context, key string, pos int64, label, reason string) (settlement, error) {
	return q.voidPos(ctx, key, pos, label, reason)
}

// Or is Wait's defaulting, for the Runner's tests.
func (w Wait) Or(d Wait) Wait { return w.or(d) }

func (q *Sequencer) Finish(ctx context.Context, key string, pos int64, label, ref, outcome string) (settlement, error) {
	return q.finish(ctx, key, pos, label, ref, outcome)
}
