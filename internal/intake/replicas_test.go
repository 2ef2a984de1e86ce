package intake

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/orders/redisstore"
	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/producer"
)

// A change the replicas did not confirm (producer.Config.WaitReplicas) is
// answered 503 with Retry-After, and so is its repeat: never 202 or 409
// until a replica has it.
func TestUnconfirmedChangeIsUnavailable(t *testing.T) {
	t.Parallel()
	db := redistest.New(t) // no replica: nothing can be confirmed
	p, err := producer.New(db.Client, producer.Config{KeyPrefix: db.Prefix, WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	store, err := redisstore.New(db.Client, redisstore.Config{Prefix: db.Prefix})
	require.NoError(t, err)
	s, err := New(db.Client, p, store, Config{APIKeys: []string{key1}})
	require.NoError(t, err)
	srv := httptest.NewServer(record(t, s))
	t.Cleanup(srv.Close)
	e := &env{srv: srv, db: db, rdb: db.Client, store: store, insp: asynq.NewInspectorFromRedisClient(db.Client)}

	for range 2 {
		r := e.post(t, "/v1/orders/SO1001/modify", "ev-1", modifyBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
		assert.NotEmpty(t, r.header.Get("Retry-After"))
		assert.Equal(t, codeUnavailable, r.errorBody(t).Error.Code)
	}
}
