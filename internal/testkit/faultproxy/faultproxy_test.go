package faultproxy_test

import (
	"bufio"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// received is a server that records each line it receives, then answers
// it.
type received struct {
	ln  net.Listener
	got chan string
	wg  sync.WaitGroup
}

func newServer(t *testing.T) *received {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &received{ln: ln, got: make(chan string, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.got <- line
					_, _ = c.Write([]byte(line))
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

// A line sent into a blackhole reaches the server at the heal, even though
// its sender closed its connection meanwhile, as a partition delivers it.
func TestBlackholeDeliversAtTheHealAfterTheSenderLeft(t *testing.T) {
	srv := newServer(t)
	p, err := faultproxy.New(srv.ln.Addr().String())
	require.NoError(t, err)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	_, err = c.Write([]byte("before\n"))
	require.NoError(t, err)
	require.Equal(t, "before\n", <-srv.got)
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "before\n", line)

	p.Blackhole()
	_, err = c.Write([]byte("held\n"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	select {
	case l := <-srv.got:
		t.Fatalf("the server got %q through the blackhole", l)
	default:
	}
	p.Heal()
	require.Equal(t, "held\n", <-srv.got)
	require.NoError(t, p.Close())
}

// Reset ends every connection; new ones go through.
func TestResetEndsConnections(t *testing.T) {
	srv := newServer(t)
	p, err := faultproxy.New(srv.ln.Addr().String())
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("one\n"))
	require.NoError(t, err)
	<-srv.got
	r := bufio.NewReader(c)
	_, err = r.ReadString('\n')
	require.NoError(t, err)
	p.Reset()
	_, err = r.ReadString('\n')
	require.Error(t, err, "the connection was reset")

	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Write([]byte("two\n"))
	require.NoError(t, err)
	require.Equal(t, "two\n", <-srv.got)
}
