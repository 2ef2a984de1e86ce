package benchkit

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// WorkerPackage is the import path of the worker binary.
const WorkerPackage = "github.com/orderworker/orderworker/cmd/worker"

// BuildWorker compiles cmd/worker into dir and returns the binary's path. It
// runs `go build` from the current directory, which must be inside the
// module.
func BuildWorker(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "worker")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, WorkerPackage).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", WorkerPackage, err, bytes.TrimSpace(out))
	}
	return bin, nil
}

// Memory is a process's resident set, in KiB, from /proc/<pid>/status.
type Memory struct {
	HWM int64 `json:"hwm_kib"` // VmHWM: the peak since start or since ResetPeakRSS
	RSS int64 `json:"rss_kib"` // VmRSS: now
}

// ProcMemory reads the memory of process pid (0 for this process).
func ProcMemory(pid int) (Memory, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	f, err := os.Open(path)
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	var m Memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		switch name {
		case "VmHWM":
			m.HWM = kib
		case "VmRSS":
			m.RSS = kib
		}
	}
	return m, sc.Err()
}

// ResetPeakRSS sets this process's VmHWM back to its current RSS (Linux 4.0
// and later, through /proc/self/clear_refs), so that a later ProcMemory
// shows the peak of what ran in between.
func ResetPeakRSS() error {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// Process is a child process started by [Start], its output going to a log
// file. Its methods are not safe for concurrent use.
type Process struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error // the exit status, once done is closed
}

// Start runs bin with args and env (added to this process's environment),
// writing its stdout and stderr to the file logPath (appended to). The
// child is killed if this process dies.
func Start(bin string, args, env []string, logPath string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &Process{cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit status, once Done is closed.
func (p *Process) Err() error { return p.err }

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout for the process to exit, then
// kills it. It returns the exit status (an error for a non-zero one, or for
// a kill).
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		p.Kill()
		return fmt.Errorf("pid %d did not exit %v after SIGTERM; killed", p.Pid(), timeout)
	}
}

// Memory reads the process's memory from /proc while it runs.
func (p *Process) Memory() (Memory, error) { return ProcMemory(p.Pid()) }

// SelfCPU returns the CPU time (user + system) this process has used.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Pause stops the process with SIGSTOP, as a long GC pause, a swapped-out
// host or a frozen VM would; Resume continues it with SIGCONT.
func (p *Process) Pause() error { return p.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a process stopped by Pause.
func (p *Process) Resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// ProcCPU returns the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat, assuming the usual 100 clock ticks per second.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime or stime", pid)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// CPU returns the CPU time the process has used so far.
func (p *Process) CPU() (time.Duration, error) { return ProcCPU(p.Pid()) }
