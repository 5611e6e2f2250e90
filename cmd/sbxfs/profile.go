package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"syscall"
)

// Developer's tools for finding where the server spends its time and
// memory (go tool pprof sbxfs FILE):
//
//   - profileEnv names a file the serving process writes a CPU profile to,
//     from the mount until it is unmounted;
//   - memProfileEnv names a file it writes its allocation profile to when
//     it is unmounted (every allocation since it started, sampled).
const (
	profileEnv    = "SBXFS_CPUPROFILE"
	memProfileEnv = "SBXFS_MEMPROFILE"
)

// startProfile starts the profiles the environment asks for and returns
// the function that ends them; without the variables it does nothing.
func startProfile() (stop func(), err error) {
	cpu, err := createProfile(profileEnv)
	if err != nil {
		return nil, err
	}
	mem, err := createProfile(memProfileEnv)
	if err != nil {
		if cpu != nil {
			cpu.Close()
		}
		return nil, err
	}
	if cpu != nil {
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			if mem != nil {
				mem.Close()
			}
			return nil, fmt.Errorf("%s: %w", profileEnv, err)
		}
	}
	return func() {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
		}
		if mem != nil {
			_ = pprof.Lookup("allocs").WriteTo(mem, 0)
			mem.Close()
		}
	}, nil
}

// createProfile creates the file the variable env names, or returns nil
// without one.
func createProfile(env string) (*os.File, error) {
	path := os.Getenv(env)
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	return f, nil
}
