package orders

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWriteContext(t *testing.T) {
	t.Parallel()
	_, ok := WriteFrom(t.Context())
	assert.False(t, ok)
	w := Write{Fence: 42, Worker: "w1", StartedAt: time.Unix(1, 0)}
	got, ok := WriteFrom(WithWrite(t.Context(), w))
	assert.True(t, ok)
	assert.Equal(t, w, got)
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"not found", fmt.Errorf("modify SO1: %w", ErrNotFound), true},
		{"closed sentinel", ErrClosed, true},
		{"closed error", &ClosedError{OrderNo: "A", Status: StatusExchanged, ExchangedTo: "B"}, true},
		{"conflict", fmt.Errorf("x: %w", ErrConflict), true},
		{"no fence", ErrNoFence, true},
		{"invalid", ErrInvalid, true},
		{"stale fence", fmt.Errorf("modify SO1: %w", ErrStaleFence), false},
		{"redis nil", redis.Nil, false},
		{"network", errors.New("dial tcp: connection refused"), false},
		{"context", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.want, Permanent(tt.err))
		})
	}
}

func TestClosedError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  *ClosedError
		want string
	}{
		{"exchanged", &ClosedError{OrderNo: "A", Status: StatusExchanged, ExchangedTo: "B"}, "orders: order A is exchanged; its replacement is order B"},
		{"cancelled", &ClosedError{OrderNo: "A", Status: StatusCancelled}, "orders: order A is cancelled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.EqualError(t, tt.err, tt.want)
			assert.ErrorIs(t, fmt.Errorf("wrapped: %w", tt.err), ErrClosed)
			assert.NotErrorIs(t, tt.err, ErrNotFound)
		})
	}
}
