//go:build race

package main

// raceEnabled: the tests run with -race, and so does the sbxfs binary they
// build (its daemon and servers report races in their logs).
const raceEnabled = true
