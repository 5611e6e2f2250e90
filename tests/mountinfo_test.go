package tests

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
)

type mountEntry struct {
	point      string
	fstype     string
	source     string
	options    string // per-mount options
	superOpts  string
	mountID    string
	parentID   string
	majorMinor string
}

// readMountInfo parses /proc/self/mountinfo.
func readMountInfo() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || len(fields) < sep+3 {
			continue
		}
		out = append(out, mountEntry{
			mountID: fields[0], parentID: fields[1], majorMinor: fields[2],
			point: unescapeMount(fields[4]), options: fields[5],
			fstype: fields[sep+1], source: unescapeMount(fields[sep+2]),
			superOpts: strings.Join(fields[sep+3:], " "),
		})
	}
	return out
}

// unescapeMount undoes the octal escapes of mountinfo (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountAt returns the topmost mount at path.
func mountAt(path string) (mountEntry, bool) {
	var found mountEntry
	ok := false
	for _, e := range readMountInfo() {
		if e.point == path {
			found, ok = e, true
		}
	}
	return found, ok
}
