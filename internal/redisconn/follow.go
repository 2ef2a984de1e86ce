package redisconn

import (
	"context"
	"net"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// followMaster is the hook of a Sentinel client that moves its pub/sub
// subscriptions to a new master.
//
// On a failover, go-redis's failover client closes its pooled connections
// to the old master, but not its pub/sub connections. After SENTINEL
// FAILOVER (or a partition that heals) the old master keeps running, as a
// master nobody publishes to, until the sentinels turn it into a replica
// at least 8 s later; a subscription left there hears nothing meanwhile
// (for the lock, every release notice is lost and waiters fall back to
// their random delays). So the hook tracks every connection the client
// dials, and when one is dialed to another address than the others (the
// new master), it closes the others: go-redis then resubscribes its
// PubSubs, through Sentinel, on the new master. The next command after
// the switch dials the new master, since go-redis dropped the pooled
// connections; every subscriber of orderworker sends one before it waits
// on a notice.
type followMaster struct {
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

var _ redis.Hook = (*followMaster)(nil)

func newFollowMaster() *followMaster {
	return &followMaster{conns: make(map[*trackedConn]struct{})}
}

// DialHook implements redis.Hook.
func (f *followMaster) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: conn, f: f, remote: conn.RemoteAddr().String()}
		var stale []*trackedConn
		f.mu.Lock()
		for c := range f.conns {
			if c.remote != tc.remote {
				stale = append(stale, c)
			}
		}
		f.conns[tc] = struct{}{}
		f.mu.Unlock()
		for _, c := range stale {
			_ = c.Close()
		}
		if _, ok := conn.(syscall.Conn); ok {
			// Keep go-redis's health check of idle connections, which
			// needs the socket.
			return &trackedSysConn{tc}, nil
		}
		return tc, nil
	}
}

// ProcessHook implements redis.Hook.
func (f *followMaster) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook implements redis.Hook.
func (f *followMaster) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// trackedConn is a connection of a Sentinel client, forgotten when closed.
type trackedConn struct {
	net.Conn
	f      *followMaster
	remote string
	once   sync.Once
}

// Close forgets the connection and closes it. It is safe to call more than
// once; only the first call closes.
func (c *trackedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// NetConn returns the wrapped connection, as crypto/tls.Conn does, for
// go-redis's checks that look through wrappers.
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

// trackedSysConn is a trackedConn whose connection is a socket.
type trackedSysConn struct{ *trackedConn }

// SyscallConn returns the socket's raw connection.
func (c *trackedSysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}
