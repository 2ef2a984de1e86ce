package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// asynqmon's pages get a Content-Security-Policy as strict as its v0.7.2
// bundle allows (checked in the browser by TestBrowser, which fails on any
// violation):
//
//   - script-src 'self' and the SHA-256 hashes of the two inline scripts of
//     its index.html (the settings it templates in, window.FLAG_ROOT_PATH and
//     the others, and webpack's loader). The hashes are taken at start from
//     the page asynqmon renders for this root, so a script injected into the
//     page (through a queue name, a payload, or anything else asynqmon shows)
//     does not run. The bundle needs no eval.
//   - style-src-elem 'self' 'unsafe-inline': Material-UI writes its styles
//     into <style> elements at run time, which neither a hash nor a nonce
//     can cover without rebuilding the bundle (styles cannot run script).
//     style-src-attr 'none': no style="" attribute, since React, JSS and
//     recharts set styles through the DOM (element.style), which CSP does not
//     restrict. style-src, for browsers without the two, allows both.
//   - https://fonts.googleapis.com (styles) and https://fonts.gstatic.com
//     (font-src): index.html links Roboto and the Material icon font there.
//     They are the only other origins allowed, for styles and fonts only;
//     where they cannot be reached, the UI falls back to the system's fonts.
//   - connect-src 'self' (its API, and the Prometheus charts, which it fetches
//     through its own /api/metrics), img-src 'self' (its logos and icons),
//     manifest-src 'self'; nothing else (default-src 'none', no object, no
//     frame, no worker), no <base>, forms only to itself, and no framing.

// inlineScript finds the inline scripts (no attributes, so no src) of a
// page.
var inlineScript = regexp.MustCompile(`(?s)<script>(.*?)</script>`)

// asynqmonCSP returns the Content-Security-Policy of asynqmon's pages: it
// renders the page mon serves at root+"/" and allows exactly its inline
// scripts. It returns an error when mon does not render that page.
func asynqmonCSP(mon http.Handler, root string) (string, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, root+"/", nil)
	if err != nil {
		return "", fmt.Errorf("asynqmon's page: %w", err)
	}
	page := &pageRecorder{header: http.Header{}}
	mon.ServeHTTP(page, req)
	if page.status != 0 && page.status != http.StatusOK || !bytes.Contains(page.body.Bytes(), []byte("<html")) {
		return "", fmt.Errorf("asynqmon did not render its page at %s/ (status %d)", root, page.status)
	}
	hashes := []string{"'self'"}
	for _, m := range inlineScript.FindAllSubmatch(page.body.Bytes(), -1) {
		sum := sha256.Sum256(m[1])
		hashes = append(hashes, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
	}
	return "default-src 'none'; script-src " + strings.Join(hashes, " ") + "; " +
		"style-src 'self' 'unsafe-inline' https://fonts.googleapis.com; " +
		"style-src-elem 'self' 'unsafe-inline' https://fonts.googleapis.com; style-src-attr 'none'; font-src https://fonts.gstatic.com; " +
		"img-src 'self'; connect-src 'self'; manifest-src 'self'; " +
		"form-action 'self'; base-uri 'none'; frame-ancestors 'none'", nil
}

// pageRecorder is the ResponseWriter asynqmonCSP renders the page into.
type pageRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (p *pageRecorder) Header() http.Header { return p.header }

func (p *pageRecorder) Write(b []byte) (int, error) { return p.body.Write(b) }

func (p *pageRecorder) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

// withCSP sets the Content-Security-Policy csp on every answer of h.
func withCSP(csp string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", csp)
		h.ServeHTTP(w, r)
	})
}
