package manager

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// WatchSignals closes the manager on SIGINT or SIGTERM (destroying the
// sandboxes it created when DestroyOnExit is set), then lets the signal
// take its default course, so the process ends as it would have without
// sbxfs. stop ends the watch. Close runs once, whichever path gets there
// first (PITFALLS 27).
func (m *Manager) WatchSignals() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			m.log.Info("closing the manager", "signal", s.String())
			if err := m.Close(); err != nil {
				m.log.Error("close", "err", err)
			}
			signal.Stop(ch)
			signal.Reset(s)
			_ = syscall.Kill(os.Getpid(), s.(syscall.Signal))
		case <-done:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
	}
}
