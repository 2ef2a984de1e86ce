package token

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Local fetches once for many callers, keeps the token in the process
// until it is due, fetches again after an Invalidate of it, serves a due
// but valid token when the fetch fails, and touches no Redis.
func TestLocal(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 3600)
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	l, err := NewLocal(u.source(t), LocalConfig{Now: clock})
	require.NoError(t, err)
	var wg sync.WaitGroup
	got := make([]string, 20)
	for i := range got {
		wg.Go(func() {
			tok, err := l.Get(t.Context())
			require.NoError(t, err)
			got[i] = tok
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, u.Issued.Load(), "one fetch for all")
	for _, g := range got {
		require.Equal(t, got[0], g)
	}
	require.Equal(t, http.StatusOK, u.Call(t, got[0]))

	require.NoError(t, l.Invalidate(t.Context(), "another"))
	tok, err := l.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, got[0], tok, "an Invalidate of another token changes nothing")
	require.NoError(t, l.Invalidate(t.Context(), tok))
	tok2, err := l.Get(t.Context())
	require.NoError(t, err)
	require.NotEqual(t, tok, tok2)
	require.EqualValues(t, 2, u.Issued.Load())

	// Due (RefreshBefore left) but valid: a failed fetch still serves it.
	failing, err := NewLocal(SourceFunc(func(context.Context) (Token, error) {
		return Token{}, errors.New("idp down")
	}), LocalConfig{Now: clock})
	require.NoError(t, err)
	_, err = failing.Get(t.Context())
	require.ErrorIs(t, err, ErrUnavailable)
	mu.Lock()
	now = now.Add(3600*time.Second - 5*time.Second - 8*time.Second)
	mu.Unlock()
	require.EqualValues(t, 2, u.Issued.Load())
	tok3, err := l.Get(t.Context())
	require.NoError(t, err)
	require.NotEqual(t, tok2, tok3, "a due token is fetched again")

	require.NoError(t, l.Close())
	_, err = l.Get(t.Context())
	require.ErrorIs(t, err, ErrClosed)
}
