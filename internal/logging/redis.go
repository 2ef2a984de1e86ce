package logging

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// go-redis writes what it cannot return to a caller (a failed dial of a
// pool's background connection, a Cluster's failed slot reload, a
// connection it drops) to one process-wide logger, by default unstructured
// lines on stderr. [CaptureRedis] points that logger at a [RedisSink], which
// forwards each line to a *zap.Logger as one entry. go-redis's logger is a
// global of its package, so only a main installs the sink, once, before it
// builds a client; run functions (which tests call many times, in
// parallel) only set where it forwards, with [RedisSink.Set].

// RedisSink forwards go-redis's log lines to a *zap.Logger, on its "redis"
// child, at Warn level, as the message "redis client" with the line in the
// field "detail". Lines written before Set, or after Set(nil), are dropped.
// The zero value is ready to use; it is safe for concurrent use.
type RedisSink struct {
	log atomic.Pointer[zap.Logger]
}

// Set makes s forward to log's "redis" child; nil drops the lines.
func (s *RedisSink) Set(log *zap.Logger) {
	if log == nil {
		s.log.Store(nil)
		return
	}
	s.log.Store(log.Named("redis"))
}

// Printf is go-redis's logging interface.
func (s *RedisSink) Printf(_ context.Context, format string, v ...any) {
	if log := s.log.Load(); log != nil {
		log.Warn("redis client", zap.String("detail", fmt.Sprintf(format, v...)))
	}
}

// Redis is the process's sink of go-redis's log lines, installed by
// [CaptureRedis].
var Redis RedisSink

// CaptureRedis installs [Redis] as go-redis's logger. Call it once, from
// main, before any Redis client exists: go-redis reads its logger without a
// lock.
func CaptureRedis() { redis.SetLogger(&Redis) }
