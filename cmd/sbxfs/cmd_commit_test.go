package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sbxfs/sbxfs/commit"
)

// TestCommitFailureMessages: a conflict found before anything was
// applied says so; one found while the commit ran (another writer) says
// the commit was undone. Both exit 7 and say how to settle them.
func TestCommitFailureMessages(t *testing.T) {
	before := &commit.Error{Stage: commit.StagePrepare, Conflicts: []commit.Conflict{{Path: "f", Reason: "content changed in the original"}}, Err: commit.ErrConflict}
	during := &commit.Error{Stage: commit.StageApply, Conflicts: []commit.Conflict{{Path: "d/new", Reason: "made in the original during the commit"}}, Err: commit.ErrConflict, RolledBack: true}
	whileRead := &commit.Error{Stage: commit.StagePrepare, Conflicts: []commit.Conflict{{Path: "d/f", Reason: commit.ReasonChangedWhileRead}}, Err: commit.ErrConflict}
	whileApplied := &commit.Error{Stage: commit.StageApply, Conflicts: []commit.Conflict{{Path: "d/f", Reason: commit.ReasonChangedWhileRead}}, Err: commit.ErrConflict, RolledBack: true}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{before, "nothing was applied; keep the sandbox's version"},
		{whileRead, "nothing was applied; the original was changing while the commit read it: commit again once it is still"},
		{during, "the commit was undone; the next one names these as conflicts: keep the sandbox's version"},
		{whileApplied, "the commit was undone; the original was changing while the commit read it: commit again once it is still"},
	} {
		err := commitFailure(tc.err)
		var ee *exitError
		if assert.True(t, errors.As(err, &ee)) {
			assert.Equal(t, exitConflict, ee.code)
		}
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, err.Error(), tc.err.Error())
	}
}
