package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/orderworker/orderworker/internal/testkit/faultproxy"
)

// The network nemeses: each worker's Redis link runs through a TCP proxy
// of its own on loopback (internal/testkit/faultproxy), and the chaos
// phase breaks one link at a time: a blackhole mid-hold for -cut-for (past
// LOCK_TTL, and past asynq's 30 s lease when -cut-for says so: the worker
// is cut off while it holds orders, its commands delivered at the heal),
// a reset of every connection, and a slow link (-slow-link of latency on
// each chunk, both ways, for -slow-for). The Redis links are proxied on
// -redis single only: a Sentinel or Cluster URL names several nodes, and
// the suite's failovers break those links already. With -store http, each
// worker's link to the order API runs through a proxy too (orderapi.go),
// on every -redis, and a nemesis breaks both links of its worker at once:
// a write in flight to the order API is held past the lease and delivered
// at the heal, after a new holder of the order wrote.

// links holds the proxy of each worker slot, kept across the slot's
// restarts.
type links struct {
	n       int                 // worker slots
	proxies []*faultproxy.Proxy // the Redis links, by slot; nil when not proxied
	api     []*faultproxy.Proxy // the order API links, by slot; nil when not proxied
	trouble *troubleLog         // records each nemesis by slot (stall.go); nil for the intake's
	mu      sync.Mutex
	cuts    int
	resets  int
	slows   int
}

// newLinks starts a proxy to the Redis of redisURL (one host:port) for
// each of n slots.
func newLinks(redisURL string, n int) (*links, error) {
	u, err := url.Parse(redisURL)
	if err != nil || u.Host == "" || strings.Contains(u.RawQuery, "addr=") {
		return nil, fmt.Errorf("nemesis: %q is not one Redis node's URL", redisURL)
	}
	ls := &links{n: n}
	for range n {
		p, err := faultproxy.New(u.Host)
		if err != nil {
			ls.close()
			return nil, fmt.Errorf("nemesis: proxy: %w", err)
		}
		ls.proxies = append(ls.proxies, p)
	}
	return ls, nil
}

// url returns redisURL with its host replaced by slot's proxy.
func (ls *links) url(redisURL string, slot int) string {
	u, _ := url.Parse(redisURL)
	u.Host = ls.proxies[slot].Addr()
	return u.String()
}

// close closes the Redis proxies (the order API's are orderAPI's).
func (ls *links) close() {
	for _, p := range ls.proxies {
		_ = p.Close()
	}
}

// of returns slot's proxies.
func (ls *links) of(slot int) []*faultproxy.Proxy {
	var ps []*faultproxy.Proxy
	for _, set := range [][]*faultproxy.Proxy{ls.proxies, ls.api} {
		if set != nil {
			ps = append(ps, set[slot])
		}
	}
	return ps
}

// cut blackholes slot's links for d (or until ctx ends), then heals them.
func (ls *links) cut(ctx context.Context, slot int, d time.Duration) {
	ls.mu.Lock()
	ls.cuts++
	ls.mu.Unlock()
	ls.trouble.add(slot, "link cut", d+time.Second)
	for _, p := range ls.of(slot) {
		p.Blackhole()
		defer p.Heal()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// reset resets every connection of slot's link.
func (ls *links) reset(slot int) {
	ls.mu.Lock()
	ls.resets++
	ls.mu.Unlock()
	ls.trouble.add(slot, "link reset", time.Second)
	for _, p := range ls.of(slot) {
		p.Reset()
	}
}

// slow delays slot's link by latency for d (or until ctx ends).
func (ls *links) slow(ctx context.Context, slot int, latency, d time.Duration) {
	ls.mu.Lock()
	ls.slows++
	ls.mu.Unlock()
	ls.trouble.add(slot, "slow link", d)
	for _, p := range ls.of(slot) {
		p.Delay(latency)
		defer p.Delay(0)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// counts returns how many cuts, resets and slow spells were made.
func (ls *links) counts() (cuts, resets, slows int) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.cuts, ls.resets, ls.slows
}

// runNemeses breaks the workers' links until ctx ends: a cut every
// CutEvery, a reset every ResetEvery, a slow spell every SlowEvery, each on
// a random slot. Each cut and slow spell runs beside the others; run
// returns once they all ended.
func runNemeses(ctx context.Context, ls *links, c settings, seed int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	tick := func(d time.Duration) <-chan time.Time {
		if d <= 0 {
			return nil
		}
		t := time.NewTicker(d)
		context.AfterFunc(ctx, t.Stop)
		return t.C
	}
	cut, reset, slow := tick(c.CutEvery), tick(c.ResetEvery), tick(c.SlowEvery)
	for {
		select {
		case <-ctx.Done():
			return
		case <-cut:
			slot := rng.IntN(ls.n)
			wg.Go(func() { ls.cut(ctx, slot, c.CutFor) })
		case <-reset:
			ls.reset(rng.IntN(ls.n))
		case <-slow:
			slot := rng.IntN(ls.n)
			wg.Go(func() { ls.slow(ctx, slot, c.SlowLink, c.SlowFor) })
		}
	}
}

// cutAcceptance breaks the acceptance's link (slot 0 of ls) until ctx
// ends: a cut every every, for d, and a reset of every connection half-way
// between two cuts. It returns once the last cut healed.
func (ls *links) cutAcceptance(ctx context.Context, every, d time.Duration) {
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for cut := true; ; cut = !cut {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cut {
			ls.cut(ctx, 0, d)
		} else {
			ls.reset(0)
		}
	}
}
