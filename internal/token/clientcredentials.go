package token

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// ClientCredentialsConfig configures [ClientCredentials], the OAuth2 client
// credentials grant (RFC 6749 §4.4).
type ClientCredentialsConfig struct {
	// TokenURL is the upstream's token endpoint. Required.
	TokenURL string
	// ClientID identifies this service to the upstream. Required.
	ClientID string
	// ClientSecret authenticates this service. It is sent to TokenURL only
	// and never logged. Defaults to empty (for clients that authenticate
	// through EndpointParams).
	ClientSecret string
	// Scopes are requested with every token. Defaults to none.
	Scopes []string
	// EndpointParams are extra form parameters for the token request, e.g.
	// "audience". Defaults to none.
	EndpointParams url.Values
	// AuthStyle says how the client ID and secret are sent. Defaults to
	// auto-detection (HTTP Basic first, then form parameters, remembered).
	AuthStyle oauth2.AuthStyle
	// HTTPClient makes the token requests. Defaults to a client with a
	// 10s timeout over http.DefaultTransport. The Cache's context still
	// bounds each request.
	HTTPClient *http.Client
}

// ClientCredentials returns a [Source] that asks cfg.TokenURL for a new token
// with the client credentials grant on every Fetch (the Cache does the
// caching). The Source is safe for concurrent use.
//
// It returns an error when TokenURL or ClientID is missing or TokenURL is not
// an absolute URL. Fetch returns the golang.org/x/oauth2 errors wrapped (a
// *oauth2.RetrieveError when the endpoint answers with an error); a token
// without expires_in has a zero ExpiresIn, which the Cache rejects with
// ErrBadToken.
func ClientCredentials(cfg ClientCredentialsConfig) (Source, error) {
	switch u, err := url.Parse(cfg.TokenURL); {
	case cfg.TokenURL == "":
		return nil, errors.New("token: client credentials: no TokenURL")
	case err != nil || !u.IsAbs():
		return nil, errors.New("token: client credentials: TokenURL is not an absolute URL")
	case cfg.ClientID == "":
		return nil, errors.New("token: client credentials: no ClientID")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	return &clientCredentials{
		conf: &clientcredentials.Config{
			ClientID:       cfg.ClientID,
			ClientSecret:   cfg.ClientSecret,
			TokenURL:       cfg.TokenURL,
			Scopes:         cfg.Scopes,
			EndpointParams: cfg.EndpointParams,
			AuthStyle:      cfg.AuthStyle,
		},
		hc: hc,
	}, nil
}

type clientCredentials struct {
	conf *clientcredentials.Config // a pointer: it caches the detected AuthStyle
	hc   *http.Client
}

func (s *clientCredentials) Fetch(ctx context.Context) (Token, error) {
	t, err := s.conf.Token(context.WithValue(ctx, oauth2.HTTPClient, s.hc))
	if err != nil {
		return Token{}, fmt.Errorf("client credentials: %w", err)
	}
	tok := Token{Value: t.AccessToken}
	switch {
	case t.ExpiresIn > 0:
		tok.ExpiresIn = time.Duration(t.ExpiresIn) * time.Second
	case !t.Expiry.IsZero():
		tok.ExpiresIn = time.Until(t.Expiry)
	}
	return tok, nil
}
