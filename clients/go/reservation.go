package ratelimit

import (
	"context"
	"math"
)

// ReservationOutcome is the answer to Client.Reserve: the outcome, and the reservation when
// admitted.
type ReservationOutcome struct {
	Outcome Outcome
	// Reservation is set exactly when admitted.
	Reservation *Reservation
}

// MultiReservationOutcome is the answer to Client.ReserveAll: the outcome of every limit, and
// the reservation covering them all when admitted.
type MultiReservationOutcome struct {
	Outcome     MultiOutcome
	Reservation *Reservation
}

// Reservation is an estimate consumed from one or several limits, to be settled with the true
// cost. Left unsettled, the estimate stays charged (nothing is sent).
type Reservation struct {
	client   *Client
	limits   []Limit
	estimate int64
	// Where the estimate was consumed: on Redis (NotDegraded), in the Local buckets, or
	// nowhere (FailOpen).
	charged Degraded
}

// Estimate is the units consumed when the reservation was made.
func (r *Reservation) Estimate() int64 { return r.estimate }

// Limits are the limits the reservation covers, in the order of the settlement's decisions.
func (r *Reservation) Limits() []Limit { return append([]Limit(nil), r.limits...) }

// Degraded is NotDegraded when the estimate was consumed on Redis, DegradedLocal in the
// in-process buckets of the Local policy, DegradedFailOpen when nothing was consumed anywhere.
func (r *Reservation) Degraded() Degraded { return r.charged }

// Settle settles with the true cost: actual - estimate is refunded (below 0) or charged (above 0,
// with no admission check: a limit may go into debt, denying until it is paid back) on every
// limit, in one RL.SETTLE ... DELTA actual-estimate call; actual == estimate sends DELTA 0, which
// only reports. The answer is every limit's state afterwards.
//
// A reservation made by the Local policy is settled in its in-process buckets alike (even once
// Redis is back); one admitted by FailOpen sends nothing and answers as FailOpen. When Redis
// cannot answer the settlement is lost (the estimate stands) and the decisions are the failure
// policy's for a cost of 0.
func (r *Reservation) Settle(ctx context.Context, actual int64) (Settlement, error) {
	if actual < 0 || (r.estimate < 0 && actual > math.MaxInt64+r.estimate) {
		return Settlement{}, unsupported("an actual cost between 0 and 2^63-1 units")
	}
	return r.client.settleCharged(ctx, r.limits, actual-r.estimate, r.charged)
}
