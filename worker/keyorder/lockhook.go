package keyorder

import (
	"context"
	"time"

	"github.com/orderworker/orderworker/worker/keyorder/internal/lockhook"
)

// hookLocker is a locker as package keyordertest takes it (through
// internal/lockhook), for other packages' tests that hold a key by hand.
type hookLocker struct{ l *locker }

func init() {
	lockhook.NewLocker = func(seq any) (lockhook.Locker, error) {
		s, _ := seq.(*Sequencer)
		l, err := newLocker(s, lockConfig{})
		if err != nil {
			return nil, err
		}
		return hookLocker{l}, nil
	}
}

func (h hookLocker) Acquire(ctx context.Context, key, holder string) (any, error) {
	l, err := h.l.Acquire(ctx, key, holder, Wait{})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h hookLocker) AcquireTurn(ctx context.Context, key, holder string, pos int64, label string, deadline time.Duration) (any, error) {
	l, err := h.l.AcquireTurn(ctx, key, holder, Turn{Pos: pos, Label: label}, Wait{Deadline: deadline})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h hookLocker) Close() error { return h.l.Close() }
