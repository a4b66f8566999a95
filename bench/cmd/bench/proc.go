// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/host"
	"github.com/shirou/gopsutil/v4/load"
	"github.com/shirou/gopsutil/v4/mem"
	"github.com/shirou/gopsutil/v4/process"
	"golang.org/x/sys/unix"
)

// pinProcess sets the affinity of every thread of process pid to cpu.
// Threads the process creates later inherit it from their creator.
func pinProcess(pid, cpu int) error {
	var s unix.CPUSet
	s.Set(cpu)
	return setAffinity(pid, &s)
}

// setAffinity sets the affinity of every thread of process pid to s.
func setAffinity(pid int, s *unix.CPUSet) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("bench: pin pid %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, s); err != nil && err != unix.ESRCH {
			return fmt.Errorf("bench: pin pid %d thread %d to CPUs %d: %w", pid, tid, s.Count(), err)
		}
	}
	return nil
}

// preemptions returns how often the threads of process pid were switched
// out while they could still run (the sum of nonvoluntary_ctxt_switches in
// /proc/<pid>/task/*/status): the scheduler preferred another task, such
// as a process on the same CPU that a write to it had woken.
func preemptions(pid int) (float64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("bench: preemptions of pid %d: no threads (%v)", pid, err)
	}
	total := 0.0
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that exited since the glob
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
				n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					return 0, fmt.Errorf("bench: %s: %w", f, err)
				}
				total += n
			}
		}
	}
	return total, nil
}

// cpuSeconds returns the user + system time of process pid (all its
// threads), read from /proc/<pid>/stat in 10 ms ticks.
func cpuSeconds(pid int) (float64, error) {
	p, err := process.NewProcess(int32(pid))
	if err != nil {
		return 0, err
	}
	t, err := p.Times()
	if err != nil {
		return 0, err
	}
	return t.User + t.System, nil
}

// coreTimes are one CPU's busy and total seconds since boot (/proc/stat):
// busy is all but idle and iowait.
type coreTimes struct{ busy, total float64 }

func readCoreTimes(n int) (coreTimes, error) {
	ts, err := cpu.Times(true)
	if err != nil {
		return coreTimes{}, err
	}
	for _, t := range ts {
		if t.CPU == "cpu"+strconv.Itoa(n) {
			busy := t.User + t.Nice + t.System + t.Irq + t.Softirq + t.Steal
			return coreTimes{busy: busy, total: busy + t.Idle + t.Iowait}, nil
		}
	}
	return coreTimes{}, fmt.Errorf("bench: /proc/stat: no cpu%d", n)
}

// otherLoad is the fraction of a core's time in the window that went to
// processes other than ours (ourCPU seconds, spent on that core since ours
// are pinned to it): how much the shared machine disturbed the run.
func otherLoad(a, b coreTimes, ourCPU float64) float64 {
	total := b.total - a.total
	if total <= 0 {
		return 0
	}
	return max(0, (b.busy-a.busy-ourCPU)/total)
}

// machine describes the host for the report.
type machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
	LoadAvg  string `json:"loadavg_at_start"`
	LoadEnd  string `json:"loadavg_at_end"`
	MemTotal string `json:"mem_total"`
}

func readMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), CPUModel: "unknown", Kernel: "unknown", LoadAvg: loadAvg()}
	if info, err := cpu.Info(); err == nil && len(info) > 0 {
		m.CPUModel = info[0].ModelName
	}
	if k, err := host.KernelVersion(); err == nil {
		m.Kernel = k
	}
	if v, err := mem.VirtualMemory(); err == nil {
		m.MemTotal = strconv.FormatUint(v.Total>>10, 10) + " kB"
	}
	return m
}

func loadAvg() string {
	a, err := load.Avg()
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.2f %.2f %.2f", a.Load1, a.Load5, a.Load15)
}

// fileExists reports whether path names a regular file.
func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
