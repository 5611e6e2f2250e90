// Command devserver is a minimal sbxfs server for the integration tests: it
// mounts one sandbox with an exact fuse.Config and serves it in the
// foreground until SIGTERM or SIGINT, then unmounts.
//
//	devserver [flags] ORIGINAL STATEDIR MOUNTPOINT
//
// STATEDIR/upper and STATEDIR/work are created. "ready" is printed on stdout
// once the mount is live. It stands in for `sbxfs mount --foreground` while
// the CLI is not there, and serves tests that need a mount option the CLI
// does not offer (allow_other, extra lower layers, no passthrough).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sbxfs/sbxfs/fuse"
	"github.com/sbxfs/sbxfs/layers"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "devserver:", err)
		os.Exit(1)
	}
}

func run() error {
	var lowers stringList
	allowOther := flag.Bool("allow-other", false, "mount with allow_other")
	noPassthrough := flag.Bool("no-passthrough", false, "turn FUSE passthrough off")
	noIOUring := flag.Bool("no-io-uring", false, "take requests from /dev/fuse only")
	suid := flag.Bool("suid", false, "lift nosuid")
	dev := flag.Bool("dev", false, "lift nodev")
	debug := flag.Bool("debug", os.Getenv("DEBUG") != "", "log every FUSE request")
	timeout := flag.Duration("timeout", 0, "the kernel's entry, attribute and negative cache timeouts (0: fuse.DefaultTimeout)")
	flag.Var(&lowers, "lower", "an extra read-only layer below the original (repeatable, top first)")
	flag.Parse()
	if flag.NArg() != 3 {
		return errors.New("usage: devserver [flags] ORIGINAL STATEDIR MOUNTPOINT")
	}
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			return p
		}
		return a
	}
	state := abs(flag.Arg(1))
	cfg := fuse.Config{
		Layers: layers.Config{
			Lowers: append([]string{abs(flag.Arg(0))}, lowers...),
			Upper:  filepath.Join(state, "upper"),
			Work:   filepath.Join(state, "work"),
		},
		Mountpoint:      abs(flag.Arg(2)),
		AllowOther:      *allowOther,
		NoPassthrough:   *noPassthrough,
		NoIOUring:       *noIOUring,
		Suid:            *suid,
		Dev:             *dev,
		Debug:           *debug,
		EntryTimeout:    *timeout,
		AttrTimeout:     *timeout,
		NegativeTimeout: *timeout,
	}
	for _, d := range []string{cfg.Layers.Upper, cfg.Layers.Work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := layers.Bind(&cfg.Layers); err != nil {
		return err
	}
	// Catch the signals before the mount exists: one that arrives while
	// fuse.Mount is finishing must unmount, not kill the server.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	srv, err := fuse.Mount(cfg)
	if err != nil {
		return err
	}
	fmt.Println("transport", srv.Transport())
	fmt.Println("ready")
	go func() {
		for range sigs {
			// A busy mount stays up; the next signal tries again.
			if err := srv.Unmount(); err != nil {
				fmt.Fprintln(os.Stderr, "devserver:", err)
			}
		}
	}()
	err = srv.Wait()
	fmt.Printf("unmounted io_uring_requests=%d lookup_helpers=%d buffers_trimmed=%d\n", srv.URingRequests(), srv.DevHelpers(), srv.DevBuffersTrimmed())
	return err
}
