// Package redisproc starts, stops, pauses and restarts redis-server
// processes on loopback ports, and builds a Redis Cluster and a Sentinel
// group from them. The tests use it through redistest, and the dev tools
// (tools/bench, tools/stress) use it directly: it imports no testing code, so
// those binaries link no test framework and no in-process Redis.
//
// It needs a redis-server binary on PATH ([ErrNoServer] otherwise). It is
// for tests and tools on one machine, never for production.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Databases is how many logical databases a server from [Start] has.
const Databases = 128

// Process is a redis-server this package started. Its methods are not safe
// for concurrent use.
type Process struct {
	port int
	dir  string
	args []string
	env  []string // added to the environment of every start (StartBehind)
	cmd  *exec.Cmd
	done chan struct{}
}

// ErrNoServer is returned by [Start] when no redis-server binary is on
// PATH.
var ErrNoServer = errors.New("redisproc: redis-server not found on PATH")

// Start spawns a redis-server on a free loopback port with persistence
// off and [Databases] databases, and waits until it answers PING. extra
// arguments are appended to the command line (for example "--appendonly",
// "yes"). The process is killed if the calling process dies. The caller
// stops it.
func Start(extra ...string) (*Process, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNoServer
	}
	return startProcess(serverArgs(extra), nil)
}

func serverArgs(extra []string) func(port int, dir string) []string {
	return func(port int, dir string) []string {
		return append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--databases", strconv.Itoa(Databases), "--logfile", "redis.log",
		}, extra...)
	}
}

// startProcess starts a redis-server on a free loopback port in a new
// temporary directory, with the arguments args returns for them; the
// server must log to redis.log in that directory.
//
// A free port is only free until someone else binds it: a port taken
// between the check and the server's bind (by another test's server or a
// client's ephemeral port) makes the server exit with "Address already in
// use", and startProcess tries again on other ports, up to bindTries times.
func startProcess(args func(port int, dir string) []string, env []string) (*Process, error) {
	var err error
	for range bindTries {
		var p *Process
		if p, err = tryProcess(args, env); err == nil || !strings.Contains(err.Error(), "Address already in use") {
			return p, err
		}
	}
	return nil, err
}

// bindTries is how many ports startProcess tries.
const bindTries = 5

func tryProcess(args func(port int, dir string) []string, env []string) (*Process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redisproc-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: temp dir: %w", err)
	}
	p := &Process{port: port, dir: dir, args: args(port, dir), env: env}
	if err := p.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

// Addr is the server's host:port. It stays the same across restarts.
func (p *Process) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// URL is a redis:// URL for database 0 of the server.
func (p *Process) URL() string { return "redis://" + p.Addr() + "/0" }

// Dir is the server's working directory (AOF and RDB files, redis.log).
func (p *Process) Dir() string { return p.dir }

// Start starts a stopped server again on the same port and directory and
// waits until it answers PING.
func (p *Process) Start() error { return p.StartWith() }

// StartWith is [Process.Start] with extra arguments for this start only
// (say "--replicaof", host, port, to come back as a replica).
func (p *Process) StartWith(extra ...string) error {
	cmd := exec.Command("redis-server", append(slices.Clone(p.args), extra...)...)
	cmd.Dir = p.dir
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisproc: start redis-server: %w", err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(p.done)
	if err := p.waitReady(10 * time.Second); err != nil {
		p.Kill()
		return err
	}
	return nil
}

func (p *Process) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(limit)
	backoff := 5 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			log, _ := os.ReadFile(p.dir + "/redis.log")
			return fmt.Errorf("redisproc: redis-server exited: %s", strings.TrimSpace(string(log)))
		case <-time.After(backoff):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisproc: redis-server on %s not ready after %v: %w", p.Addr(), limit, err)
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. Data not yet on disk is lost.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

// Pause stops the server with SIGSTOP; [Process.Resume] continues it. While
// paused it accepts connections but answers nothing.
func (p *Process) Pause() error { return p.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a server stopped by [Process.Pause].
func (p *Process) Resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// Restart kills the server and starts it again on the same port.
func (p *Process) Restart() error {
	p.Kill()
	return p.Start()
}

// Stop kills the server and removes its directory. It is safe to call twice.
func (p *Process) Stop() {
	p.Kill()
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
		p.dir = ""
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisproc: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
