package manager

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStateMachine(t *testing.T) {
	legal := map[[2]State]bool{
		{Pending, Active}: true, {Pending, Errored}: true, {Pending, CleanedUp}: true,
		{Active, Committed}: true, {Active, RolledBack}: true, {Active, Errored}: true, {Active, CleanedUp}: true,
		{Committed, Active}: true, {Committed, Errored}: true, {Committed, CleanedUp}: true,
		{RolledBack, Active}: true, {RolledBack, Errored}: true, {RolledBack, CleanedUp}: true,
		{Errored, CleanedUp}: true,
	}
	for _, from := range States {
		for _, to := range States {
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				want := legal[[2]State{from, to}]
				assert.Equal(t, want, from.CanMove(to))
				r := &record{ID: "0123456789abcdef", State: from}
				err := r.move(to)
				if want {
					require.NoError(t, err)
					assert.Equal(t, to, r.State)
					return
				}
				require.ErrorIs(t, err, ErrIllegalMove)
				var me *MoveError
				require.ErrorAs(t, err, &me)
				assert.Equal(t, MoveError{ID: r.ID, From: from, To: to}, *me)
				assert.Contains(t, err.Error(), string(from)+" to "+string(to))
				assert.Equal(t, from, r.State, "an illegal move changes nothing")
			})
		}
	}
	assert.False(t, State("bogus").Valid())
	assert.False(t, State("bogus").CanMove(Active))
	for _, s := range States {
		assert.True(t, s.Valid())
	}
}
