// Command testdaemon serves managed sandboxes for the manager's mount
// tests, which must not serve a mount they also write into. It opens a
// Manager with Options{Mount: true} on STATEROOT, creates one mounted
// sandbox of ORIGINAL in plan "p", prints
//
//	READY <id> <mountpoint>
//
// and then runs one command per line from stdin, answering each with
// "RESULT <json>" (a PlanResult or BatchResult, and the error text):
//
//	commit [keep] [slow] [wait=DURATION]   CommitPlan("p"); slow prints INSIDE
//	                                       at "plan-recorded" and sleeps 500ms
//	rollback [keep]                        RollbackPlan("p")
//	create ORIGINAL                        another mounted sandbox in plan "p" (ORIGINAL
//	                                       may be a sandbox's mountpoint: nested);
//	                                       answers "CREATED <id> <mountpoint>"
//	unmount ID [lazy]                      Unmount(ID); the result is null
//	mount ID                               Mount(ID); the result is the sandbox
//	                                       (manager.Info)
//	quit                                   Close and exit (so does EOF)
//
//	testdaemon STATEROOT ORIGINAL
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sbxfs/sbxfs/manager"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testdaemon:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 3 {
		return fmt.Errorf("usage: testdaemon STATEROOT ORIGINAL")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	m, err := manager.New(manager.Options{StateRoot: os.Args[1], Mount: true, Logger: log})
	if err != nil {
		return err
	}
	defer m.Close()
	ctx := context.Background()
	sb, err := m.Create(ctx, manager.CreateOptions{Plan: "p", Original: os.Args[2]})
	if err != nil {
		return err
	}
	fmt.Printf("READY %s %s\n", sb.ID, sb.Mountpoint)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var res any
		var err error
		switch f[0] {
		case "commit":
			res, err = m.CommitPlan(ctx, "p", commitOptions(f[1:]))
		case "rollback":
			res, err = m.RollbackPlan(ctx, "p", has(f[1:], "keep"))
		case "create":
			if len(f) != 2 {
				err = fmt.Errorf("usage: create ORIGINAL")
				break
			}
			var sb manager.Sandbox
			if sb, err = m.Create(ctx, manager.CreateOptions{Plan: "p", Original: f[1]}); err == nil {
				fmt.Printf("CREATED %s %s\n", sb.ID, sb.Mountpoint)
				continue
			}
		case "unmount":
			if len(f) < 2 {
				err = fmt.Errorf("usage: unmount ID [lazy]")
				break
			}
			err = m.Unmount(ctx, f[1], has(f[2:], "lazy"))
		case "mount":
			if len(f) != 2 {
				err = fmt.Errorf("usage: mount ID")
				break
			}
			var sb manager.Sandbox
			if sb, err = m.Mount(ctx, f[1]); err == nil {
				res = manager.Info(sb)
			}
		case "quit":
			return m.Close()
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		answer(res, err)
	}
	return m.Close()
}

func commitOptions(args []string) manager.CommitOptions {
	o := manager.CommitOptions{Keep: has(args, "keep")}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "wait="); ok {
			o.Wait, _ = time.ParseDuration(v)
		}
	}
	if has(args, "slow") {
		o.Fault = func(p string) {
			if p == "plan-recorded" {
				fmt.Println("INSIDE")
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
	return o
}

func has(args []string, s string) bool {
	for _, a := range args {
		if a == s {
			return true
		}
	}
	return false
}

func answer(res any, err error) {
	out := struct {
		Result any    `json:"result"`
		Err    string `json:"err,omitempty"`
	}{Result: res}
	if err != nil {
		out.Err = err.Error()
	}
	b, _ := json.Marshal(out)
	fmt.Printf("RESULT %s\n", b)
}
