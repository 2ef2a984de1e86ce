package redisstore

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"net"
	"reflect"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
	"github.com/orderworker/orderworker/tasks"
	"github.com/orderworker/orderworker/worker"
	"github.com/orderworker/orderworker/worker/keyorder"
	"github.com/orderworker/orderworker/worker/keyorder/keyordertest"
	"github.com/orderworker/orderworker/worker/orders"
)

// Every kind of the contract has its write's declaration (see writeKind),
// under its type, and the store implements the write its worker entry
// asks for: a kind added to tasks.Kinds without its declaration fails
// here, not in a replay that reads a record no declaration knows.
func TestEveryKindHasADeclaration(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	entries := map[*tasks.Kind]worker.Kind{}
	for _, e := range worker.Kinds() {
		entries[e.Kind] = e
	}
	for _, k := range tasks.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			wk := writeKinds[k.Type]
			require.NotNil(t, wk, "%s has no writeKind: declare one beside its write in redis.go", k)
			assert.NotEqual(t, noStep, wk.step, "%s runs applyScript: declare its step (lastStep or moreSteps)", k)
			assert.NotNil(t, wk.request, "%s records its events: declare the request its fingerprint hashes", k)
			e, ok := entries[k]
			require.True(t, ok, "%s has no worker entry", k)
			assert.NoError(t, e.Check(s), "the store implements the write of %s", k)
		})
	}
}

// The declarations are distinct: one per type and per letter, each with
// its entries' detail, and a request type (when there is one) whose
// every field is tagged, since its JSON is the fingerprint.
func TestWriteKindsAreDistinct(t *testing.T) {
	t.Parallel()
	letters := map[byte]string{}
	for typ, wk := range writeKinds {
		assert.Equal(t, typ, wk.typ)
		assert.NotZero(t, wk.letter, typ)
		assert.NotContains(t, letters, wk.letter, "%s and %s share the letter %q", typ, letters[wk.letter], wk.letter)
		letters[wk.letter] = typ
		assert.Same(t, wk, kindOfLetter(wk.letter))
		assert.NotNil(t, wk.detail, "%s reads its entries' detail", typ)
		if wk.request != nil {
			require.Equal(t, reflect.Struct, wk.request.Kind(), typ)
			for i := range wk.request.NumField() {
				assert.NotEmpty(t, wk.request.Field(i).Tag.Get("json"), "%s: field %s of its fingerprint's request has no json tag", typ, wk.request.Field(i).Name)
			}
		}
	}
	for _, want := range []string{orders.TypePut, orders.TypeNote, orders.TypeCreated} {
		assert.Contains(t, writeKinds, want, "the store's own writes are declared too")
	}
}

// TestEveryKindCommitsInItsLastStep runs each kind's write (its worker
// entry's handler on the kind's example) through the store under a lock
// lease offered as the commit hook, and reads the commands the store
// sent: a kind whose applyScript is the last command of its write must
// be declared lastStep, and the lock is then released by that script, in
// the write's own round trip; a kind whose write sends more after it
// must be declared moreSteps (committing in it would hand the order on
// before the write is done), and the lock is then still held when the
// write returns. A wrong step fails here: with moreSteps a one-step write
// still works, only slower, and nothing else would tell.
func TestEveryKindCommitsInItsLastStep(t *testing.T) {
	t.Parallel()
	for _, e := range worker.Kinds() {
		t.Run(e.Kind.Name, func(t *testing.T) {
			t.Parallel()
			wk := writeKinds[e.Kind.Type]
			require.NotNil(t, wk, "%s has no writeKind", e.Kind)
			db := redistest.New(t)
			rec := &commandLog{}
			client := db.NewClient(t)
			client.AddHook(rec)
			s, err := New(client, Config{Prefix: db.Prefix})
			require.NoError(t, err)
			require.NoError(t, s.Put(t.Context(), orders.Order{No: "SO1", Address: "a", Items: []orders.Item{{SKU: "A", Qty: 1}}}))

			space, err := keyorder.NewSequencer(db.Client, keyorder.SeqConfig{Prefix: db.Prefix + "lock:"})
			require.NoError(t, err)
			locker, err := keyordertest.NewLocker(space)
			require.NoError(t, err)
			t.Cleanup(func() { _ = locker.Close() })
			lease, err := locker.Acquire(t.Context(), "SO1", e.Kind.Type)
			require.NoError(t, err)
			lockKey := db.Prefix + "lock:{SO1}"

			p, err := e.Kind.ExamplePayload("ev-1", "SO1")
			require.NoError(t, err)
			rec.start()
			ctx := orders.WithWrite(t.Context(), orders.Write{Fence: lease.Fence(), Worker: "w", Commit: lease})
			require.NoError(t, e.Apply(ctx, s, p))
			sent := rec.stop()
			require.NotEmpty(t, sent)
			applies := 0
			for _, c := range sent {
				if c == "applyScript" {
					applies++
				}
			}
			require.Equal(t, 1, applies, "the write of %s runs applyScript once: %q", e.Kind, sent)
			last := sent[len(sent)-1] == "applyScript"
			held := db.Client.Exists(t.Context(), lockKey).Val() == 1
			if last {
				assert.Equal(t, lastStep, wk.step, "applyScript is the last command of %s's write: declare it lastStep, so that it commits in the write's round trip (sent %q)", e.Kind, sent)
			} else {
				assert.Equal(t, moreSteps, wk.step, "%s's write sends more after its applyScript: declare it moreSteps (sent %q)", e.Kind, sent)
			}
			assert.Equal(t, wk.step == moreSteps, held, "the lock is released by the commit only when applyScript is the write's last step")
			require.NoError(t, lease.Release(t.Context()))
			assert.Zero(t, db.Client.Exists(t.Context(), lockKey).Val())
		})
	}
}

// commandLog is a go-redis hook that logs, between start and stop, the
// commands a client sent and Redis ran (a script of the store by its
// name, another by its SHA-1, whether
// sent with EVALSHA or EVAL; the EVAL that Script.Run sends after its
// EVALSHA of the same script is left out), pipelines included.
type commandLog struct {
	mu   sync.Mutex
	on   bool
	cmds []string
	sha  string // the script of the last command, an EVALSHA
}

func (l *commandLog) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on, l.cmds = true, nil
}

func (l *commandLog) stop() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = false
	return l.cmds
}

func (l *commandLog) log(cmds ...redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on {
		return
	}
	for _, c := range cmds {
		args := c.Args()
		name := c.Name()
		switch {
		case name == "evalsha" && len(args) > 1:
			name, _ = args[1].(string)
			l.sha = name
		case name == "eval" && len(args) > 1:
			src, _ := args[1].(string)
			sum := sha1.Sum([]byte(src))
			name = hex.EncodeToString(sum[:])
			if name == l.sha {
				// Script.Run's EVAL after the EVALSHA it answered with NOSCRIPT.
				l.sha = ""
				continue
			}
		default:
			l.sha = ""
		}
		l.cmds = append(l.cmds, cmp.Or(scriptNames[name], name))
	}
}

// scriptNames names the store's scripts by their SHA-1, for commandLog.
var scriptNames = map[string]string{
	applyScript.Hash(): "applyScript", claimScript.Hash(): "claimScript", unclaimScript.Hash(): "unclaimScript",
	createScript.Hash(): "createScript", putScript.Hash(): "putScript", annotateScript.Hash(): "annotateScript",
	historyScript.Hash(): "historyScript",
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.log(cmd)
		return err
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		l.log(cmds...)
		return err
	}
}
