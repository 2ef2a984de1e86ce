package asynqwire

import (
	"context"
	"reflect"
	"sync"
	"unsafe"

	"github.com/hibiken/asynq"
)

// A task that a worker takes out of its queue itself (a hold's drained
// task, see Step) runs inside the handler of another task, whose context
// carries asynq's metadata of that other task: asynq.GetTaskID,
// GetQueueName, GetRetryCount and GetMaxRetry would report it. asynq
// builds that metadata only in its processor, as a value of an unexported
// type under an unexported key (internal/context of v0.25.1: taskMetadata
// {id, maxRetry, retryCount, qname} under metadataCtxKey). TaskContext
// rebuilds it for the drained task: it learns the key by asking asynq's
// own getter for it, copies the value asynq put in the first task's
// context, and sets the copy's fields. TestTaskContext holds that asynq's
// getters read them back, so that an upgrade which moves them fails there.

// metadataKey returns the context key of asynq's task metadata, as
// asynq.GetTaskID asks a context for it.
var metadataKey = sync.OnceValue(func() any {
	p := &keyProbe{Context: context.Background()}
	asynq.GetTaskID(p)
	return p.key
})

// keyProbe records the key a getter asks it for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(key any) any {
	p.key = key
	return nil
}

// TaskContext returns a context derived from ctx in which asynq's
// GetTaskID, GetQueueName, GetRetryCount and GetMaxRetry report c's, as
// in a run of c that asynq started. ctx must descend from the context of
// a run asynq started, whose metadata it copies; otherwise (and if
// asynq's metadata is not laid out as v0.25.1's) it returns ctx unchanged
// and false.
func TaskContext(ctx context.Context, c *Claimed) (context.Context, bool) {
	key := metadataKey()
	if key == nil {
		return ctx, false
	}
	v := ctx.Value(key)
	if v == nil || reflect.TypeOf(v).Kind() != reflect.Struct {
		return ctx, false
	}
	m := reflect.New(reflect.TypeOf(v)).Elem()
	m.Set(reflect.ValueOf(v))
	set := func(name string, x any) bool {
		f := m.FieldByName(name)
		if !f.IsValid() || f.Type() != reflect.TypeOf(x) {
			return false
		}
		// The fields are unexported: set them through their address.
		reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(x))
		return true
	}
	if !set("id", c.ID) || !set("qname", c.Queue) || !set("retryCount", c.Retried) || !set("maxRetry", c.MaxRetry) {
		return ctx, false
	}
	return context.WithValue(ctx, key, m.Interface()), true
}
