package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/orderworker/orderworker/internal/testkit/redistest"
)

// built holds this command and cmd/producer (whose "serve" is the intake),
// compiled once per test binary into a directory that TestMain removes:
// each go build links for seconds, and for tens of seconds on a loaded
// machine, which the tests that run the binaries paid once each.
var built struct {
	once             sync.Once
	dir              string
	worker, producer string
	out              []byte
	err              error
}

// buildBinaries compiles this command and cmd/producer with one go build,
// the first time a test asks, and returns their paths. It skips under
// -short.
func buildBinaries(t *testing.T) (worker, intake string) {
	t.Helper()
	redistest.SkipShort(t, "binaries run as processes")
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "orderworker-cmd-worker-")
		if built.err != nil {
			return
		}
		built.out, built.err = exec.Command("go", "build", "-o", built.dir+string(filepath.Separator), ".", "../producer").CombinedOutput()
		built.worker, built.producer = filepath.Join(built.dir, "worker"), filepath.Join(built.dir, "producer")
	})
	if built.err != nil {
		t.Fatalf("build the binaries: %v\n%s", built.err, built.out)
	}
	return built.worker, built.producer
}

// buildWorker returns this command compiled, see buildBinaries.
func buildWorker(t *testing.T) string {
	t.Helper()
	worker, _ := buildBinaries(t)
	return worker
}

// removeBinaries runs the tests and then removes the binaries built.
type removeBinaries struct{ m interface{ Run() int } }

func (r removeBinaries) Run() int {
	code := r.m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	return code
}
