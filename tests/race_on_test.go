//go:build race

package tests

// raceEnabled: the tests run with -race, and so does the server they build.
const raceEnabled = true
