// Package faultproxy is a TCP proxy on loopback that breaks the link it
// stands in: it holds every byte in both directions (a blackhole: the
// peers see a silent network, and what they sent arrives when it heals),
// resets every connection, or delays each chunk. Tests and the lab put one
// in front of a process's Redis (or an order API) to play partitions,
// resets and slow links; it is a testing aid and imports no test code, so
// that tools/stress can use it too (depguard keeps it out of the product).
//
// A blackhole is what a partition does to TCP: a command written during it
// is not lost but delivered at the heal, after its sender may have given up
// on the reply and closed the connection. The proxy keeps that: bytes held
// from a client that has since closed still reach the server at the heal,
// and the server's reply is dropped.
package faultproxy

import (
	"context"
	"net"
	"sync"
	"time"
)

// Proxy forwards the connections made to its address to a target. Its
// methods are safe for concurrent use. Close stops it and waits for every
// goroutine it started.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	cond    *sync.Cond
	holding bool
	delay   time.Duration
	closed  bool
	conns   map[*link]struct{}

	wg sync.WaitGroup
}

// link is one proxied connection: the client's side and the target's.
type link struct {
	client, server net.Conn
}

// New starts a proxy on 127.0.0.1 (a free port) to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[*link]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (host:port), for a client to dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole holds every byte, in both directions, until Heal: the
// connections stay open, nothing arrives. New connections are accepted
// and held as well.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.holding = true
	p.mu.Unlock()
}

// Heal ends a blackhole: the bytes held are delivered, in order, where
// their receiver is still there.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.holding = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Delay makes each chunk wait d before it is forwarded (0 for none).
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Reset closes every open connection, both sides, at once (with a TCP
// reset where the system allows); new connections go through as before.
// Bytes held by a blackhole are dropped.
func (p *Proxy) Reset() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
}

// Close stops accepting, closes every connection, and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.holding = false
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		var d net.Dialer
		s, err := d.DialContext(context.Background(), "tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.reset()
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		done := make(chan struct{})
		go func() {
			defer p.wg.Done()
			p.pump(l.server, l.client)
			// The client is gone: what it sent was delivered (held bytes
			// included). Give the server a moment to run it before the
			// target's side closes, as a network would.
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-done:
				t.Stop()
			}
			_ = l.server.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.pump(l.client, l.server)
			close(done)
			_ = l.client.Close()
			p.mu.Lock()
			delete(p.conns, l)
			p.mu.Unlock()
		}()
	}
}

// pump copies src to dst, chunk by chunk, holding each chunk while the
// proxy holds and delaying it by the proxy's delay. It returns when src
// ends or dst refuses a write.
func (p *Proxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF (src closed) or a broken src: either ends the direction
		}
	}
}

// wait blocks while the proxy holds, then sleeps its delay; false once
// the proxy is closed.
func (p *Proxy) wait() bool {
	p.mu.Lock()
	for p.holding && !p.closed {
		p.cond.Wait()
	}
	closed, d := p.closed, p.delay
	p.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
	return !closed
}

func (l *link) reset() {
	for _, c := range []net.Conn{l.client, l.server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}
