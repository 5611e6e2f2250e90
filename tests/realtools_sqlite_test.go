package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rtSqliteWriter is the script of the writing sqlite3: WAL mode with
// synchronous=FULL (an fsync per commit), then txns transactions of ten
// rows each, every one also counting itself in meta; a reader in any
// snapshot sees count(t) = 10*meta.n.
func rtSqliteWriter(txns int) string {
	var b strings.Builder
	b.WriteString(".bail on\n.timeout 20000\nPRAGMA journal_mode=WAL;\nPRAGMA synchronous=FULL;\n")
	for i := range txns {
		b.WriteString("BEGIN IMMEDIATE;\n")
		for j := range 10 {
			fmt.Fprintf(&b, "INSERT INTO t(txn, v) VALUES (%d, '%s');\n", i, strings.Repeat(strconv.Itoa(j), 20+(i*7+j)%200))
		}
		b.WriteString("UPDATE meta SET n = n + 1;\n")
		if i%25 == 24 {
			fmt.Fprintf(&b, "DELETE FROM t WHERE txn = %d AND id %% 2 = 0;\nUPDATE meta SET n = n, deleted = deleted + (SELECT changes());\n", i-20)
		}
		b.WriteString("COMMIT;\n")
		if i%100 == 99 {
			b.WriteString("PRAGMA wal_checkpoint(PASSIVE);\n")
		}
	}
	return b.String()
}

// rtSqliteCheck is what a reader asks in one read transaction: whether
// the rows match the counter, and the counter.
const rtSqliteCheck = "BEGIN; SELECT (SELECT count(*) FROM t) + (SELECT deleted FROM meta) = 10 * (SELECT n FROM meta), (SELECT n FROM meta); COMMIT;"

// TestRealSqliteWAL: sqlite3 databases in the mount, one from the
// original (switched to WAL mode, so copied up) and one created there.
// One sqlite3 process writes 300 transactions with synchronous=FULL while
// four reader processes (a new sqlite3 per query, opening the database
// and mapping its -shm each time) and one long-lived reader check that
// every snapshot is consistent and that the counter never goes back. A
// third database keeps a rollback journal (journal_mode=DELETE). The same
// writes go to a plain copy. Afterwards PRAGMA integrity_check is
// ok and the dumps equal the plain copy's, in the mount and, after sbxfs
// commit, in the original.
func TestRealSqliteWAL(t *testing.T) {
	rtNeedCLI(t)
	sqlite := rtNeedTool(t, "sqlite3")
	for _, pt := range []bool{true, false} {
		name := "passthrough"
		var opts []mountOption
		if !pt {
			name = "no-passthrough"
			opts = append(opts, withNoPassthrough())
		}
		t.Run(name, func(t *testing.T) { testRealSqliteWAL(t, sqlite, opts...) })
	}
}

