package worker

import (
	"time"

	"github.com/hibiken/asynq"
)

// AheadBound is aheadBound for a Worker with cfg (its defaults filled in).
func AheadBound(cfg Config, info *asynq.TaskInfo) time.Duration {
	return aheadBound(cfg.withDefaults(), info)
}
