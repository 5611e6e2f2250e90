package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"syscall"
)

// profileEnv names a file the serving process writes a CPU profile to,
// from the mount until it is unmounted: a developer's tool for finding
// where the server spends its time (go tool pprof sbxfs FILE).
const profileEnv = "SBXFS_CPUPROFILE"

// startProfile starts the CPU profile SBXFS_CPUPROFILE asks for and
// returns the function that ends it; without the variable it does nothing.
func startProfile() (stop func(), err error) {
	path := os.Getenv(profileEnv)
	if path == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", profileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", profileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