func testRealSqliteWAL(t *testing.T, sqlite string, opts ...mountOption) {
	const txns = 300
	orig := newOrig(t, map[string]string{"db/README": "databases\n"})
	setup := newRtShell(t, "setup", orig, rtBaseEnv())
	schema := "CREATE TABLE meta(n INTEGER, deleted INTEGER); INSERT INTO meta VALUES (0, 0);" +
		" CREATE TABLE t(id INTEGER PRIMARY KEY, txn INTEGER, v TEXT); CREATE INDEX t_txn ON t(txn);"
	setup.run(orig, sqlite, filepath.Join(orig, "db/app.db"), schema+" CREATE TABLE kept(x); INSERT INTO kept VALUES ('from the original');")
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig, opts...)
	script := rtSqliteWriter(txns)
	scriptPath := filepath.Join(t.TempDir(), "writer.sql")
	if err := os.WriteFile(scriptPath, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}

	prepare := func(s *rtShell, root string) {
		s.run(root, sqlite, filepath.Join(root, "db/new.db"), schema)
	}
	// journal.db keeps the rollback journal (journal_mode=DELETE): a
	// journal file made and deleted by every transaction.
	journalScript := strings.Replace(script, "PRAGMA journal_mode=WAL;", "PRAGMA journal_mode=DELETE;", 1)
	journalScript = journalScript[:strings.Index(journalScript, "BEGIN IMMEDIATE;")] +
		strings.Join(strings.SplitAfter(journalScript, "COMMIT;\n")[:txns/3], "")[strings.Index(journalScript, "BEGIN IMMEDIATE;"):]
	journalPath := filepath.Join(t.TempDir(), "journal.sql")
	if err := os.WriteFile(journalPath, []byte(journalScript), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(s *rtShell, root string) {
		for _, db := range []string{"db/app.db", "db/new.db"} {
			s.run(root, "bash", "-c", fmt.Sprintf("%s %q < %q", sqlite, filepath.Join(root, db), scriptPath))
		}
		s.run(root, sqlite, filepath.Join(root, "db/journal.db"), schema)
		s.run(root, "bash", "-c", fmt.Sprintf("%s %q < %q", sqlite, filepath.Join(root, "db/journal.db"), journalPath))
	}
	check := func(s *rtShell, root string) string {
		var b strings.Builder
		for _, db := range []string{"db/app.db", "db/new.db", "db/journal.db"} {
			p := filepath.Join(root, db)
			if out := s.run(root, sqlite, p, "PRAGMA integrity_check;"); out != "ok\n" {
				t.Errorf("[%s] integrity_check of %s: %q", s.side, p, out)
			}
			want := txns
			if db == "db/journal.db" {
				want = txns / 3
			}
			if out := s.run(root, sqlite, p, "SELECT n, deleted, (SELECT count(*) FROM t) FROM meta;"); !strings.HasPrefix(out, strconv.Itoa(want)+"|") {
				t.Errorf("[%s] %s: meta and rows %q, want %d transactions", s.side, p, out, want)
			}
			fmt.Fprintf(&b, "%s: %s", db, s.run(root, sqlite, p, ".dump"))
			for _, x := range []string{"-wal", "-shm", "-journal"} {
				if _, err := os.Lstat(p + x); err == nil {
					t.Errorf("[%s] %s%s is left after the last connection closed", s.side, p, x)
				}
			}
		}
		return b.String()
	}

	plain := newRtShell(t, "plain", ref, rtBaseEnv())
	prepare(plain, ref)
	write(plain, ref)
	want := check(plain, ref)

	mount := newRtShell(t, "mount", sb.mnt, rtBaseEnv())
	prepare(mount, sb.mnt)
	// The readers start before the writer and stop once it is done.
	var (
		wg     sync.WaitGroup
		stop   = make(chan struct{})
		mu     sync.Mutex
		rounds int
	)
	reader := func(id int, db string) {
		defer wg.Done()
		last := -1
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // leave the writer some of the two CPUs
			}
			out, err := mount.try(sb.mnt, nil, sqlite, "-cmd", ".timeout 20000", db, rtSqliteCheck)
			if err != nil {
				t.Errorf("reader %d of %s: %v\n%s", id, db, err, out)
				return
			}
			ok, n, _ := strings.Cut(strings.TrimSpace(out), "|")
			k, err := strconv.Atoi(n)
			if ok != "1" || err != nil {
				t.Errorf("reader %d of %s: inconsistent snapshot: %q", id, db, out)
				return
			}
			if k < last {
				t.Errorf("reader %d of %s: counter went back from %d to %d", id, db, last, k)
				return
			}
			last = k
			mu.Lock()
			rounds++
			mu.Unlock()
		}
	}
	dbs := []string{sb.path("db/app.db"), sb.path("db/new.db")}
	for i := range 4 {
		wg.Add(1)
		go reader(i, dbs[i%2])
	}
	// The long-lived reader: one sqlite3 process asking again and again.
	long := exec.Command(sqlite, "-cmd", ".timeout 20000", dbs[0])
	long.Env = rtBaseEnv()
	long.Dir = sb.mnt
	var longOut syncBuffer
	long.Stdout, long.Stderr = &longOut, &longOut
	stdin, err := long.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	longDone := make(chan struct{})
	go func() {
		defer close(longDone)
		for {
			select {
			case <-stop:
				stdin.Close()
				return
			case <-time.After(10 * time.Millisecond):
			}
			if _, err := fmt.Fprintln(stdin, rtSqliteCheck); err != nil {
				t.Errorf("long-lived reader: %v", err)
				return
			}
		}
	}()

	start := time.Now()
	write(mount, sb.mnt)
	t.Logf("the writer took %v", time.Since(start).Round(time.Millisecond))
	close(stop)
	wg.Wait()
	<-longDone
	if err := long.Wait(); err != nil {
		t.Errorf("long-lived reader: %v\n%s", err, longOut.String())
	}
	lines := strings.Fields(longOut.String())
	last := -1
	for _, l := range lines {
		ok, n, _ := strings.Cut(l, "|")
		k, err := strconv.Atoi(n)
		if ok != "1" || err != nil || k < last {
			t.Errorf("long-lived reader: bad answer %q after %d (of %d answers)", l, last, len(lines))
			break
		}
		last = k
	}
	t.Logf("%d short reads, %d reads of the long-lived reader", rounds, len(lines))

	if got := check(mount, sb.mnt); got != want {
		t.Errorf("the databases in the mount differ from the plain copy's (dump, %d vs %d bytes)", len(got), len(want))
	}
	rtCommit(t, sb, "sqlite")
	after := newRtShell(t, "original", orig, rtBaseEnv())
	if got := check(after, orig); got != want {
		t.Errorf("the original's databases after the commit differ from the plain copy's (dump, %d vs %d bytes)", len(got), len(want))
	}
}
