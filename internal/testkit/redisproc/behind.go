package redisproc

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// LibFaketime is where Debian's faketime package puts the library that
// [StartBehind] preloads.
const LibFaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

// ErrNoFaketime is returned by [StartBehind] when libfaketime or a C
// compiler is missing (Debian: apt-get install faketime gcc).
var ErrNoFaketime = errors.New("redisproc: libfaketime (Debian package faketime) or cc not found")

// mallocShim routes the allocator to glibc's. Debian's redis-server links
// jemalloc, whose start-up reads the clock; preloaded alone, libfaketime
// then allocates inside its own clock_gettime, through jemalloc, and the
// server deadlocks (or libfaketime gives up: "unexpected recursive calls
// to clock_gettime"). Preloaded before libfaketime, this shim answers
// every allocation, the server's too, from glibc.
//
//go:embed clockshim/shim.c
var mallocShim []byte

var shim struct {
	once sync.Once
	path string
	err  error
}

// shimPath builds the shim once per process, into the temporary directory
// (named by its source's hash, so a build is reused), and returns it.
func shimPath() (string, error) {
	shim.once.Do(func() {
		if _, err := os.Stat(LibFaketime); err != nil {
			shim.err = fmt.Errorf("%w: %w", ErrNoFaketime, err)
			return
		}
		cc, err := exec.LookPath("cc")
		if err != nil {
			shim.err = fmt.Errorf("%w: %w", ErrNoFaketime, err)
			return
		}
		sum := sha256.Sum256(mallocShim)
		dir := filepath.Join(os.TempDir(), "redisproc-clockshim-"+hex.EncodeToString(sum[:6]))
		out := filepath.Join(dir, "shim.so")
		if _, err := os.Stat(out); err == nil {
			shim.path = out
			return
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			shim.err = err
			return
		}
		src := filepath.Join(dir, "shim.c")
		if err := os.WriteFile(src, mallocShim, 0o600); err != nil {
			shim.err = err
			return
		}
		tmp := out + ".tmp" + strconv.Itoa(os.Getpid())
		if b, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", tmp, src, "-ldl").CombinedOutput(); err != nil {
			shim.err = fmt.Errorf("redisproc: build the clock shim: %w: %s", err, b)
			return
		}
		if shim.err = os.Rename(tmp, out); shim.err == nil {
			shim.path = out
		}
	})
	return shim.path, shim.err
}

// StartBehind is [Start] for a server whose clock (TIME, key expiry, its
// logs) runs behind the machine's by behind, through libfaketime, as a
// replica on a host with a skewed clock would: promoted, its TIME hands
// out values below its old master's. The clock stays behind across
// [Process.Start] and restarts. It returns an error matching
// [ErrNoFaketime] when libfaketime or a C compiler is missing.
func StartBehind(behind time.Duration, extra ...string) (*Process, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNoServer
	}
	env, err := behindEnv(behind)
	if err != nil {
		return nil, err
	}
	return startProcess(serverArgs(extra), env)
}

func behindEnv(behind time.Duration) ([]string, error) {
	if behind < time.Second {
		return nil, fmt.Errorf("redisproc: a clock behind by %v: give at least a second", behind)
	}
	path, err := shimPath()
	if err != nil {
		return nil, err
	}
	return []string{
		"LD_PRELOAD=" + path + " " + LibFaketime,
		"FAKETIME=-" + strconv.FormatInt(int64(behind/time.Second), 10) + "s",
	}, nil
}
