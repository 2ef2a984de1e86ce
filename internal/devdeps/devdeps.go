// Package devdeps pins modules in go.mod while packages that use them are
// being written in parallel. It is removed once they all exist.
package devdeps

import (
	_ "github.com/alicebob/miniredis/v2"
	_ "github.com/chromedp/chromedp"
	_ "github.com/google/uuid"
	_ "github.com/hibiken/asynq"
	_ "github.com/hibiken/asynq/x/metrics"
	_ "github.com/hibiken/asynqmon"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/stretchr/testify/require"
	_ "go.uber.org/goleak"
	_ "go.uber.org/zap"
	_ "golang.org/x/oauth2/clientcredentials"
	_ "golang.org/x/sync/singleflight"
)
