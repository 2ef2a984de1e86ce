// Package embedded runs an in-process Redis (miniredis) whose key TTLs run in
// real time, for the demo and for trying orderworker on a machine without a
// Redis server.
//
// It is a stand-in, not a Redis: it keeps everything in memory, has no
// persistence, no replication and one CPU's worth of throughput, and it is
// only as faithful as miniredis's command set. Production and the tests use a
// real redis-server.
package embedded

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
)

// Server is a running in-process Redis. Close it when done.
type Server struct {
	m *miniredis.Miniredis
}

// Start starts an in-process Redis on a free loopback port. Its TTLs decrease
// with the wall clock, as on a real server.
func Start() (*Server, error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("embedded: start: %w", err)
	}
	m.ClockTTL(true)
	return &Server{m: m}, nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.m.Addr() }

// URL returns a redis:// URL for database 0.
func (s *Server) URL() string { return "redis://" + s.m.Addr() + "/0" }

// Close stops the server and drops its data.
func (s *Server) Close() { s.m.Close() }
