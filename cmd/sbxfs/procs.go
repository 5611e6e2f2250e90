package main

import (
	"os"
	"runtime"
)

// minServerProcs is the least GOMAXPROCS a serving process runs with.
//
// A FUSE server's goroutines spend most of their time blocked in system
// calls: go-fuse keeps two or more reading /dev/fuse a mount, and a reply
// often waits for the disk. With GOMAXPROCS at the CPU count (2 here),
// every P is soon held by a thread in a system call; the runtime's
// monitor then takes the Ps back after 20 µs and a thread that returns
// with a request must find one again, with wake-ups between threads (and
// between CPUs) on every request. With spare Ps a returning thread keeps
// its own. Measured on 2 CPUs (getxattr round trip through the mount,
// interleaved): 66 µs at 2, 50-52 µs at 8; untar of 5,000 files -18%,
// rm -rf -20%, cold stat of 5,000 files -10 to -20% (a second A/B: -10%,
// -5%, copy-up -4%). Above 8 nothing more. That was with go-fuse's loop
// serving /dev/fuse; sbxfs's own loop (fuse/devloop.go), which serves
// most mounts now, reads with one thread and gains nothing from it (2 and
// 8 alike); the mounts go-fuse's loop still serves (layers on FUSE or
// network filesystems) do.
//
// Only `sbxfs mount`'s server does this, not the daemon: go-fuse lets a
// mount keep up to GOMAXPROCS threads reading /dev/fuse, so at 8 a
// daemon's idle sandboxes cost twice the threads and memory (60 idle
// sandboxes: 330 threads and 44 MiB against 180 and 26 MiB).
const minServerProcs = 8

// serverProcs raises GOMAXPROCS of a serving process to minServerProcs,
// unless the environment sets GOMAXPROCS.
func serverProcs() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	if runtime.GOMAXPROCS(0) < minServerProcs {
		runtime.GOMAXPROCS(minServerProcs)
	}
}
